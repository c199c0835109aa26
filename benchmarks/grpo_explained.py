"""Runs and figures for docs/grpo-explained.md: the built-in job at num_iterations 1, 2 and 4, instrumented.

Each run is ``rlzoo train``'s built-in job (GRPO on SmolLM2-135M-Instruct, reasoning-gym chain_sum with two
one-digit terms, 4 prompts x 8 completions per step, max_completion_length 32, learning rate 2e-5, beta 0.04,
fp32 on the CPU) with ``--num-iterations N``, a few steps and a small held-out set. The trainer runs unchanged;
this script only watches it from outside:

* every call the trainer makes to ``Scorer.generation_logprobs`` (old log-probs of the policy, reference
  log-probs) and to ``RolloutSource.generate``, with the micro-step and optimizer step at that moment
  (``events``);
* every micro-batch the loss sees (``micro_batches``): the token counts of the clip cases (A > 0 and
  r > 1 + epsilon_high; A < 0 and r < 1 - epsilon_low; A < 0 and r > 1 + epsilon_high, the side the clip
  leaves open), the largest ratio among the latter, their share of the loss's gradient with respect to the
  log-probs (autograd, ``torch.autograd.grad`` of the trainer's own loss value), and the largest difference
  between that gradient and the gradient of REINFORCE (``-A logp``) under the same aggregation with beta 0.

Usage (about 20 minutes on 2 idle cores; several times longer on a shared machine)::

    python benchmarks/grpo_explained.py run --steps 8 --eval-size 50      # the runs -> benchmarks/results/grpo_explained/
    python benchmarks/grpo_explained.py run --model tiny-random --steps 2 --eval-size 0   # smoke test -> runs/
    python benchmarks/grpo_explained.py figures                           # the figures -> docs/grpo_explained/
    (--results DIR: another results directory, for run, figures (then drawn into DIR/figures) and tables)
    python benchmarks/grpo_explained.py tables                            # the doc's tables (markdown)

``run`` writes ``ni{N}_metrics.jsonl`` (the trainer's own metrics.jsonl), ``ni{N}_watch.json`` (events and
micro-batch statistics) and ``summary.json`` (commit, flags, machine, wall times).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "grpo_explained"
FIGURES = ROOT / "docs" / "grpo_explained"
MAIN_JOB = ROOT / "benchmarks" / "results" / "main_job_cpu_metrics.jsonl"  # the README's main job, per step


# ------------------------------------------------------------------------------------------------------ runs
def _commit() -> str:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True, check=False).stdout.strip()
    return head + ("+dirty" if dirty else "")


def _machine() -> dict[str, Any]:
    """CPU model, cores, load and versions."""
    import transformers

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1m_at_start": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


class _Watcher:
    """Records what the trainer does, without changing it: wraps the loss, the scorer and the rollout source of
    one :class:`~rlzoo.trainer.Trainer` instance."""

    def __init__(self, trainer: Any) -> None:
        from rlzoo.losses import PolicyLoss

        self.trainer = trainer
        self.events: list[dict[str, Any]] = []
        self.micro_batches: list[dict[str, Any]] = []
        loss_fn = trainer.loss_fn
        self.loss_fn = loss_fn
        self.eps_low, self.eps_high = loss_fn.surrogate.epsilon_low, loss_fn.surrogate.epsilon_high
        # REINFORCE under the same aggregation, and the loss itself without its KL term
        self.reinforce = PolicyLoss(surrogate="reinforce", aggregation=loss_fn.aggregation)
        self.policy_term = loss_fn.with_options(beta=0.0)

        scorer, rollouts = trainer.scorer, trainer.rollouts
        score, generate = scorer.generation_logprobs, rollouts.generate

        def generation_logprobs(module: Any, rollout: Any) -> torch.Tensor:
            which = "old_logprobs" if module is trainer.policy.module else "ref_logprobs"
            self._event(which)
            return score(module, rollout)

        def watched_generate() -> Any:
            self._event("generate")
            return generate()

        scorer.generation_logprobs = generation_logprobs
        rollouts.generate = watched_generate
        trainer.loss_fn = self

    def _event(self, what: str) -> None:
        rollouts = self.trainer.rollouts
        self.events.append({"event": what, "micro_step": rollouts.micro_step, "optimizer_step": self.trainer.step,
                            "round": rollouts.round})

    def __getattr__(self, name: str) -> Any:  # everything else is the loss's own
        return getattr(self.loss_fn, name)

    def __call__(self, batch: Any, normalizer: Any = None) -> Any:
        out = self.loss_fn(batch, normalizer=normalizer)
        self._record(batch, normalizer, out)
        return out

    def _record(self, batch: Any, normalizer: Any, out: Any) -> None:
        (grad,) = torch.autograd.grad(out.loss, batch.logprobs, retain_graph=True)
        lp = batch.logprobs.detach().requires_grad_(True)
        detached = batch.__class__(logprobs=lp, old_logprobs=batch.old_logprobs, advantages=batch.advantages,
                                   completion_mask=batch.completion_mask, ref_logprobs=batch.ref_logprobs)
        (policy_grad,) = torch.autograd.grad(self.policy_term(detached, normalizer=normalizer).loss, lp)
        lp2 = batch.logprobs.detach().requires_grad_(True)
        detached2 = batch.__class__(logprobs=lp2, advantages=batch.advantages, completion_mask=batch.completion_mask)
        (reinforce_grad,) = torch.autograd.grad(self.reinforce(detached2, normalizer=normalizer).loss, lp2)
        with torch.no_grad():
            mask = batch.completion_mask
            old = batch.old_logprobs if batch.old_logprobs is not None else batch.logprobs
            r = torch.exp(batch.logprobs.detach() - old)
            adv = batch.advantages
            adv = adv[:, None].expand_as(r) if adv.ndim == 1 else adv
            high_pos = mask & (r > 1 + self.eps_high) & (adv > 0)
            low_neg = mask & (r < 1 - self.eps_low) & (adv < 0)
            open_neg = mask & (r > 1 + self.eps_high) & (adv < 0)
            g = grad.abs() * mask
            self.micro_batches.append({
                "micro_step": self.trainer.rollouts.micro_step - 1,
                "optimizer_step": self.trainer.step + 1,
                "old_logprobs_given": batch.old_logprobs is not None,
                "tokens": int(mask.sum()),
                "tokens_a_pos_r_above_high": int(high_pos.sum()),
                "tokens_a_neg_r_below_low": int(low_neg.sum()),
                "tokens_a_neg_r_above_high": int(open_neg.sum()),
                "max_r_a_neg_r_above_high": float(r[open_neg].max()) if open_neg.any() else None,
                "mean_r_a_neg_r_above_high": float(r[open_neg].mean()) if open_neg.any() else None,
                "grad_share_a_neg_r_above_high": float(g[open_neg].sum() / g.sum()) if g.sum() > 0 else 0.0,
                "ratio_min": float(r[mask].min()),
                "ratio_max": float(r[mask].max()),
                "max_abs_grad": float(g.max()),
                "max_abs_policy_grad_minus_reinforce": float(((policy_grad - reinforce_grad).abs() * mask).max()),
            })


def run_one(num_iterations: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Train the built-in job with ``num_iterations``; returns the wall time and where the results went."""
    from rlzoo.trainer import TrainConfig, Trainer

    flags = {"model": args.model, "max_steps": args.steps, "num_iterations": num_iterations, "eval_size": args.eval_size,
             "eval_steps": 0, "seed": args.seed, "progress": False}
    config = TrainConfig(output_dir=str(workdir / f"ni{num_iterations}"), overwrite=True, **flags)
    started = time.perf_counter()
    trainer = Trainer(config)
    watcher = _Watcher(trainer)
    trainer.train()
    wall = time.perf_counter() - started
    RESULTS.mkdir(parents=True, exist_ok=True)
    metrics = (trainer.output_dir / "metrics.jsonl").read_text()
    _write(RESULTS / f"ni{num_iterations}_metrics.jsonl", metrics)
    _write(RESULTS / f"ni{num_iterations}_watch.json",
           json.dumps({"events": watcher.events, "micro_batches": watcher.micro_batches}, indent=1) + "\n")
    return {"flags": flags, "wall_s": round(wall, 1),
            "command": "rlzoo train " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items()
                                                 if k != "progress") + " --no-progress"}


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cmd_run(args: argparse.Namespace) -> int:
    import tempfile

    # runs made by separate invocations (different --steps) are merged; each run keeps its own provenance
    path = RESULTS / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    script = ("benchmarks/grpo_explained.py run "
              f"--steps {args.steps} --eval-size {args.eval_size} --seed {args.seed} --model {args.model}")
    with tempfile.TemporaryDirectory(prefix="grpo-explained-") as tmp:
        for n in args.num_iterations:
            started = {"commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
                       "script": f"{script} --num-iterations {n}"}
            summary["runs"][f"ni{n}"] = {**started, **run_one(n, args, Path(tmp))}
            print(f"num_iterations={n}: {summary['runs'][f'ni{n}']['wall_s']} s", flush=True)
            _write(RESULTS / "summary.json", json.dumps(summary, indent=2) + "\n")
    return 0


