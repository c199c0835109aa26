"""The run's metrics: the loss metrics of an optimizer step, the append-only ``metrics.jsonl`` with the console
log and progress bar, and the plot."""

import contextlib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxtyping import Bool
from torch import Tensor

from rlzoo.batch import LossOutput
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.io import append_line, atomic_write_text, json_row
from rlzoo.trainer.plots import plot_metrics
from rlzoo.trainer.trackers import Trackers

__all__ = ["LossMetrics", "MetricsLogger", "has_row", "plot_metrics", "read_metrics", "write_metrics"]

log = logging.getLogger("rlzoo.train")

_MIN, _MAX = ("/min", "_min"), ("/max", "_max")  # suffixes of metrics merged by min / max (TRL's and verl's names)


class LossMetrics:
    """The loss and loss metrics of one optimizer step, accumulated over its micro-batches (:meth:`add`) and merged
    over them and the ranks (:meth:`reduce`, after which :attr:`metrics` holds them).

    ``loss`` is the sum of the micro-batch losses (each normalised by the whole step's ``normalizer``, so the
    sum is the full-batch loss). Each metric is taken over some tokens of a micro-batch: its completion tokens, or
    the count the loss gives in :attr:`~rlzoo.LossOutput.metric_tokens` (under a rollout rejection, the policy
    term's are over the kept tokens). Metrics ending in ``/min`` or ``_min`` and ``/max`` or ``_max`` (verl's
    ``rollout_corr/rollout_is_max``) are merged by min / max over the micro-batches and ranks with such a token
    (0 when none has one, as a loss reports them), the others weighted by each micro-batch's share of the step's
    tokens of that metric.
    """

    def __init__(self) -> None:
        self.loss = 0.0
        self.metrics: dict[str, float] = {}
        self._seen: dict[str, list[tuple[float, float]]] = {}  # per metric: (tokens, value) of each micro-batch

    def add(self, out: LossOutput, loss_mask: Bool[Tensor, "N C"]) -> None:
        """Fold one micro-batch's :class:`~rlzoo.LossOutput` in (``loss_mask``: its completion tokens)."""
        self.loss += float(out.loss.detach())
        completion_tokens = float(loss_mask.sum())
        for key, value in out.metrics.items():
            tokens = out.metric_tokens.get(key)
            self._seen.setdefault(key, []).append((completion_tokens if tokens is None else float(tokens),
                                                   float(value)))

    def reduce(self, dist: Distributed) -> float:
        """Merge the metrics over the micro-batches and ranks into :attr:`metrics` and sum the loss over the ranks
        (each rank's loss is already divided by the global counts, so the sum is the global loss); returns it."""
        totals = {f"tokens:{k}": sum(tokens for tokens, _ in seen) for k, seen in self._seen.items()}
        if dist.enabled:
            totals = dist.reduce_floats({"loss": self.loss, **totals})
            self.loss = totals["loss"]
        merged: dict[str, dict[str, float]] = {"sum": {}, "min": {}, "max": {}}
        for key, seen in self._seen.items():
            counted = [value for tokens, value in seen if tokens]  # a micro-batch without a token: placeholders
            if key.endswith(_MIN):
                merged["min"][key] = min(counted, default=math.inf)
            elif key.endswith(_MAX):
                merged["max"][key] = max(counted, default=-math.inf)
            else:
                total, mean = max(1.0, totals[f"tokens:{key}"]), 0.0
                for tokens, value in seen:
                    mean += tokens / total * value
                merged["sum"][key] = mean
        for op, values in merged.items():
            if dist.enabled:
                values = dist.reduce_floats(values, op)
            # no micro-batch of any rank with a token for an extreme: 0, as one process reports it
            self.metrics.update({k: v if op == "sum" or totals[f"tokens:{k}"] else 0.0 for k, v in values.items()})
        return self.loss


