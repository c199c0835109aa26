"""The one tolerance table of the test suite (absolute, relative) per dtype.

float64 math tests compare closed-form identities; float32/bf16 rows are for kernels against a
float64 (or float32) torch reference. Never loosen a row to make a test pass: find the bug.
"""

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (5e-3, 5e-3),
}

# Reference tests against TRL / verl (issue: "within 1e-6, float64").
REFERENCE_ATOL = 1e-6


# Norm-wise relative error ||actual - expected|| / ||expected|| of a gradient in that dtype: a single rounding
# to the dtype gives about 0.25 eps; the elementwise row above alone would pass gradients far smaller than
# its atol whatever their values.
GRAD_NORM_RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.bfloat16: torch.finfo(torch.bfloat16).eps,
    torch.float16: torch.finfo(torch.float16).eps,
}


def assert_grad_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """A gradient in ``actual.dtype`` against a reference: the dtype's elementwise row and its norm-wise bound.

    A reference that is zero by identity (a vocabulary of one token: the log-prob is 0 whatever the logits) has no
    scale for a relative bound; a kernel computes it as a few roundings of the O(1) logits it is made of (CUDA
    contracts ``z * s - m`` into one fused multiply-add, so ``z - m`` is not exactly 0: ~1e-8 in float32), and only
    the elementwise row applies.
    """
    torch.testing.assert_close(actual.to(expected.dtype), expected, **tol(actual.dtype))
    scale = float(expected.double().norm())
    if scale == 0.0:
        return
    err = float((actual.double() - expected.double()).norm())
    assert err <= GRAD_NORM_RTOL[actual.dtype] * scale, (
        f"relative gradient error {err / scale:.3g} > {GRAD_NORM_RTOL[actual.dtype]:.3g} ({actual.dtype})"
    )


def tol(dtype: torch.dtype) -> dict[str, float]:
    """``dict(atol=..., rtol=...)`` for ``torch.testing.assert_close``."""
    atol, rtol = TOLERANCES[dtype]
    return {"atol": atol, "rtol": rtol}
