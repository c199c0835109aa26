"""Benchmark cases: what is timed, on which shape, and how its peak memory is measured.

A :class:`Spec` names one case (implementation, mode, shape, dtype, device); :func:`build` turns it into
a :class:`Case` with an untimed ``prepare()`` (per round) and a timed ``run(state)``:

* ``forward``  - the forward pass with autograd recording (as in training); outputs are dropped.
* ``backward`` - ``prepare`` runs the forward, ``run`` only the backward of
  ``sum(logprobs) + sum(entropy)`` (timing starts after :meth:`Case.setup` waited for the device, so no
  part of the forward is still in flight on CUDA).
* ``full``     - forward + backward.

Every log-prob implementation starts from the same leaves (``hidden [N, H]``, lm_head ``weight [V, H]``,
``token_ids [N]``) and ends with gradients for hidden and weight, so their times and memory compare
the same job:

* ``naive``        - ``logits = hidden @ weight.T``; ``log_softmax`` (float32) + gather (+ entropy);
* ``trl``          - the same logits, then TRL 1.16's one-pass ``selective_log_softmax_and_entropy``
  (``selective_log_softmax`` without the entropy); on CUDA both are TRL's Triton kernel, on CPU its
  fallback (``selective_log_softmax`` + ``entropy_from_logits``);
* ``rlzoo_logits`` - the same logits, then ``rlzoo.kernels.logprobs_and_entropy_from_logits``;
* ``fused_torch`` / ``fused_triton`` - ``rlzoo.kernels.fused_linear_logprobs`` with that backend;
* ``liger_grpo`` / ``rlzoo_grpo`` - Liger's fused linear GRPO loss vs. rlzoo fused log-probs + ``grpo`` loss
  (same seeded advantages);
* ``gemm_fwd`` / ``gemm_bwd`` - the bare lm_head GEMMs (``h W^T``; ``g W`` and ``g^T h``): the ceiling;
* ``copy``         - a device-to-device copy of the ``[N, V]`` logits (bandwidth ceiling);
* ``triton_fold``  - the Triton forward kernel over one ``[N, V]`` logits tensor (bandwidth vs ``copy``);
* ``loss_eager`` / ``loss_compiled`` - a PolicyLoss preset on ``[B, T]`` log-probs, eager vs torch.compile.

The naive case is skipped (with the reason) where its forward alone cannot fit the device
(:func:`naive_peak_bytes`: ~90 GB at N = 32768, V = 151936, bf16); the bare GEMMs stay the reference there.

Peak memory (``peak_extra_bytes``): CUDA - ``torch.cuda.max_memory_allocated()`` during ``run`` minus
``memory_allocated()`` before it. CPU - torch's CPU allocator is invisible to tracemalloc, so the case
runs once in a fresh Python process (``python benchmarks/cases.py --memory SPEC``): after ``prepare``
the kernel's resident-set high-water mark is reset (``echo 5 > /proc/self/clear_refs``), and the
figure is ``VmHWM`` after ``run`` minus ``VmRSS`` before it (Linux only; on other systems the peak
``ru_maxrss`` delta, which can under-read).

Run as a script, this module prints one measurement as JSON (used by the benchmarks, not by users).
"""

import dataclasses
import gc
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

