"""Render pytest-benchmark JSON (benchmarks/results/*.json) into docs/benchmarks.md and a PNG plot.

Usage::

    python benchmarks/render.py benchmarks/results/*.json            # writes docs/benchmarks.md + docs/benchmarks.png

Time ratios use each case's *minimum* round (the least disturbed by other load on the machine) and are
taken only between cases of the same results file (measured side by side in one run).
"""

import argparse
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlzoo.trainer.io import atomic_write_bytes

ROOT = Path(__file__).resolve().parents[1]
IMPL_ORDER = ["naive", "trl", "rlzoo_logits", "fused_torch", "fused_triton", "liger_grpo", "rlzoo_grpo"]
IMPL_LABEL = {
    "naive": "naive (logits + log_softmax + gather)",
    "trl": "TRL selective_log_softmax_and_entropy",
    "rlzoo_logits": "rlzoo logprobs_and_entropy_from_logits",
    "fused_torch": "rlzoo fused_linear_logprobs (torch)",
    "fused_triton": "rlzoo fused_linear_logprobs (Triton)",
    "liger_grpo": "Liger fused linear GRPO loss",
    "rlzoo_grpo": "rlzoo fused log-probs + grpo loss",
}
CPU_TARGET_N = 4096
CUDA_TARGET = {"n": 32768, "h": 4096, "v": 151936, "dtype": "bfloat16"}
NOT_MEASURED = "to be measured (no GPU in this session)"
NAIVE_SKIP = ("The naive case is skipped, with the reason, where its forward alone cannot fit the device "
              "(`cases.naive_peak_bytes`: 18 bytes per logit for bf16 with entropy, about 90 GB at N = 32768, "
              "V = 151936, more than an 80 GB H100); the bare lm_head GEMMs are the reference there.")


class Run:
    """One results file: its machine info and its cases keyed by their spec."""

    def __init__(self, path: Path):
        data = json.loads(path.read_text())
        self.path = path
        self.machine = data.get("machine_info", {})
        self.commit = data.get("commit_info", {})
        self.datetime = data.get("datetime", "")
        self.cases: list[dict[str, Any]] = []
        for bench in data.get("benchmarks", []):
            info = dict(bench.get("extra_info", {}))
            stats = bench["stats"]
            info.update(min=stats["min"], median=stats["median"], rounds=stats["rounds"], name=bench["name"])
            cpu = info.get("cpu_time_rounds") or []
            # the time the ratios use: process CPU time on CPU (robust on a shared machine), wall clock on CUDA
            info["t"] = min(cpu) if cpu and info.get("device") == "cpu" else stats["min"]
            self.cases.append(info)

    def find(self, **spec: Any) -> dict[str, Any] | None:
        for case in self.cases:
            if all(case.get(k) == v for k, v in spec.items()):
                return case
        return None

    @property
    def device(self) -> str:
        return "cuda" if any(c.get("device") == "cuda" for c in self.cases) else "cpu"


def _fmt_t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _mem(case: dict | None) -> float | None:
    return None if case is None else case.get("peak_extra_mib")


def _status(ok: bool | None, missing: str = NOT_MEASURED) -> str:
    return {True: "**met**", False: "**not met**", None: missing}[ok]


def _default_chunk(case: dict) -> bool:
    return case.get("chunk_size") is None


