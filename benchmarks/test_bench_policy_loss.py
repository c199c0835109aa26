"""PolicyLoss eager vs ``torch.compile`` (forward + backward on [B, T] log-probs; the loss is elementwise).

The first (warm-up) round compiles; only the later rounds are timed.
"""

import pytest
from cases import Spec
from test_bench_logprobs import run_case

SPECS = [
    Spec(impl=impl, mode="full", preset=preset, batch=b, length=t, device=device)
    for device, b, t in (("cpu", 64, 1024), ("cuda", 256, 4096))
    for preset in ("grpo", "dapo")
    for impl in ("loss_eager", "loss_compiled")
]


@pytest.mark.parametrize(
    "spec",
    [pytest.param(s, id=f"{s.impl}-{s.preset}-B{s.batch}-T{s.length}-{s.device}",
                  marks=[pytest.mark.cuda] if s.device == "cuda" else []) for s in SPECS],
)
def test_policy_loss(benchmark, spec):
    run_case(benchmark, spec)