LOGPROB_IMPLS = ("naive", "trl", "rlzoo_logits", "fused_torch", "fused_triton")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One benchmark case (JSON-able; the pytest id and the subprocess argument)."""

    impl: str
    mode: str = "full"
    n: int = 0
    h: int = 0
    v: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    entropy: bool = True
    chunk_size: int | None = None
    preset: str | None = None
    batch: int = 0
    length: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        return cls(**json.loads(text))


@dataclasses.dataclass
class Case:
    """``prepare()`` (untimed) returns the state ``run(state)`` (timed) consumes; ``sync`` waits for the device."""

    prepare: Callable[[], Any]
    run: Callable[[Any], Any]
    device: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def setup(self) -> Any:
        """``prepare()`` then wait for the device: the timed ``run`` starts with none of the preparation (e.g. the
        forward of a ``backward`` case) still running asynchronously on CUDA."""
        state = self.prepare()
        self.sync()
        return state

    def timed(self, state: Any) -> None:
        self.run(state)
        self.sync()


class Unavailable(Exception):
    """The case cannot run here (missing package or device); the benchmark is skipped with this reason."""


def _leaves(spec: Spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(spec.n, spec.h, generator=g)
    weight = torch.randn(spec.v, spec.h, generator=g) * (1.0 / math.sqrt(spec.h))
    ids = torch.randint(0, spec.v, (spec.n,), generator=g)
    dev, dt = spec.device, spec.torch_dtype
    return (hidden.to(dev, dt).requires_grad_(), weight.to(dev, dt).requires_grad_(), ids.to(dev))


def _logprob_fn(spec: Spec) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    impl, ent = spec.impl, spec.entropy
    if impl == "naive":
        from rlzoo.kernels.reference import naive_logprobs

        return lambda h, w, ids: naive_logprobs(h @ w.T, ids, return_entropy=ent)
    if impl == "trl":
        try:
            from trl.trainer import utils as trl_utils
        except ImportError as err:
            raise Unavailable(f"trl is not installed ({err})") from None
        if ent:  # TRL 1.16's one pass over the logits (its Triton kernel on CUDA)
            return lambda h, w, ids: tuple(trl_utils.selective_log_softmax_and_entropy(h @ w.T, ids))
        return lambda h, w, ids: (trl_utils.selective_log_softmax(h @ w.T, ids), None)
    if impl == "rlzoo_logits":
        from rlzoo.kernels import logprobs_and_entropy_from_logits, logprobs_from_logits

        if ent:
            return lambda h, w, ids: tuple(logprobs_and_entropy_from_logits(h @ w.T, ids))
        return lambda h, w, ids: (logprobs_from_logits(h @ w.T, ids), None)
    if impl in ("fused_torch", "fused_triton"):
        from rlzoo.kernels import fused_linear_logprobs

        backend = impl.removeprefix("fused_")
        if backend == "triton":
            if spec.device != "cuda":
                raise Unavailable("the Triton backend is benchmarked on CUDA only")
            from rlzoo.kernels._common import triton_importable

            if not triton_importable():
                raise Unavailable("triton is not installed")
        return lambda h, w, ids: tuple(fused_linear_logprobs(h, w, ids, return_entropy=ent, backend=backend,
                                                             chunk_size=spec.chunk_size))
    raise ValueError(f"unknown log-prob impl {impl!r}")


def _loss_of(out: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    lp, ent = out
    loss = lp.float().sum()
    return loss if ent is None else loss + ent.float().sum()


def _modes(device: str, forward: Callable[[], Any], loss: Callable[[Any], torch.Tensor],
           clear: Callable[[], None], mode: str) -> Case:
    if mode == "forward":
        return Case(prepare=clear, run=lambda _: forward(), device=device)
    if mode == "backward":
        def prepare():
            clear()
            return loss(forward())
        return Case(prepare=prepare, run=lambda l: l.backward(), device=device)
    if mode == "full":
        return Case(prepare=clear, run=lambda _: loss(forward()).backward(), device=device)
    raise ValueError(f"unknown mode {mode!r}")


def naive_peak_bytes(spec: Spec) -> int:
    """A lower bound of the naive case's peak memory: its forward holds the ``[N, V]`` logits in the input dtype,
    their float32 copy (none for float32 input), the float32 log-softmax and, with the entropy, the probabilities
    and their product with the log-probs - 18 bytes per logit for bf16 with entropy, ~90 GB at N = 32768,
    V = 151936. (The backward needs more.)"""
    size = spec.torch_dtype.itemsize
    per_logit = size + (4 if size != 4 else 0) + 4 + (8 if spec.entropy else 0)
    return spec.n * spec.v * per_logit


def check_naive_fits(spec: Spec, device_bytes: int) -> None:
    """Raise :class:`Unavailable` with the sizes when the naive case cannot fit ``device_bytes``."""
    need = naive_peak_bytes(spec)
    if need > device_bytes:
        raise Unavailable(
            f"the naive case needs more than {need / 1e9:.0f} GB at N={spec.n}, V={spec.v} ({spec.dtype}; "
            f"[N, V] logits, float32 copy, log-softmax{', probabilities and p*log p' if spec.entropy else ''}) and "
            f"the device has {device_bytes / 1e9:.0f} GB; the bare lm_head GEMMs (gemm_fwd, gemm_bwd) are the "
            "reference at this shape"
        )


def _logprob_case(spec: Spec) -> Case:
    if spec.impl == "naive" and spec.device == "cuda":
        check_naive_fits(spec, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    fn = _logprob_fn(spec)
    hidden, weight, ids = _leaves(spec)

    def clear():
        hidden.grad = None
        weight.grad = None

    return _modes(spec.device, lambda: fn(hidden, weight, ids), _loss_of, clear, spec.mode)


def grpo_inputs(spec: Spec) -> tuple[torch.Tensor, ...]:
    """``(hidden, weight, ids, advantages, mask)`` of a GRPO case, all seeded (the same for Liger and rlzoo and
    from run to run, whatever the global RNG state)."""
    hidden, weight, ids = _leaves(spec)
    b, t = spec.batch, spec.length
    adv = torch.randn(b, generator=torch.Generator().manual_seed(1)).to(spec.device)
    mask = torch.ones(b, t, dtype=torch.bool, device=spec.device)
    return hidden, weight, ids, adv, mask


def _grpo_case(spec: Spec) -> Case:
    """Liger's fused linear GRPO loss vs. rlzoo fused log-probs + the grpo preset (beta = 0, no entropy)."""
    if spec.device != "cuda":
        raise Unavailable("the Liger comparison runs on CUDA only")
    hidden, weight, ids, adv, mask = grpo_inputs(spec)
    b, t = spec.batch, spec.length
    if spec.impl == "liger_grpo":
        try:
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        except ImportError as err:
            raise Unavailable(f"liger-kernel is not installed ({err})") from None
        liger = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, loss_type="grpo")

        def forward():
            out = liger(hidden.view(b, t, -1), weight, ids.view(b, t), mask, adv)
            return out[0] if isinstance(out, tuple) else out
    else:
        import rlzoo
        from rlzoo.kernels import fused_linear_logprobs

        loss_fn = rlzoo.get_loss("grpo", beta=0.0)

        def forward():
            lp = fused_linear_logprobs(hidden, weight, ids, return_entropy=False).logprobs.view(b, t)
            batch = rlzoo.PolicyBatch(logprobs=lp, advantages=adv, completion_mask=mask, check_values=False)
            return loss_fn(batch).loss

    def clear():
        hidden.grad = None
        weight.grad = None

    return _modes(spec.device, forward, lambda loss: loss, clear, spec.mode)


