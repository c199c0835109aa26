"""The benchmark harness (benchmarks/cases.py, test_bench_logprobs.py) measures what it says, checked on CPU:
the timer of a round starts after the preparation finished on the device, the TRL baseline is TRL 1.16's
one-pass function, the GRPO comparison's advantages are seeded, and the naive case is skipped (with the
reason) where it cannot fit the device."""

import sys
from pathlib import Path

import pytest
import torch
from tolerances import tol

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import cases
from test_bench_logprobs import time_case


class _FakeBenchmark:
    """pytest-benchmark's fixture as run_case uses it: ``pedantic`` calls ``setup`` then the target per round."""

    def __init__(self):
        self.extra_info = {}
        self.group = None

    def pedantic(self, target, setup, rounds, iterations):
        for _ in range(rounds):
            args, kwargs = setup()
            target(*args, **kwargs)


def test_a_round_starts_after_the_preparation_finished_on_the_device(monkeypatch):
    """CUDA runs asynchronously: a backward-mode round's timer must start after a synchronisation that follows
    the untimed forward, or the round counts the forward's tail. The events of every round are prepare, sync,
    run, sync (torch.cuda.synchronize recorded instead of called: no GPU needed)."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    monkeypatch.setenv("RLZOO_BENCH_MEMORY", "0")
    monkeypatch.setenv("RLZOO_BENCH_ROUNDS", "3")
    case = cases.Case(prepare=lambda: events.append("prepare"), run=lambda _: events.append("run"), device="cuda")
    spec = cases.Spec(impl="naive", mode="backward", n=4, h=2, v=3, device="cuda")
    time_case(_FakeBenchmark(), spec, case)
    runs = [i for i, e in enumerate(events) if e == "run"]
    assert len(runs) >= 3
    for i in runs:
        assert events[i - 2 : i] == ["prepare", "sync"], events
        assert events[i + 1] == "sync", events


def test_trl_baseline_is_the_one_pass_function(monkeypatch):
    """With the entropy, the trl case calls TRL 1.16's selective_log_softmax_and_entropy (one pass over the
    logits; its Triton kernel on CUDA), and its values are the naive ones."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    calls = []
    original = trl_utils.selective_log_softmax_and_entropy

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(trl_utils, "selective_log_softmax_and_entropy", spy)
    spec = cases.Spec(impl="trl", mode="forward", n=5, h=3, v=11)
    hidden, weight, ids = cases._leaves(spec)
    lp, ent = cases._logprob_fn(spec)(hidden, weight, ids)
    assert calls == [(5, 11)]
    ref_lp, ref_ent = cases._logprob_fn(cases.Spec(impl="naive", n=5, h=3, v=11))(hidden, weight, ids)
    torch.testing.assert_close(lp, ref_lp, **tol(torch.float32))
    torch.testing.assert_close(ent, ref_ent, **tol(torch.float32))


def test_grpo_advantages_are_seeded():
    """The Liger-vs-rlzoo GRPO inputs do not depend on the global RNG (they did: torch.randn without a generator)."""
    spec = cases.Spec(impl="liger_grpo", n=8, h=4, v=16, batch=2, length=4, entropy=False)
    torch.manual_seed(0)
    first = cases.grpo_inputs(spec)
    torch.manual_seed(123)
    torch.randn(7)
    second = cases.grpo_inputs(spec)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert first[3].shape == (2,) and first[4].shape == (2, 4)


def test_naive_is_skipped_where_it_cannot_fit():
    """At the CUDA target (N = 32768, V = 151936, bf16, with entropy) the naive forward alone holds ~90 GB
    (18 bytes per logit): more than an 80 GB H100, so the case is skipped with the sizes in the reason; it
    fits an H200 (141 GB) and the CPU shapes."""
    target = cases.Spec(impl="naive", mode="full", n=32768, h=4096, v=151936, dtype="bfloat16", device="cuda")
    assert cases.naive_peak_bytes(target) == 32768 * 151936 * 18
    with pytest.raises(cases.Unavailable, match=r"needs more than 90 GB .*\(gemm_fwd, gemm_bwd\)"):
        cases.check_naive_fits(target, 80 * 10**9)
    cases.check_naive_fits(target, 141 * 10**9)
    cpu = cases.Spec(impl="naive", mode="full", n=4096, h=576, v=49152)
    assert cases.naive_peak_bytes(cpu) == 4096 * 49152 * 16  # float32: no copy
    no_entropy = cases.Spec(impl="naive", n=32768, v=151936, dtype="bfloat16", entropy=False)
    assert cases.naive_peak_bytes(no_entropy) == 32768 * 151936 * 10


def test_naive_peak_bytes_is_a_lower_bound_on_cpu():
    """The estimate is a lower bound of what the naive forward allocates (measured on a small CPU case with the
    same fresh-process method as the benchmarks: resident-set high-water mark)."""
    spec = cases.Spec(impl="naive", mode="forward", n=512, h=8, v=8192)
    measured = cases.measure_memory(spec)["peak_extra_bytes"]
    assert measured >= 0.9 * cases.naive_peak_bytes(spec), (measured, cases.naive_peak_bytes(spec))
