"""The run's metrics file (``metrics.jsonl``, one JSON object per optimizer step) and its plot."""

import json
import math
import os
from pathlib import Path
from typing import Any

from rlzoo.trainer.io import atomic_write_bytes, atomic_write_text

__all__ = ["MetricsLog", "plot_metrics"]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    return value


class MetricsLog:
    """Accumulates per-step metric dicts and rewrites ``metrics.jsonl`` atomically after each one.

    Rows with the same ``step`` are merged (the step-0 evaluation and, after a resume, nothing is lost or
    duplicated).
    """

    def __init__(self, output_dir: str | os.PathLike[str], history: list[dict[str, Any]]) -> None:
        self.output_dir = Path(output_dir)
        self.history = history

    @property
    def path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def add(self, row: dict[str, Any]) -> None:
        """Append (or merge into the row of the same step) and rewrite the file."""
        row = {k: _clean(v) for k, v in row.items()}
        if self.history and self.history[-1].get("step") == row.get("step"):
            self.history[-1].update(row)
        else:
            self.history.append(row)
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.history))

    def plot(self) -> Path:
        """Write ``reward.png`` (reward and held-out accuracy vs step)."""
        return plot_metrics(self.history, self.output_dir / "reward.png")


def plot_metrics(history: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Plot mean reward (left axis) and held-out greedy accuracy (right axis) against the optimizer step."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in history if r.get("reward") is not None]
    rewards = [r["reward"] for r in history if r.get("reward") is not None]
    evals = [(r["step"], r["eval/accuracy"]) for r in history if r.get("eval/accuracy") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(steps, rewards, color="tab:blue", marker="o", markersize=3, label="mean reward (training batch)")
    if evals:
        es, ea = zip(*evals, strict=True)
        ax.plot(es, ea, color="tab:red", marker="s", label="held-out greedy accuracy")
        for s, a in evals:
            ax.annotate(f"{100 * a:.1f}%", (s, a), textcoords="offset points", xytext=(0, 7), ha="center",
                        fontsize=8, color="tab:red")
    values = rewards + [a for _, a in evals]
    if values and 0.0 <= min(values) and max(values) <= 1.0:
        ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)