def logprob_tables(run: Run) -> list[str]:
    lines: list[str] = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for case in run.cases:
        if case.get("impl") in IMPL_ORDER and _default_chunk(case):
            key = (case["device"], case["dtype"], case["n"], case["h"], case["v"], case["entropy"], case["mode"])
            groups[key].append(case)
    for key in sorted(groups, key=lambda k: (k[0], k[2], k[4], not k[5], ["forward", "backward", "full"].index(k[6]))):
        device, dtype, n, h, v, entropy, mode = key
        cases = sorted(groups[key], key=lambda c: IMPL_ORDER.index(c["impl"]))
        base = next((c for c in cases if c["impl"] == "naive"), None)
        what = "log-probs + entropy" if entropy else "log-probs only"
        timed = "min CPU time" if device == "cpu" else "min time"
        lines += [f"#### {device} {dtype}, N={n}, H={h}, V={v}: {what}, {mode}", "",
                  f"| implementation | {timed} | min wall time | rounds | time vs naive | peak extra memory | memory vs naive |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for c in cases:
            t_ratio = c["t"] / base["t"] if base else None
            m_ratio = (_mem(c) / _mem(base)) if base and _mem(c) is not None and _mem(base) else None
            mem = "-" if _mem(c) is None else f"{_mem(c):,.0f} MiB"
            lines.append(f"| {IMPL_LABEL[c['impl']]} | {_fmt_t(c['t'])} | {_fmt_t(c['min'])} | {c['rounds']} | "
                         f"{_fmt_ratio(t_ratio)} | {mem} | {_fmt_ratio(m_ratio)} |")
        lines.append("")
    return lines


def chunk_table(run: Run) -> list[str]:
    sweep = [c for c in run.cases if c.get("impl") == "fused_torch" and c.get("mode") == "full" and c.get("entropy")
             and c.get("n") == CPU_TARGET_N and c.get("device") == "cpu"]
    base = run.find(impl="naive", mode="full", entropy=True, n=CPU_TARGET_N, device="cpu")
    if not sweep or base is None:
        return []
    from rlzoo.kernels import default_chunk_size

    default = default_chunk_size(CPU_TARGET_N, sweep[0]["v"], "cpu")
    rows = sorted(sweep, key=lambda c: c.get("chunk_size") or default)
    lines = [f"#### Chunk size of the torch path (CPU, N={CPU_TARGET_N}, full, with entropy)", "",
             "| chunk_size (vocab columns) | min CPU time | time vs naive | peak extra memory | memory vs naive |",
             "|---:|---:|---:|---:|---:|"]
    for c in rows:
        chunk = c.get("chunk_size") or default
        label = f"{chunk} (default)" if c.get("chunk_size") is None else str(chunk)
        mem = _mem(c)
        lines.append(f"| {label} | {_fmt_t(c['t'])} | {_fmt_ratio(c['t'] / base['t'])} | "
                     f"{'-' if mem is None else f'{mem:,.0f} MiB'} | "
                     f"{_fmt_ratio(mem / _mem(base) if mem is not None and _mem(base) else None)} |")
    fastest = min(rows, key=lambda c: c["t"])
    default_row = next(c for c in rows if c.get("chunk_size") is None)
    fastest_chunk = fastest.get("chunk_size") or default
    verdict = ("the default is the fastest" if fastest is default_row else
               f"the fastest is {fastest_chunk} ({_fmt_ratio(fastest['t'] / default_row['t'])} the default's time)")
    lines += ["", f"In this run {verdict}."]
    return [*lines, ""]


def ceiling_table(run: Run) -> list[str]:
    lines: list[str] = []
    shapes = sorted({(c["device"], c["dtype"], c["n"], c["h"], c["v"]) for c in run.cases
                     if c.get("impl") in ("gemm_fwd", "gemm_bwd", "copy", "triton_fold")})
    for device, dtype, n, h, v in shapes:
        spec = {"device": device, "dtype": dtype, "n": n, "h": h, "v": v}
        fwd, bwd = run.find(impl="gemm_fwd", **spec), run.find(impl="gemm_bwd", **spec)
        copy, fold = run.find(impl="copy", **spec), run.find(impl="triton_fold", **spec)
        lines += [f"#### Ceiling: {device} {dtype}, N={n}, H={h}, V={v}", "", "| case | min time | throughput |",
                  "|---|---:|---:|"]
        for label, c, key, unit in (("lm_head GEMM forward (h W^T)", fwd, "flop", "TFLOP/s"),
                                     ("lm_head GEMMs backward (g W, g^T h)", bwd, "flop", "TFLOP/s"),
                                     ("copy of the [N, V] logits", copy, "bytes_moved", "GB/s"),
                                     ("Triton forward kernel over [N, V] logits", fold, "bytes_moved", "GB/s")):
            if c is None:
                continue
            scale = 1e12 if unit == "TFLOP/s" else 1e9
            lines.append(f"| {label} | {_fmt_t(c['t'])} | {c[key] / c['t'] / scale:,.3g} {unit} |")
        if fwd and bwd:
            gemms = fwd["t"] + bwd["t"]
            for impl in ("naive", "fused_torch", "fused_triton"):
                c = run.find(impl=impl, mode="full", entropy=True, chunk_size=None, **spec)
                if c:
                    lines.append(f"| {IMPL_LABEL[impl]}, full with entropy, vs the 3 bare GEMMs | "
                                 f"{_fmt_t(c['t'])} | {c['t'] / gemms:.2f}x the GEMMs |")
        lines.append("")
    return lines


def loss_table(run: Run) -> list[str]:
    cases = [c for c in run.cases if str(c.get("impl", "")).startswith("loss_")]
    if not cases:
        return []
    lines = ["#### PolicyLoss: eager vs torch.compile (forward + backward)", "",
             "| device | preset | B x T | eager | compiled | speed-up |", "|---|---|---|---:|---:|---:|"]
    for device in sorted({c["device"] for c in cases}):
        for preset in sorted({c["preset"] for c in cases if c["device"] == device}):
            e = run.find(impl="loss_eager", preset=preset, device=device)
            k = run.find(impl="loss_compiled", preset=preset, device=device)
            if e and k:
                lines.append(f"| {device} | {preset} | {e['batch']} x {e['length']} | {_fmt_t(e['t'])} | "
                             f"{_fmt_t(k['t'])} | {e['t'] / k['t']:.2f}x |")
    return [*lines, ""]


def targets(runs: list[Run]) -> list[str]:
    rows = []
    for entropy in (True, False):
        what = "with entropy" if entropy else "log-probs only"
        naive = fused = None
        spec = {"mode": "full", "entropy": entropy, "n": CPU_TARGET_N, "device": "cpu"}
        for cpu in (r for r in runs if r.device == "cpu"):  # both cases from the same run
            naive = cpu.find(impl="naive", **spec)
            fused = cpu.find(impl="fused_torch", chunk_size=None, **spec)
            if naive and fused:
                break
        if naive and fused and _mem(naive) and _mem(fused) is not None:
            m, t = _mem(fused) / _mem(naive), fused["t"] / naive["t"]
            rows.append(f"| CPU SmolLM2 (N={CPU_TARGET_N}, H=576, V=49152), fwd+bwd {what}: fused peak extra memory "
                        f"<= 15 % of naive | {m:.1%} ({_mem(fused):,.0f} / {_mem(naive):,.0f} MiB) | {_status(m <= 0.15)} |")
            rows.append(f"| CPU SmolLM2, fwd+bwd {what}: fused time <= 1.3x naive | {t:.2f}x | {_status(t <= 1.3)} |")
        else:
            rows.append(f"| CPU SmolLM2, fwd+bwd {what} | not in the results | {_status(None, 'not measured')} |")
    spec = {**CUDA_TARGET, "device": "cuda"}
    gpu = next((r for r in runs if r.find(impl="fused_triton", **spec)),
               next((r for r in runs if r.device == "cuda"), None))
    fused = gpu.find(impl="fused_triton", mode="full", entropy=True, chunk_size=None, **spec) if gpu else None
    fwd = gpu.find(impl="gemm_fwd", **spec) if gpu else None
    bwd = gpu.find(impl="gemm_bwd", **spec) if gpu else None
    liger = gpu.find(impl="liger_grpo", **spec) if gpu else None
    ours = gpu.find(impl="rlzoo_grpo", **spec) if gpu else None
    copy = gpu.find(impl="copy", **spec) if gpu else None
    fold = gpu.find(impl="triton_fold", **spec) if gpu else None
    shape = "CUDA N=32768, H=4096, V=151936, bf16"
    if fused and fwd and bwd:
        r = fused["t"] / (fwd["t"] + bwd["t"])
        rows.append(f"| {shape}, fwd+bwd with entropy: time <= 1.5x the bare lm_head GEMMs | {r:.2f}x | {_status(r <= 1.5)} |")
    else:
        rows.append(f"| {shape}, fwd+bwd with entropy: time <= 1.5x the bare lm_head GEMMs | - | {_status(None)} |")
    if liger and ours:
        ok = ours["t"] <= liger["t"] and (_mem(ours) or 0) <= (_mem(liger) or 0)
        rows.append(f"| {shape}: no slower than Liger at no more memory | time {ours['t'] / liger['t']:.2f}x, "
                    f"memory {(_mem(ours) or 0) / max(_mem(liger) or 1, 1e-9):.2f}x | {_status(ok)} |")
    else:
        why = "" if not gpu else " (liger-kernel not installed)" if ours else ""
        rows.append(f"| {shape}: no slower than Liger at no more memory | -{why} | {_status(None)} |")
    if copy and fold:
        bw_copy = copy["bytes_moved"] / copy["t"]
        bw_fold = fold["bytes_moved"] / fold["t"]
        r = bw_fold / bw_copy
        rows.append(f"| {shape}: Triton logits forward >= 70 % of copy bandwidth | {r:.0%} ({bw_fold / 1e9:,.0f} / "
                    f"{bw_copy / 1e9:,.0f} GB/s) | {_status(r >= 0.7)} |")
    else:
        rows.append(f"| {shape}: Triton logits forward >= 70 % of copy bandwidth | - | {_status(None)} |")
    return ["| target | measured | status |", "|---|---|---|", *rows, ""]


def machine(run: Run) -> list[str]:
    m = run.machine
    cpu = m.get("cpu", {})
    parts = [f"file `{run.path.relative_to(ROOT) if run.path.is_relative_to(ROOT) else run.path}`",
             f"date {run.datetime[:19]}",
             f"CPU {cpu.get('brand_raw', '?')} ({m.get('cpu_count', '?')} cores, torch threads {m.get('torch_threads')})",
             f"GPU {m.get('cuda_device') or 'none'}",
             (f"python {m.get('python_version', '?')}, torch {m.get('torch')}, triton {m.get('triton')}, "
              f"trl {m.get('trl')}, liger-kernel {m.get('liger_kernel')}"),
             f"load average at start {' '.join(m.get('loadavg_at_start', []))}"]
    if run.commit.get("id"):
        parts.append(f"commit {run.commit['id'][:10]}{' (dirty)' if run.commit.get('dirty') else ''}")
    return ["- " + p for p in parts] + [""]


def plot(runs: list[Run], path: Path) -> bool:
    cpu = next((r for r in runs if r.find(impl="naive", mode="full", n=CPU_TARGET_N, device="cpu")), None)
    if cpu is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for entropy in (True, False):
        cases = [cpu.find(impl=i, mode="full", entropy=entropy, n=CPU_TARGET_N, device="cpu", chunk_size=None)
                 for i in IMPL_ORDER]
        cases = [c for c in cases if c]
        if cases:
            panels.append((entropy, cases))
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.2 * len(panels)), squeeze=False)
    for row, (entropy, cases) in enumerate(panels):
        labels = [c["impl"] for c in cases]
        colors = ["tab:gray" if c["impl"] == "naive" else "tab:blue" if c["impl"].startswith("fused") else "tab:orange"
                  for c in cases]
        what = "with entropy" if entropy else "log-probs only"
        axes[row, 0].barh(labels, [c["t"] for c in cases], color=colors)
        axes[row, 0].set_xlabel("forward + backward CPU time, s (min of rounds)")
        axes[row, 0].set_title(f"CPU N={CPU_TARGET_N}, H=576, V=49152, {what}")
        naive = next((c for c in cases if c["impl"] == "naive"), None)
        if naive:
            axes[row, 0].axvline(1.3 * naive["t"], color="tab:red", linestyle="--", label="target: 1.3x naive")
            axes[row, 0].legend(loc="lower right", fontsize=8)
        axes[row, 0].invert_yaxis()
        mems = [_mem(c) or 0 for c in cases]
        if naive and _mem(naive):
            axes[row, 1].axvline(0.15 * _mem(naive), color="tab:red", linestyle="--", label="target: 15 % of naive")
            axes[row, 1].legend(loc="lower right", fontsize=8)
        axes[row, 1].barh(labels, mems, color=colors)
        axes[row, 1].set_xlabel("peak extra memory, MiB")
        axes[row, 1].set_title("peak extra memory (fresh process, VmHWM - VmRSS)")
        axes[row, 1].invert_yaxis()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
    return True