# --------------------------------------------------------------------------------------------------- figures
def _rows(n: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RESULTS / f"ni{n}_metrics.jsonl").read_text().splitlines() if line.strip()]


def _watch(n: int) -> dict[str, Any]:
    return json.loads((RESULTS / f"ni{n}_watch.json").read_text())


def _save(fig: Any, axes: Any, name: str) -> None:
    """Integer step ticks and a legend on each panel; write ``FIGURES / name`` (80 dpi) and close."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(frameon=False, fontsize=8)
    fig.savefig(FIGURES / name, dpi=80)
    plt.close(fig)


def cmd_figures(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    runs = sorted(int(p.name[2:].split("_")[0]) for p in RESULTS.glob("ni*_metrics.jsonl"))
    colors = {1: "#1f77b4", 2: "#ff7f0e", 4: "#2ca02c"}
    plt.rcParams.update({"font.size": 10, "axes.spines.top": False, "axes.spines.right": False})

    # 1. clip_ratio per step
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for n in runs:
        steps = [r for r in _rows(n) if "loss" in r]
        x = [r["step"] for r in steps]
        axes[0].plot(x, [100 * r["clip_ratio/region_mean"] for r in steps], "o-", color=colors.get(n), ms=4,
                     label=f"num_iterations = {n}")
        axes[1].plot(x, [r["ratio/max"] for r in steps], "o-", color=colors.get(n), ms=4, label=f"max r, ni = {n}")
        axes[1].plot(x, [r["ratio/min"] for r in steps], "s--", color=colors.get(n), ms=3, alpha=0.7)
    axes[0].set(xlabel="optimizer step", ylabel="clip_ratio/region_mean (% of tokens)",
                title="tokens clipped (TRL's clip_ratio)")
    axes[1].axhspan(0.8, 1.2, color="0.9", zorder=0, label="[1 - eps, 1 + eps]")
    axes[1].set(xlabel="optimizer step", ylabel="ratio r (max: o-, min: s--)", title="range of the ratio r",
                yscale="log")
    _save(fig, axes, "clip_ratio.png")

    # 2. loss, beta * kl, grad_norm and reward per step at num_iterations = 1: the README's main job (20 steps of the
    # same run as ni1, whose 3 steps are its first 3), where the reward rises
    rows = [r for r in map(json.loads, MAIN_JOB.read_text().splitlines()) if "loss" in r]
    x = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), constrained_layout=True)  # empty without a num_iterations 1 run
    axes[0].plot(x, [r["loss"] for r in rows], "o-", ms=4, label="loss (logged)")
    axes[0].plot(x, [0.04 * r["kl"] for r in rows], "x--", ms=6, label="beta * logged kl (token mean)")
    axes[0].axhline(0, color="0.6", lw=0.8)
    axes[0].set(xlabel="optimizer step", title="loss value (-A part: 0)")
    axes[1].plot(x, [r["grad_norm"] for r in rows], "o-", ms=4, color="#d62728")
    axes[1].set(xlabel="optimizer step", title="grad_norm (before clipping at 1.0)", ylim=(0, None))
    axes[2].plot(x, [r["reward"] for r in rows], "o-", ms=4, color="#2ca02c")
    axes[2].set(xlabel="optimizer step", title="mean reward of the step's completions", ylim=(0, 1))
    axes[0].legend(frameon=False, fontsize=8, loc="lower right")
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("the README's main job (num_iterations = 1): the loss sits near 0 while the reward rises",
                 fontsize=11)
    fig.savefig(FIGURES / "loss_vs_grad.png", dpi=80)
    plt.close(fig)

    # 3. A < 0 and r > 1 + eps tokens per step
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    width = 0.8 / max(1, len(runs))
    for k, n in enumerate(runs):
        per_step: dict[int, dict[str, float]] = {}
        for mb in _watch(n)["micro_batches"]:
            s = per_step.setdefault(mb["optimizer_step"], {"count": 0, "share": 0.0, "max_r": 0.0})
            s["count"] += mb["tokens_a_neg_r_above_high"]
            s["share"] = max(s["share"], mb["grad_share_a_neg_r_above_high"])
            s["max_r"] = max(s["max_r"], mb["max_r_a_neg_r_above_high"] or 0.0)
        steps = sorted(per_step)
        axes[0].bar([s + (k - (len(runs) - 1) / 2) * width for s in steps], [per_step[s]["count"] for s in steps],
                    width=width, color=colors.get(n), label=f"num_iterations = {n}")
        axes[1].plot(steps, [100 * per_step[s]["share"] for s in steps], "o-", ms=4, color=colors.get(n),
                     label=f"num_iterations = {n}")
    axes[0].set(xlabel="optimizer step", ylabel="tokens", title="tokens with A < 0 and r > 1 + eps (not clipped)")
    axes[1].set(xlabel="optimizer step", ylabel="% of the step's |d loss / d logp|",
                title="their share of the gradient (w.r.t. log-probs)")
    _save(fig, axes, "unclipped_negative.png")

    # 4. exp(logp - logp.detach()): the trainer's gradient against REINFORCE's, per pass over a batch
    fig, ax = plt.subplots(figsize=(10, 3.4), constrained_layout=True)
    for k, n in enumerate(runs):
        mbs = _watch(n)["micro_batches"]
        x = [mb["optimizer_step"] + (k - (len(runs) - 1) / 2) * 0.12 for mb in mbs]
        ax.plot(x, [mb["max_abs_policy_grad_minus_reinforce"] for mb in mbs], "o", color=colors.get(n), ms=6,
                label=f"max |grad - REINFORCE grad|, ni = {n}")
        ax.plot(x, [mb["max_abs_grad"] for mb in mbs], "_", color=colors.get(n), ms=14, mew=2,
                label=f"max |grad| (scale), ni = {n}")
    ax.set(xlabel="optimizer step", ylabel="d loss / d logp (per token)",
           title="first pass (r = 1): the gradient is REINFORCE's exactly (0); later passes: clipped tokens differ")
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=-0.0005)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(frameon=False, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(FIGURES / "detached_ratio_gradient.png", dpi=80)
    plt.close(fig)

    # 5. the generation cycle: when generation, old and reference log-probs happen
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.6 * len(runs)), layout="constrained")
    marks = {"generate": ("v", "#444444", "generate (sample + rewards + advantages)"),
             "old_logprobs": ("o", "#d62728", "old log-probs (policy, no grad)"),
             "ref_logprobs": ("s", "#9467bd", "reference log-probs")}
    for k, n in enumerate(runs):
        y = len(runs) - 1 - k
        watch = _watch(n)
        steps = sorted({mb["optimizer_step"] for mb in watch["micro_batches"]})
        ax.scatter(steps, [y - 0.25] * len(steps), marker="|", s=200, color="0.5",
                   label="optimizer step (loss + backward)" if k == 0 else None)
        offsets = {"generate": -0.15, "old_logprobs": 0.0, "ref_logprobs": 0.15}
        for what, (marker, color, label) in marks.items():
            xs = [e["optimizer_step"] + 1 + offsets[what] - 0.5 for e in watch["events"] if e["event"] == what]
            ax.scatter(xs, [y] * len(xs), marker=marker, color=color, s=36, label=label if k == 0 else None)
    ax.set_yticks(range(len(runs)), [f"num_iterations = {n}" for n in reversed(runs)])
    ax.set(xlabel="optimizer step (events drawn just before the step they feed)", ylim=(-0.7, len(runs) - 0.4))
    ax.xaxis.get_major_locator().set_params(integer=True)
    fig.legend(frameon=False, fontsize=8, ncols=2, loc="outside upper center")
    fig.savefig(FIGURES / "generation_cycle.png", dpi=80)
    plt.close(fig)
    print(f"wrote {', '.join(sorted(p.name for p in FIGURES.glob('*.png')))} to {FIGURES}")
    return 0


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


def cmd_tables(args: argparse.Namespace) -> int:
    """Print the markdown tables of docs/grpo-explained.md from the results."""
    runs = sorted(int(p.name[2:].split("_")[0]) for p in RESULTS.glob("ni*_metrics.jsonl"))
    clip = []
    for n in runs:
        for r in (r for r in _rows(n) if "loss" in r):
            clip.append([n, r["step"], (r["step"] - 1) % n + 1, f"{100 * r['clip_ratio/region_mean']:.1f} %",
                         f"{100 * r['clip_ratio/low_mean']:.1f} %", f"{100 * r['clip_ratio/high_mean']:.1f} %",
                         f"{r['ratio/min']:.3g}", f"{r['ratio/max']:.3g}"])
    print(_table(["num_iterations", "step", "pass over its batch", "clip_ratio/region_mean", "low (A < 0)",
                  "high (A > 0)", "min r", "max r"], clip), end="\n\n")
    if 1 in runs:
        rows = [[r["step"], f"{r['loss']:.3g}", f"{0.04 * r['kl']:.3g}", f"{r['grad_norm']:.3g}",
                 f"{r['reward']:.3g}"] for r in _rows(1) if "loss" in r]
        print(_table(["step", "loss (logged)", "beta * kl", "grad_norm", "reward (32 completions)"], rows), end="\n\n")
    neg = []
    for n in runs:
        for mb in _watch(n)["micro_batches"]:
            neg.append([n, mb["optimizer_step"], mb["tokens"], mb["tokens_a_pos_r_above_high"],
                        mb["tokens_a_neg_r_below_low"], mb["tokens_a_neg_r_above_high"],
                        "-" if mb["max_r_a_neg_r_above_high"] is None else f"{mb['max_r_a_neg_r_above_high']:.3g}",
                        f"{100 * mb['grad_share_a_neg_r_above_high']:.2f} %"])
    print(_table(["num_iterations", "step", "tokens", "A > 0, r > 1 + eps (clipped)", "A < 0, r < 1 - eps (clipped)",
                  "A < 0, r > 1 + eps (not clipped)", "their max r", "their share of sum abs(d loss / d logp)"], neg),
          end="\n\n")
    trick = [[n, mb["optimizer_step"], mb["old_logprobs_given"], f"{mb['ratio_min']:.6g}", f"{mb['ratio_max']:.6g}",
              f"{mb['max_abs_policy_grad_minus_reinforce']:.3g}", f"{mb['max_abs_grad']:.3g}"]
             for n in runs for mb in _watch(n)["micro_batches"]]
    print(_table(["num_iterations", "step", "old_logprobs given", "min r", "max r",
                  "max abs(grad - REINFORCE grad)", "max abs(grad)"], trick), end="\n\n")
    cycle = []
    for n in runs:
        metrics = {r["step"]: r for r in _rows(n) if "loss" in r}
        for step in sorted(metrics):
            events = [e["event"] for e in _watch(n)["events"] if e["optimizer_step"] == step - 1]
            cycle.append([n, step, ", ".join(events) or "(reuses the batch)",
                          f"{metrics[step]['generation_time']:.3g} s"])
    print(_table(["num_iterations", "step", "calls before the step's loss", "generation_time (metrics.jsonl)"], cycle))
    return 0


def main(argv: list[str] | None = None) -> int:
    global RESULTS, FIGURES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the built-in job at each num_iterations, watched")
    run.add_argument("--steps", type=int, default=8)
    run.add_argument("--eval-size", type=int, default=50)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--model", default="smollm2-135m", help="tiny-random for a smoke test of the script (its "
                     "results go to runs/grpo_explained-tiny-random unless --results says otherwise)")
    run.add_argument("--num-iterations", type=int, nargs="+", default=[1, 2, 4])
    figures = sub.add_parser("figures", help="draw docs/grpo_explained/*.png from the results")
    tables = sub.add_parser("tables", help="print the markdown tables of docs/grpo-explained.md from the results")
    for command in (run, figures, tables):
        command.add_argument("--results", type=Path, default=None,
                             help=f"the results directory (default {RESULTS.relative_to(ROOT)}, the committed one)")
    args = parser.parse_args(argv)
    if args.results is not None:
        RESULTS = args.results
        FIGURES = args.results / "figures"  # the committed figures are drawn from the committed results only
    elif args.command == "run" and args.model != "smollm2-135m":  # a smoke test never replaces the measured runs
        RESULTS = Path("runs") / f"grpo_explained-{args.model}"
    return {"run": cmd_run, "figures": cmd_figures, "tables": cmd_tables}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
