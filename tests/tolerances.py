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


def tol(dtype: torch.dtype) -> dict[str, float]:
    """``dict(atol=..., rtol=...)`` for ``torch.testing.assert_close``."""
    atol, rtol = TOLERANCES[dtype]
    return {"atol": atol, "rtol": rtol}