HEADER = """# Benchmarks: log-prob kernels and PolicyLoss

Generated by `python benchmarks/render.py` from the pytest-benchmark JSON in `benchmarks/results/`
({files}); do not edit by hand.

## How to run

```bash
rlzoo bench        # benchmarks/results/cpu.json (cuda.json on a GPU machine), then renders this page
rlzoo bench -k fused --output /tmp/fused.json --docs /tmp/benchmarks.md   # a subset, rendered elsewhere
```

`rlzoo bench` needs the `bench` extra (`pip install -e '.[bench]'`: pytest-benchmark, matplotlib) and
a source checkout (it runs `benchmarks/`). It is the same as

```bash
python -m pytest benchmarks/ --benchmark-only --benchmark-json=benchmarks/results/cpu.json   # CUDA cases skip
python benchmarks/render.py            # every benchmarks/results/*.json -> docs/benchmarks.md + docs/benchmarks.png
```

except that the JSON is written to `FILE.partial` first and moved into place only when every case ran
(a failed run keeps its partial results there and renders nothing). A subset selected with pytest
arguments (`-k`, `-m`, `--lf`, `--deselect`, ...) needs `--output` outside `benchmarks/results/` (it would
replace the committed full results), and results saved anywhere else need `--docs FILE` or `--no-render`: this
page is rendered from `benchmarks/results/` only. The plot is drawn when the results have the CPU `naive` case
at N = 4096 (a subset without it gets the page alone).

The committed CPU results were taken with `RLZOO_BENCH_THREADS=1` (see Method). Other knobs: `-k fused`
(select cases), `RLZOO_BENCH_ROUNDS` (timed rounds of slow cases; default 3 on CPU, 10 on CUDA),
`RLZOO_BENCH_MEMORY=0` (skip the memory measurement). On a CPU the suite takes a while: every slow case
runs its rounds, then once more in a fresh process for the memory figure.

## Method

- Every log-prob case does the same job: from `hidden [N, H]` and the lm_head `weight [V, H]` (leaves that
  require grad) to per-token log-probs (and entropies) of `token_ids [N]`, and - in `backward`/`full` mode -
  the gradients of hidden and weight from `sum(logprobs) + sum(entropy)`. `naive` = `hidden @ weight.T`,
  float32 `log_softmax`, gather (entropy: `-(p log p).sum`). `trl` = the same logits through TRL 1.16's
  one-pass `selective_log_softmax_and_entropy` (`selective_log_softmax` for log-probs only): its Triton
  kernel on CUDA; on CPU its fallback, `selective_log_softmax` + `entropy_from_logits` (what the CPU
  results below measured). `rlzoo_logits` = the same logits through
  `rlzoo.kernels.logprobs_and_entropy_from_logits`. `fused_*` = `rlzoo.kernels.fused_linear_logprobs`
  (default chunk size unless stated).
- Modes: `forward` (autograd recording on), `backward` (the forward runs untimed before each round, and
  the device is synchronised before the timer starts), `full` (both).
- Timing: pytest-benchmark pedantic mode, an untimed preparation before every round, 3 rounds for slow CPU
  cases (10 on CUDA; more rounds for fast cases). **CPU ratios use the minimum process CPU time** of the
  rounds (`time.process_time`, recorded per round in `extra_info.cpu_time_rounds`), with one torch thread:
  the 2-core machine is shared with other jobs, and a single-threaded process's CPU time does not count
  the time it waits for a core (with several threads, OpenMP barriers would spin while a sibling thread
  is descheduled). Wall-clock minima are shown too; the load average at the start of the run is below. CUDA ratios use
  the minimum wall-clock time (with a device synchronisation in every round). Only cases of the same run
  are compared (side by side).
- Peak extra memory: **CPU** - torch's CPU allocator is invisible to `tracemalloc`, so each case runs once
  more in a fresh Python process; after the untimed preparation the kernel's resident-set high-water mark
  is reset (`echo 5 > /proc/self/clear_refs`) and the figure is `VmHWM` after the timed part minus `VmRSS`
  before it. It counts everything the step allocates, including the `[V, H]` weight gradient (108 MiB
  here) and the hidden-state gradient, for every implementation. **CUDA** -
  `torch.cuda.max_memory_allocated()` during the timed part minus `memory_allocated()` before it.
- Default chunk size of `fused_linear_logprobs`: CPU - `2**24 // N` vocabulary columns (4096 at N = 4096,
  8192 at N = 2048): a chunk of 16 Mi float32 logits (64 MiB); the sweep below measures the alternatives
  (memory grows with the chunk, time varies little). CUDA - `2**26 // N` (2048 at N = 32768, 8192 at
  N = 8192), chosen by reasoning (GEMMs of at least N x 2048 keep the tensor cores busy; a 256 MiB float32
  chunk is 2.7 % of the 9.3 GiB bf16 logits) and **not measured yet**.
"""


