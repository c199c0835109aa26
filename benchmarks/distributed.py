"""Memory and throughput of data-parallel training: SmolLM2-135M under FSDP2 (and DDP) at 1 and 2 ranks on CPU.

    python benchmarks/distributed.py                       # runs every configuration, writes the JSON
    python benchmarks/distributed.py --output FILE.json

For each configuration the same global batch (4 prompts x 8 completions, max_completion_length 32) is trained for
a few steps with ``rlzoo train`` (1 rank: one process; 2 ranks: ``python -m torch.distributed.run``). Each rank
reports, after its last step, the bytes it holds of parameters, gradients and AdamW state (the local shards under
FSDP2: what sharding divides), its peak resident memory, and the run's completions per second (steps after the
first, which includes start-up costs). Results: benchmarks/results/distributed_cpu.json, rendered in
docs/distributed.md.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
SETTINGS = ["--model", "smollm2-135m", "--max-steps", str(STEPS), "--eval-size", "0", "--save-steps", "0",
            "--num-generations", "8", "--max-completion-length", "32", "--no-progress", "--seed", "0"]


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def worker(out: Path) -> None:
    """Inside one rank: train, then report this rank's memory and timings (called by the launched processes)."""
    import torch

    from rlzoo.cli import parse_train_args
    from rlzoo.trainer import Trainer

    config = parse_train_args(sys.argv[sys.argv.index("--") + 1:])
    trainer = Trainer(config)
    history = trainer.train()
    params = list(trainer.optimizer.optimizer.param_groups[0]["params"])
    state = [v for s in trainer.optimizer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    # gradients are freed after each step (zero_grad(set_to_none=True)); their size equals the parameters' shards
    report = {
        "rank": trainer.dist.rank, "world_size": trainer.dist.world_size,
        "parallelism": config.parallelism if trainer.dist.enabled else "none",
        "parameter_bytes": _local_bytes(params), "gradient_bytes": _local_bytes(params),
        "optimizer_state_bytes": _local_bytes(state),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_times": [row["step_time"] for row in history if "step_time" in row],
        "completions_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps
        * trainer.dist.world_size,
    }
    (out / f"rank{trainer.dist.rank}.json").write_text(json.dumps(report))


def run(world_size: int, parallelism: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        per_device = 32 // world_size
        args = [*SETTINGS, "--per-device-train-batch-size", str(per_device), "--output-dir", str(out / "run"),
                *(["--parallelism", parallelism] if world_size > 1 else [])]
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                     str(world_size)] if world_size > 1 else [sys.executable])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world_size))}
        started = time.perf_counter()
        subprocess.run([*launcher, __file__, "--worker", str(out), "--", *args], cwd=ROOT, env=env, check=True)
        wall = time.perf_counter() - started
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    steady = [max(r["step_times"][i] for r in ranks) for i in range(1, STEPS)]  # the slowest rank sets the pace
    per_step = sum(steady) / len(steady)
    return {"world_size": world_size, "parallelism": parallelism if world_size > 1 else "none", "ranks": ranks,
            "wall_seconds": wall, "mean_step_seconds": per_step,
            "completions_per_second": ranks[0]["completions_per_step"] / per_step}


def main() -> None:
    if "--worker" in sys.argv:
        worker(Path(sys.argv[sys.argv.index("--worker") + 1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "distributed_cpu.json"))
    args = parser.parse_args()
    import torch

    from rlzoo.trainer.io import atomic_write_text

    results = [run(1, "none"), run(2, "fsdp"), run(2, "ddp")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    payload = {"machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                           "torch": torch.__version__, "note": "2-core CPU, gloo; shared with other jobs"},
               "commit": commit, "settings": SETTINGS, "results": results}
    atomic_write_text(args.output, json.dumps(payload, indent=2) + "\n")
    for r in results:
        rank0 = r["ranks"][0]
        print(f"{r['world_size']} rank(s) {r['parallelism']:>4}: params {rank0['parameter_bytes'] / 2**20:.0f} MiB, "
              f"AdamW {rank0['optimizer_state_bytes'] / 2**20:.0f} MiB per rank, peak RSS "
              f"{rank0['peak_rss_bytes'] / 2**30:.2f} GiB, {r['completions_per_second']:.2f} completions/s")


if __name__ == "__main__":
    main()
