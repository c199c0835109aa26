"""Log-prob benchmarks: hidden states + lm_head weight -> per-token log-probs (+ entropy), forward/backward/full.

Cases and the memory method are described in ``cases.py``; results render into docs/benchmarks.md with
``python benchmarks/render.py``. Ratios are only quoted between cases of the same run (side by side).
"""

import os
import time

import pytest
import torch
from cases import LOGPROB_IMPLS, Spec, Unavailable, build, measure_memory

MODES = ("forward", "backward", "full")

# CPU: SmolLM2-135M head (H=576, V=49152), float32.
CPU = {"h": 576, "v": 49152, "dtype": "float32", "device": "cpu"}
# CUDA: Llama-3 8B (V=128256) and Qwen2.5 7B (V=151936) heads, bf16.
CUDA_SHAPES = [(n, v) for n in (8192, 32768) for v in (128256, 151936)]


def _param(spec: Spec):
    parts = [spec.impl, spec.mode, f"N{spec.n or spec.batch}", f"V{spec.v or spec.length}", spec.dtype, spec.device]
    if spec.impl not in ("gemm_fwd", "gemm_bwd", "copy", "triton_fold"):
        parts.append("ent" if spec.entropy else "noent")
    if spec.chunk_size:
        parts.append(f"c{spec.chunk_size}")
    marks = [pytest.mark.cuda] if spec.device == "cuda" else []
    return pytest.param(spec, id="-".join(parts), marks=marks)


def _specs() -> list:
    out = []
    # CPU, N = 4096: every implementation and mode, with entropy
    for mode in MODES:
        for impl in LOGPROB_IMPLS:
            if impl != "fused_triton":  # the Triton kernels are benchmarked on CUDA only
                out.append(Spec(impl=impl, mode=mode, n=4096, **CPU))
    # logprobs only, and N = 2048
    for impl in ("naive", "fused_torch"):
        out.append(Spec(impl=impl, mode="full", n=4096, entropy=False, **CPU))
    for impl in ("naive", "fused_torch"):
        out.append(Spec(impl=impl, mode="full", n=2048, **CPU))
    # chunk-size sweep of the torch path (the default at N = 4096 is 4096 columns)
    for chunk in (1024, 2048, 8192):
        out.append(Spec(impl="fused_torch", mode="full", n=4096, chunk_size=chunk, **CPU))
    # ceiling: the bare lm_head GEMMs and a copy of the logits
    for impl in ("gemm_fwd", "gemm_bwd", "copy"):
        out.append(Spec(impl=impl, mode="full", n=4096, **CPU))
    # CUDA, bf16
    for n, v in CUDA_SHAPES:
        shape = {"n": n, "h": 4096, "v": v, "dtype": "bfloat16", "device": "cuda"}
        for mode in MODES:
            for impl in LOGPROB_IMPLS:
                out.append(Spec(impl=impl, mode=mode, **shape))
        for impl in ("liger_grpo", "rlzoo_grpo"):
            out.append(Spec(impl=impl, mode="full", entropy=False, batch=n // 1024, length=1024, **shape))
        for impl in ("gemm_fwd", "gemm_bwd", "copy", "triton_fold"):
            out.append(Spec(impl=impl, mode="full", **shape))
    return [_param(s) for s in out]


def run_case(benchmark, spec: Spec) -> None:
    """Build ``spec``'s case (skipped with the reason when it cannot run here) and :func:`time_case` it."""
    try:
        case = build(spec)
    except Unavailable as err:
        pytest.skip(str(err))
    time_case(benchmark, spec, case)


def time_case(benchmark, spec: Spec, case) -> None:
    """Time ``case`` with pytest-benchmark and record the spec, the case's static info, the peak extra memory
    and per-round CPU and wall times in ``benchmark.extra_info``.

    Pedantic mode with an untimed ``case.setup()`` before every round (``prepare`` then a device
    synchronisation, so that a round's timer never counts work the preparation left in flight). CUDA and compiled cases get one untimed
    warm-up run first. Rounds: ``RLZOO_BENCH_ROUNDS`` (default 3 on CPU, 10 on CUDA) for cases slower than
    0.5 s (judged from the memory run, else from one calibration run); faster cases get more (up to ~2 s
    of timed work, at most 200 rounds). pytest-benchmark's own
    statistics are wall-clock; ``cpu_time_rounds`` holds the process CPU time of each round (all threads),
    which is what the CPU ratios in docs/benchmarks.md use (the wall clock of a shared machine is noisy).
    """
    if spec.impl.startswith("loss_"):
        benchmark.group = f"{spec.device} PolicyLoss B={spec.batch} T={spec.length}"
    else:
        benchmark.group = f"{spec.device} {spec.dtype} N={spec.n} H={spec.h} V={spec.v}"
    benchmark.extra_info.update(dict(spec.__dict__))
    benchmark.extra_info.update(case.info)
    benchmark.extra_info["torch_threads"] = torch.get_num_threads()
    min_rounds = int(os.environ.get("RLZOO_BENCH_ROUNDS", "10" if spec.device == "cuda" else "3"))
    cpu_times: list[float] = []
    wall_times: list[float] = []

    def timed(state) -> None:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        case.timed(state)
        cpu_times.append(time.process_time() - cpu0)
        wall_times.append(time.perf_counter() - wall0)

    try:
        estimate = None
        if os.environ.get("RLZOO_BENCH_MEMORY", "1") != "0":
            mem = measure_memory(spec)
            benchmark.extra_info["peak_extra_mib"] = mem["peak_extra_bytes"] / 2**20
            benchmark.extra_info["memory_method"] = mem["memory_method"]
            estimate = mem["seconds"]
        if spec.device == "cuda" or spec.impl == "loss_compiled":
            case.timed(case.setup())  # warm-up: compile, autotune, cuBLAS workspaces
        if estimate is None or estimate < 0.5:
            timed(case.setup())  # calibration round (not reported)
            estimate = wall_times[-1]
            cpu_times.clear()
            wall_times.clear()
        rounds = min_rounds if estimate > 0.5 else max(min_rounds, min(200, int(2.0 / max(estimate, 1e-6))))
        benchmark.pedantic(timed, setup=lambda: ((case.setup(),), {}), rounds=rounds, iterations=1)
    except torch.OutOfMemoryError as err:
        pytest.skip(f"out of memory: {str(err)[:200]}")
    benchmark.extra_info["cpu_time_rounds"] = cpu_times
    benchmark.extra_info["wall_time_rounds"] = wall_times


@pytest.mark.parametrize("spec", _specs())
def test_logprobs(benchmark, spec):
    run_case(benchmark, spec)