def render(paths: list[Path], out: Path, png: Path) -> str:
    runs = [Run(p) for p in paths]
    files = " ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths)
    lines = [HEADER.format(files=", ".join(f"`{f}`" for f in files.split())), "## Targets", ""]
    lines += targets(runs)
    has_plot = plot(runs, png)
    if has_plot:
        lines += [f"![CPU forward+backward time and peak memory]({png.name})", ""]
    for run in runs:
        lines += [f"## Results: {run.device.upper()}", ""]
        lines += machine(run)
        if run.device == "cuda":
            lines += [NAIVE_SKIP, ""]
        lines += logprob_tables(run) + chunk_table(run) + ceiling_table(run) + loss_table(run)
    if not any(r.device == "cuda" for r in runs):
        lines += ["## Results: CUDA", "",
                  (f"{NOT_MEASURED[0].upper() + NOT_MEASURED[1:]}. The CUDA cases (N in {{8192, 32768}}, H = 4096, "
                   "V in {128256, 151936}, bf16: every implementation and mode, Liger's fused linear GRPO loss vs. "
                   "rlzoo, the bare GEMMs, the logits copy and the Triton forward kernel's bandwidth) are in "
                   "`benchmarks/test_bench_logprobs.py` and run with the command above on a GPU machine."), "",
                  NAIVE_SKIP, ""]
    text = "\n".join(lines).rstrip() + "\n"
    atomic_write_bytes(out, text.encode())
    return text


def _is_pytest_benchmark(path: Path) -> bool:
    """True for pytest-benchmark JSON of this suite (other scripts also write to benchmarks/results/)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    benches = data.get("benchmarks") if isinstance(data, dict) else None
    return bool(benches) and all(isinstance(b, dict) and "stats" in b and "impl" in b.get("extra_info", {})
                                 for b in benches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path, help="pytest-benchmark JSON files (default: benchmarks/results/*.json)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "benchmarks.png")
    args = parser.parse_args()
    paths = args.results or [p for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
                             if _is_pytest_benchmark(p)]
    if not paths:
        raise SystemExit("no results: run `python -m pytest benchmarks/ --benchmark-only --benchmark-json=...` first")
    text = render([p.resolve() for p in paths], args.out, args.plot)
    # the plot needs the CPU naive case at the target size: a subset without it gets the page alone
    drawn = f"]({args.plot.name})" in text
    print(f"wrote {args.out} and {args.plot}" if drawn else f"wrote {args.out} (no plot: the results lack the CPU "
          f"naive full case at N={CPU_TARGET_N})")


if __name__ == "__main__":
    main()