def _ceiling_case(spec: Spec) -> Case:
    dev, dt = spec.device, spec.torch_dtype
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(spec.n, spec.h, generator=g).to(dev, dt)
    weight = torch.randn(spec.v, spec.h, generator=g).to(dev, dt)
    if spec.impl == "gemm_fwd":
        out = torch.empty(spec.n, spec.v, device=dev, dtype=dt)
        return Case(prepare=lambda: None, run=lambda _: torch.mm(hidden, weight.T, out=out), device=dev,
                    info={"flop": 2 * spec.n * spec.h * spec.v})
    if spec.impl == "gemm_bwd":
        grad = torch.randn(spec.n, spec.v, device=dev, dtype=dt)
        gh = torch.empty_like(hidden)
        gw = torch.empty_like(weight)

        def run(_):
            torch.mm(grad, weight, out=gh)
            torch.mm(grad.T, hidden, out=gw)

        return Case(prepare=lambda: None, run=run, device=dev, info={"flop": 4 * spec.n * spec.h * spec.v})
    src = torch.randn(spec.n, spec.v, device=dev, dtype=dt)
    if spec.impl == "copy":
        dst = torch.empty_like(src)
        return Case(prepare=lambda: None, run=lambda _: dst.copy_(src), device=dev,
                    info={"bytes_moved": 2 * src.numel() * src.element_size()})
    if spec.impl == "triton_fold":
        if dev != "cuda":
            raise Unavailable("the Triton kernels are benchmarked on CUDA only")
        from rlzoo.kernels import _tiles, _triton
        from rlzoo.kernels._common import triton_importable

        if not triton_importable():
            raise Unavailable("triton is not installed")
        ids = torch.randint(0, spec.v, (spec.n,), device=dev)

        def fold(_):
            state = _tiles.init_state(spec.n, torch.float32, torch.device(dev))
            _triton.fold(src, spec.n, 0, spec.v, spec.n, spec.v, 0, ids, state, scale=1.0, softcap=None,
                         temperature=1.0, with_entropy=True)

        return Case(prepare=lambda: None, run=fold, device=dev,
                    info={"bytes_moved": src.numel() * src.element_size()})
    raise ValueError(f"unknown ceiling impl {spec.impl!r}")


