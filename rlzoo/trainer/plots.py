"""The run's plot (``reward.png``): what a reader checks first about a run, on one page.

Top: the mean training reward (left axis) and the held-out greedy accuracy with its 95 % Wilson band (right
axis), each on its own scale (for a task without answers, the held-out greedy reward on the reward's axis). Below, one panel each: the loss, the KL to the reference, the policy's entropy,
the mean completion length (with the truncated share), and the clip ratio. The title names the model, the task
and the algorithm; a short run gets one tick per optimizer step.
"""

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.trainer.io import atomic_write_bytes

__all__ = ["PANELS", "plot_metrics"]

PANELS: tuple[tuple[str, str, str], ...] = (
    ("loss", "loss", "loss"),
    ("kl", "KL to reference", "kl"),
    ("entropy", "entropy (nats / token)", "entropy"),
    ("completions/mean_length", "completion length (tokens)", "length"),
    ("clip_ratio/region_mean", "clip ratio", "clip"),
)
"""The small panels: ``(metric, title, short name)``."""

_REWARD, _ACCURACY, _OTHER = "#1f6fb4", "#c0392b", "#555555"


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(int(r["step"]), float(r[key])) for r in history if r.get(key) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def plot_metrics(history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *,
                 title: str | None = None) -> Path:
    """Draw the run's metrics rows (``metrics.jsonl``) into a PNG at ``path`` (written atomically).

    Args:
        history: metrics rows (``step``, ``reward``, ``eval/accuracy``, ``eval/ci_low``, ``eval/ci_high``, else
            ``eval/reward``, and the :data:`PANELS` keys; missing ones are drawn as "not logged").
        path: the PNG file.
        title: the figure's title (e.g. "grpo on chain_sum - smollm2-135m").

    Returns:
        ``path``.

    Raises:
        OSError: the write failed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig = plt.figure(figsize=(12, 7.2), dpi=110)
    grid = fig.add_gridspec(2, len(PANELS), height_ratios=(1.5, 1), hspace=0.42, wspace=0.75, top=0.9)
    top = fig.add_subplot(grid[0, :])
    steps, rewards = _series(history, "reward")
    top.plot(steps, rewards, color=_REWARD, marker="o", markersize=3, linewidth=1.6,
             label="mean reward (training batch)")
    top.set_ylabel("mean reward", color=_REWARD)
    top.tick_params(axis="y", colors=_REWARD)
    top.set_xlabel("optimizer step")
    top.grid(alpha=0.3)
    if not any(r.get("eval/accuracy") is not None for r in history):  # a task without answers: its reward
        held_steps, held_out = _series(history, "eval/reward")
        if held_out:
            top.plot(held_steps, held_out, color=_ACCURACY, marker="s", markersize=5, linewidth=1.6,
                     label="held-out greedy reward")
    handles = top.get_legend_handles_labels()
    evals = [(int(r["step"]), r["eval/accuracy"], r.get("eval/ci_low"), r.get("eval/ci_high"))
             for r in history if r.get("eval/accuracy") is not None]
    if evals:
        right = top.twinx()
        es = [e[0] for e in evals]
        accuracy = [e[1] for e in evals]
        if all(e[2] is not None and e[3] is not None for e in evals):
            right.fill_between(es, [e[2] for e in evals], [e[3] for e in evals], color=_ACCURACY, alpha=0.15,
                               linewidth=0, label="95 % interval")
        right.plot(es, accuracy, color=_ACCURACY, marker="s", markersize=5, linewidth=1.6,
                   label="held-out greedy accuracy")
        for i, (s, a) in enumerate(zip(es, accuracy, strict=True)):
            edge = "left" if i == 0 else "right" if i == len(es) - 1 and len(es) > 1 else "center"
            right.annotate(f"{100 * a:.1f}%", (s, a), textcoords="offset points", xytext=(0, 8), ha=edge,
                           fontsize=8, color=_ACCURACY)
        right.set_ylim(0.0, 1.05)
        right.yaxis.set_major_formatter(PercentFormatter(1.0))
        right.set_ylabel("held-out accuracy", color=_ACCURACY)
        right.tick_params(axis="y", colors=_ACCURACY)
        more = right.get_legend_handles_labels()
        handles = (handles[0] + more[0], handles[1] + more[1])
    top.legend(*handles, loc="upper left", fontsize=8, framealpha=0.9)
    all_steps = sorted({int(r["step"]) for r in history if "step" in r})
    span = (all_steps[0] - 0.3, all_steps[-1] + 0.3) if len(all_steps) > 1 else None
    for column, (key, label, _) in enumerate(PANELS):
        ax = fig.add_subplot(grid[1, column])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        if span:
            ax.set_xlim(*span)
        xs, ys = _series(history, key)
        if ys:
            ax.plot(xs, ys, color=_OTHER, marker="o", markersize=2.5, linewidth=1.2)
            if key == "clip_ratio/region_mean" or key == "completions/mean_length":
                ax.set_ylim(bottom=0)
        else:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="#999999")
        if key == "completions/mean_length":
            xs2, clipped = _series(history, "completions/clipped_ratio")
            if clipped:
                share = ax.twinx()
                share.plot(xs2, clipped, color=_OTHER, linestyle=":", linewidth=1)
                share.set_ylim(0, 1.05)
                share.yaxis.set_major_formatter(PercentFormatter(1.0))
                share.tick_params(axis="y", labelsize=7)
                label += "\n(dotted: truncated share)"
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(alpha=0.3)
        ax.set_xlabel("step", fontsize=8)
    top.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(max(len(all_steps), 1), 12)))
    if span:
        top.set_xlim(*span)
    if title:
        fig.suptitle(title, fontsize=12)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)