def read_metrics(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], bool]:
    """The rows of a ``metrics.jsonl`` (none if it does not exist) and whether its last line was torn (a kill
    during its write: not valid JSON or no final newline), in which case that line is left out.

    Raises:
        ValueError: a line other than the last is not a JSON object (names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        return [], False
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete, last = lines[:-1], lines[-1]  # ``last`` is "" when the file ends with a newline
    rows: list[dict[str, Any]] = []
    torn = bool(last)
    for lineno, line in enumerate(complete, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if lineno == len(complete) and not last:
                torn = True
                break
            raise ValueError(f"{path}:{lineno}: not a JSON object; metrics.jsonl is damaged")
        rows.append(row)
    return rows, torn


def has_row(path: str | os.PathLike[str], step: int) -> bool:
    """Whether the ``metrics.jsonl`` at ``path`` holds a row of ``step`` (a torn last line does not count).

    Raises:
        ValueError: from :func:`read_metrics`.
    """
    return any(row.get("step") == step for row in read_metrics(path)[0])


def write_metrics(path: str | os.PathLike[str], rows: list[Mapping[str, Any]]) -> None:
    """Replace ``path`` atomically with ``rows``, one JSON object a line."""
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


class MetricsLogger:
    """``metrics.jsonl`` (one JSON object appended per optimizer step, and one for the step-0 evaluation), the
    console log line of each step, the progress bar, and ``reward.png``.

    Args:
        output_dir: the run directory.
        max_steps: the run's length (for the log line and the bar).
        progress: show a live progress bar (tqdm) when stderr is a terminal (not into a file or pipe).
        writes: this process writes the file, log, bar and trackers (rank 0 under torchrun; the others only keep
            the history in memory).
        trackers: the live trackers every row also goes to (``--report-to``), or None.
        title: the plot's title (model, task, algorithm).
    """

    def __init__(self, output_dir: str | os.PathLike[str], *, max_steps: int, progress: bool,
                 writes: bool = True, trackers: Trackers | None = None, title: str | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.max_steps = max_steps
        self.progress = progress
        self.writes = writes
        self.trackers = trackers if writes else None
        self.title = title
        self.history: list[dict[str, Any]] = []
        self._bar: Any = None
        self._redirect: contextlib.ExitStack | None = None

    @property
    def path(self) -> Path:
        """``OUTPUT_DIR/metrics.jsonl``."""
        return self.output_dir / "metrics.jsonl"

    def open(self, step: int, previous: list[dict[str, Any]] | None = None, *, row_due: bool = False) -> None:
        """Start logging at ``step``: read the rows already in the file (a torn last line is repaired) or
        write ``previous`` (the rows of the run a checkpoint came from), then start the progress bar (at
        ``step - 1`` when ``row_due``: the resumed checkpoint's step has no row yet, and writing it advances the bar).

        Raises:
            ValueError: from :func:`read_metrics`.
        """
        rows, torn = read_metrics(self.path)
        if torn and self.writes:
            log.warning("%s: its last line was cut off (a kill while it was written); rewritten without it (the "
                        "step it belonged to is logged again when it is redone)", self.path)
        if previous is not None and not rows:
            rows, torn = list(previous), True
        if torn:
            write_metrics(self.path, rows)
        self.history = rows
        if self.trackers is not None:
            self.trackers.open(step)
        if self.progress:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(total=self.max_steps, initial=step - row_due, desc="train", unit="step",
                             dynamic_ncols=True, disable=None)  # on a terminal only: not into a log file
            self._redirect = contextlib.ExitStack()
            self._redirect.enter_context(logging_redirect_tqdm())  # records print once, above the bar

    def announce(self, row: Mapping[str, Any]) -> None:
        """Log a training step's line and advance the progress bar (rank 0), before its evaluation runs and
        :meth:`write` appends its row: the step is done, and an evaluation can take minutes."""
        if "loss" not in row or not self.writes:
            return
        reward = math.nan if row["reward"] is None else row["reward"]  # null: no completion scored (NaN)
        log.info("step %d/%d loss %+.4f reward %.3f len %.1f %.1fs", row["step"], self.max_steps, row["loss"],
                 reward, row["completions/mean_length"], row["step_time"])
        if self._bar is not None:
            self._postfix(row)
            self._bar.update(1)

    def _postfix(self, row: Mapping[str, Any]) -> None:
        assert self._bar is not None
        postfix = {"reward": f"{math.nan if row['reward'] is None else row['reward']:.3f}",
                   "step_s": f"{row['step_time']:.1f}"}
        accuracy = next((r["eval/accuracy"] for r in reversed([*self.history, row])
                         if r.get("eval/accuracy") is not None), None)
        if accuracy is not None:
            postfix["acc"] = f"{100 * accuracy:.1f}%"
        self._bar.set_postfix(postfix)

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row (a training step's is announced first, :meth:`announce`; its evaluation's accuracy
        joins the progress bar here).

        Raises:
            OSError: the write failed (disk full names the file).
        """
        row = json_row(row)
        if self.writes:
            append_line(self.path, json.dumps(row, sort_keys=True))
        self.history.append(row)
        if self.trackers is not None:
            self.trackers.log(row)
        if self._bar is not None and "loss" in row and self.writes and row.get("eval/accuracy") is not None:
            self._postfix(row)

    def plot(self) -> Path:
        """Write ``reward.png`` (:func:`~rlzoo.trainer.plots.plot_metrics`; rank 0 only). A write that fails (a full
        disk) is a warning: the plot is redrawn from the history at the next periodic checkpoint or the run's end, and
        the run (or the exit code of a stop by a signal, 130 / 143, that requeue scripts read) does not depend on it."""
        path = self.output_dir / "reward.png"
        try:
            return plot_metrics(self.history, path, title=self.title) if self.writes else path
        except OSError as err:
            log.warning("could not write the plot %s: %s", path, err)
            return path

    def close(self) -> None:
        """Close the progress bar and the trackers (the file is closed after every write)."""
        if self.trackers is not None:
            self.trackers.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.close()
            self._redirect = None