def _policy_loss_case(spec: Spec) -> Case:
    import rlzoo

    dev = spec.device
    g = torch.Generator().manual_seed(0)
    b, t = spec.batch, spec.length
    lp = (-torch.rand(b, t, generator=g)).to(dev).requires_grad_()
    old = (lp.detach() + 0.05 * torch.randn(b, t, generator=g).to(dev)).clamp(max=0)
    ref = (lp.detach() + 0.05 * torch.randn(b, t, generator=g).to(dev)).clamp(max=0)
    adv = torch.randn(b, generator=g).to(dev)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(dev)
    loss_fn = rlzoo.get_loss(spec.preset)
    batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=old, ref_logprobs=ref, advantages=adv,
                              completion_mask=mask, check_values=False)

    def loss_of(bt):
        return loss_fn(bt).loss

    fn = torch.compile(loss_of, fullgraph=True) if spec.impl == "loss_compiled" else loss_of

    def clear():
        lp.grad = None

    return _modes(dev, lambda: fn(batch), lambda loss: loss, clear, spec.mode)


def build(spec: Spec) -> Case:
    """The :class:`Case` for ``spec``; raises :class:`Unavailable` when it cannot run here."""
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("needs a CUDA device")
    if spec.impl in LOGPROB_IMPLS:
        return _logprob_case(spec)
    if spec.impl in ("liger_grpo", "rlzoo_grpo"):
        return _grpo_case(spec)
    if spec.impl in ("gemm_fwd", "gemm_bwd", "copy", "triton_fold"):
        return _ceiling_case(spec)
    if spec.impl in ("loss_eager", "loss_compiled"):
        return _policy_loss_case(spec)
    raise ValueError(f"unknown impl {spec.impl!r}")


# ------------------------------------------------------------------------------------------------ memory
def _proc_status() -> dict[str, int] | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    out = {}
    for key in ("VmRSS", "VmHWM"):
        match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
        if match is None:
            return None
        out[key] = int(match.group(1)) * 1024
    return out


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure_here(spec: Spec) -> dict[str, Any]:
    """Run ``spec`` once in this process and return its peak extra memory (see the module docstring)."""
    case = build(spec)
    if spec.device == "cuda":
        case.timed(case.setup())  # warm-up: kernels, cuBLAS workspaces, compile
        state = case.setup()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        case.timed(state)
        return {"peak_extra_bytes": torch.cuda.max_memory_allocated() - base, "seconds": time.perf_counter() - start,
                "memory_method": "cuda max_memory_allocated - memory_allocated"}
    if spec.impl == "loss_compiled":
        case.timed(case.setup())  # compile first
    state = case.setup()
    gc.collect()
    before = _proc_status()
    if before is not None and _reset_hwm():
        before = _proc_status()
        start = time.perf_counter()
        case.timed(state)
        seconds = time.perf_counter() - start
        after = _proc_status()
        return {"peak_extra_bytes": after["VmHWM"] - before["VmRSS"], "seconds": seconds,
                "memory_method": "cpu VmHWM - VmRSS (fresh process, HWM reset)"}
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    case.timed(state)
    seconds = time.perf_counter() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - kib
    return {"peak_extra_bytes": grown * 1024, "seconds": seconds, "memory_method": "cpu ru_maxrss delta (lower bound)"}


def measure_memory(spec: Spec) -> dict[str, Any]:
    """Peak extra memory of one ``run``: in this process on CUDA, in a fresh Python process on CPU."""
    if spec.device == "cuda":
        return measure_here(spec)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory", spec.to_json()],
                          capture_output=True, text=True, env=env, timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"memory measurement failed for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--memory":
        raise SystemExit("usage: python benchmarks/cases.py --memory SPEC_JSON")
    torch.set_num_threads(int(os.environ.get("RLZOO_BENCH_THREADS", torch.get_num_threads())))
    print(json.dumps(measure_here(Spec.from_json(sys.argv[2]))))
