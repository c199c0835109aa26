"""Live logging: the run's metrics to TensorBoard, trackio and wandb, each through its own API, and the completions
table (``--log-completions``).

Every row :class:`~rlzoo.trainer.metrics.MetricsLogger` appends to ``metrics.jsonl`` goes to each tracker with the
same names (``reward``, ``rewards/NAME/mean``, ``clip_ratio/region_mean``, ``eval/accuracy``, ...: TRL's names, so
dashboards carry over) at the row's optimizer step:

- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package) into
  ``OUTPUT_DIR/tensorboard/`` (``tensorboard --logdir OUTPUT_DIR/tensorboard``);
- ``trackio``: ``trackio.init`` / ``log`` / ``finish``, local (``TRACKIO_DIR``, default
  ``~/.cache/huggingface/trackio``; ``trackio show`` opens the dashboard);
- ``wandb``: ``wandb.init`` / ``log`` / ``finish``, files under ``OUTPUT_DIR/wandb``; ``WANDB_MODE=offline``
  works without an account (``wandb sync`` uploads later).

The project is ``--project`` (TRL's ``project``), else for wandb ``$WANDB_PROJECT`` (as transformers), else ``rlzoo``.

Each timeline of a run is one tracker run (:class:`Trackers`): a resume continues it, a fresh start, ``--overwrite``
or a resume from before the trackers' last step starts a new one.

The completions table (:class:`CompletionLog`), as TRL 1.16 logs it: per generation batch, one row per completion
with ``step``, ``prompt`` (the text the model was given), ``completion``, each reward function's value, the columns
reward functions added with ``log_extra``, and ``advantage``; written to
``OUTPUT_DIR/completions/step-NNNNNN.parquet`` and logged to trackio and wandb as a table (to TensorBoard as text).
"""

import importlib
import io
import json
import logging
import math
import numbers
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.trainer.config import TrackingConfig
from rlzoo.trainer.distributed import ONE_PROCESS, Distributed
from rlzoo.trainer.io import atomic_write_bytes, atomic_write_text
from rlzoo.trainer.rollout import Rollout

__all__ = ["CompletionLog", "Trackers"]

log = logging.getLogger("rlzoo.train")



class Trackers:
    """The run's trackers (``--report-to``), started with the run and closed at its end.

    Each timeline of the run is one tracker run, identified by an id recorded in ``OUTPUT_DIR/trackers.json``
    (written atomically; ``--overwrite`` deletes it with the run):

    - a fresh run (step 0, or ``--overwrite``) gets a new id;
    - a resume continues the recorded tracker run when the trackers have logged nothing after the resumed step
      (e.g. after SIGTERM, or a kill right after a checkpoint);
    - a resume from a step before the trackers' last one (an older checkpoint, or a kill between checkpoints)
      is a new timeline: a new tracker run (wandb would drop every step up to its last one, trackio would hold
      the steps twice); the old tracker run keeps the abandoned steps. TensorBoard keeps one directory and
      drops the events after the resumed step instead.

    Names: ``--run-name``, default ``PARENT/DIR`` of the output directory (``exp1/seed0``): both wandb and trackio
    show that name, and group a run's timelines under it. wandb's run id is the timeline's id; trackio (>= 0.24:
    runs of one name have their own ids) gives each run an id of its own, recorded as ``trackio_id`` beside the
    run's name (``trackio_name``). A resume continues the newest trackio run of the recorded name when it is the
    recorded one; when another run of the same name was started since (two directories given one
    ``--run-name``), the timeline goes on in a new trackio run instead of being mixed into that one (a warning
    says so). A record written before trackio runs had ids (no ``trackio_id``: rlzoo named the run
    ``NAME-ID``, ID the timeline's) continues that run by its name (``resume="must"``), or starts a new one with
    a warning when the trackio store does not hold it.

    Args:
        config: the tracking section (``report_to``, ``run_name``).
        output_dir: the run directory (TensorBoard and wandb write under it, and ``trackers.json``).
        settings: the run's config, recorded by trackio and wandb.

    Raises (at :meth:`open`):
        ImportError: a tracker whose package is not installed (names the extra to install).
        ValueError: wandb cannot start (not logged in and no ``WANDB_MODE=offline``); :meth:`check` finds this
            before the model loads.
    """

    RECORD = "trackers.json"
    """The file (in the run directory) that holds the current timeline's tracker run."""

    def __init__(self, config: TrackingConfig, *, output_dir: str | Path, settings: Mapping[str, Any]) -> None:
        self.names = config.trackers
        self.projects = {name: config.project_of(name) for name in ("trackio", "wandb")}
        self.output_dir = Path(output_dir)
        where = self.output_dir.absolute()
        self.run_name = config.run_name or f"{where.parent.name}/{where.name}".lstrip("/")
        self.settings = dict(settings)
        self.run_id: str | None = None
        self._continues = False  # this start continues the recorded timeline
        self._moved: set[str] = set()  # trackers whose project changed since the recorded timeline's last segment
        self._record: dict[str, Any] = {}
        self._tensorboard: Any = None
        self._trackio: Any = None
        self._wandb: Any = None

    @staticmethod
    def check(config: TrackingConfig) -> None:
        """Check, before anything heavy loads, that every tracker of ``config`` can start: its package imports,
        and wandb has credentials or runs offline (in a terminal, wandb asks for them here, as ``wandb.init``
        would; elsewhere its "no API key" is an error now instead of after the model loaded).

        Raises:
            ImportError: a tracker's package is not installed (names the extra).
            ValueError: wandb online without credentials where it cannot ask (names ``wandb login``,
                ``WANDB_API_KEY`` and ``WANDB_MODE=offline``).
        """
        for name in config.trackers:
            module = {"tensorboard": "torch.utils.tensorboard"}.get(name, name)
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise _missing(name) from err
        if "wandb" in config.trackers:
            import wandb

            if wandb.setup().settings.mode in ("offline", "dryrun", "disabled"):
                return
            try:
                wandb.login(verify=False)  # what wandb.init does first; no network with verify=False
            except wandb.errors.UsageError as err:
                raise _wandb_error(err) from None

    def open(self, step: int) -> None:
        """Start every tracker at ``step`` (0: a fresh run; else a resume, see the class docstring). If one
        cannot start, those already started are closed.

        Raises:
            ImportError, ValueError: see the class docstring.
        """
        if {"trackio", "wandb"} & set(self.names):
            self._begin_timeline(step)
        try:
            for name in self.names:
                try:
                    getattr(self, f"_open_{name}")(step)
                except ImportError as err:
                    raise _missing(name) from err
        except BaseException:
            self.close()
            raise

    def _begin_timeline(self, step: int) -> None:
        """Choose the tracker run of this timeline (continue the recorded one or start a new one) and record it."""
        path = self.output_dir / self.RECORD
        try:
            record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError):
            record = {}
        record = record if isinstance(record, dict) else {}
        last = record.get("step")
        self._continues = step > 0 and isinstance(record.get("id"), str) and isinstance(last, int) and last <= step
        if self._continues:
            self._record = dict(record)
            log.info("trackers: continuing tracker run %s at step %d", record["id"], step)
            moved = {t: (record["projects"].get(t), p) for t, p in self.projects.items()
                     if isinstance(record.get("projects"), dict) and record["projects"].get(t) not in (None, p)}
            self._moved = set(moved)
            for tracker, (before, now) in moved.items():  # --project or $WANDB_PROJECT changed since the last segment
                log.warning("trackers: the %s project is now %r, not %r as before: this timeline goes on in a new %s "
                            "run of project %r", tracker, now, before, tracker, now)
        else:
            if step > 0 and isinstance(last, int):
                log.warning("trackers: resumed at step %d, but tracker run %s already holds steps up to %d; this "
                            "timeline is logged as a new tracker run (the old one keeps the abandoned steps)",
                            step, record.get("id"), last)
            self._record = {"id": uuid.uuid4().hex[:8], "start_step": step, "step": step}
        self.run_id = self._record["id"]
        self._record["projects"] = {t: p for t, p in self.projects.items() if t in self.names}
        self._write_record()

    def _write_record(self) -> None:
        atomic_write_text(self.output_dir / self.RECORD, json.dumps(self._record, sort_keys=True) + "\n")

    def _logged(self, step: int) -> None:
        """Note that the trackers hold ``step`` (the record is rewritten when it moves forward)."""
        if self.run_id is not None and step > self._record["step"]:
            self._record["step"] = step
            self._write_record()

    def _open_tensorboard(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run drops the events a longer, abandoned timeline wrote after its checkpoint
        self._tensorboard = SummaryWriter(log_dir=str(self.output_dir / "tensorboard"), purge_step=step + 1)

    def _open_trackio(self, step: int) -> None:
        import trackio

        def start(name: str, resume: str) -> Any:
            return trackio.init(project=self.projects["trackio"], name=name, group=self.run_name, config=self.settings,
                                resume=resume, auto_log_gpu=False, auto_log_cpu=False, embed=False)

        recorded = self._record.get("trackio_id")
        name = self._record.get("trackio_name") or self.run_name
        if "trackio" in self._moved:  # another project (said): a new trackio run there
            self._trackio = start(self.run_name, "never")
        elif self._continues and not recorded:  # recorded before trackio runs had ids: the run is named NAME-ID
            name = f"{self.run_name}-{self.run_id}"
            try:
                self._trackio = start(name, "must")
            except ValueError:  # trackio has no run of that name (the store moved or was cleared)
                log.warning("trackers: trackers.json records trackio run %r, which the trackio store does not hold; "
                            "this timeline goes on in a new trackio run", name)
                self._trackio = start(self.run_name, "never")
        else:
            self._trackio = start(name, "allow" if self._continues else "never")
        if self._continues and recorded and self._trackio.id != recorded and "trackio" not in self._moved:
            log.warning("trackers: the newest trackio run named %r is not this timeline's (%s): another run uses the "
                        "same --run-name, or the trackio store moved; this timeline goes on in a new trackio run",
                        name, recorded)
            self._trackio.finish()
            self._trackio = start(self.run_name, "never")
        if (self._trackio.id, self._trackio.name) != (recorded, self._record.get("trackio_name")):
            self._record.update(trackio_id=self._trackio.id, trackio_name=self._trackio.name)
            self._write_record()

    def _open_wandb(self, step: int) -> None:
        import wandb

        try:
            self._wandb = wandb.init(project=self.projects["wandb"], name=self.run_name, group=self.run_name, id=self.run_id,
                                     resume="allow" if step > 0 else None, config=self.settings,
                                     dir=str(self.output_dir))
        except wandb.errors.UsageError as err:
            raise _wandb_error(err) from None

    def log(self, row: Mapping[str, Any]) -> None:
        """Log a metrics row's finite numbers at its ``step``."""
        step = int(row["step"])
        values = {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, numbers.Real)
                  and not isinstance(v, bool) and math.isfinite(v)}
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        if self._trackio is not None:
            self._trackio.log(values, step=step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        self._logged(step)

    def log_table(self, name: str, columns: Mapping[str, Sequence[Any]], step: int) -> None:
        """Log a table (column name -> values): a trackio / wandb table, a markdown table as TensorBoard text."""
        if self._tensorboard is not None:
            header = list(columns)
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            for values in zip(*columns.values(), strict=True):
                lines.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in values) + " |")
            self._tensorboard.add_text(name, "\n".join(lines), global_step=step)
            self._tensorboard.flush()
        rows = [list(values) for values in zip(*columns.values(), strict=True)]
        if self._trackio is not None:
            import trackio

            self._trackio.log({name: trackio.Table(columns=list(columns), data=_plain(rows))}, step=step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Table(columns=list(columns), data=_plain(rows))}, step=step)
        self._logged(step)

    def close(self) -> None:
        """Finish every tracker (idempotent)."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._trackio is not None:
            self._trackio.finish()
            self._trackio = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _missing(name: str) -> ImportError:
    return ImportError(f"--report-to {name} needs the {name} package: pip install 'rlzoo[{name}]' "
                       f"(or pip install {name})")


def _wandb_error(err: Exception) -> ValueError:
    return ValueError(f"--report-to wandb cannot start: {str(err).splitlines()[0]} Log in with `wandb login` or "
                      "WANDB_API_KEY, or run offline with WANDB_MODE=offline (wandb sync uploads later)")


def _plain(rows: list[list[Any]]) -> list[list[Any]]:
    """Table cells as trackers take them: message lists and other containers as text."""
    return [[v if isinstance(v, (str, int, float, bool)) or v is None else str(v) for v in row] for row in rows]


class CompletionLog:
    """Writes each generation batch's completions table (see the module docstring).

    Args:
        output_dir: the run directory (tables go to ``completions/``).
        tokenizer: decodes the prompts.
        reward_names: the reward functions' names (one column each).
        trackers: also log the table there, or None.
        dist: the process group (each rank records its share; rank 0 writes them all).

    Raises:
        ValueError: a reward function named as one of :attr:`OWN_COLUMNS`.
    """

    OWN_COLUMNS = ("step", "prompt", "completion", "advantage")
    """The table's columns besides one per reward function (a ``log_extra`` column may not be named as one)."""

    def __init__(self, output_dir: str | Path, *, tokenizer: Any, reward_names: Sequence[str],
                 trackers: Trackers | None = None, dist: Distributed = ONE_PROCESS) -> None:
        taken = [name for name in reward_names if name in self.OWN_COLUMNS]
        if taken:  # its rewards' column would be replaced by the table's own
            raise ValueError(f"reward function {taken[0]!r} is named as a column of the completions table "
                             f"({', '.join(self.OWN_COLUMNS)}), which would replace its rewards there: rename it")
        self.directory = Path(output_dir) / "completions"
        self.tokenizer = tokenizer
        self.reward_names = tuple(reward_names)
        self.trackers = trackers
        self.dist = dist
        self._as_text: set[str] = set()  # log_extra columns written as text (said once each)

    def table(self, step: int, rollout: Rollout, *,
              extra: Mapping[str, Sequence[Any]] | None = None) -> dict[str, list[Any]]:
        """The table of one generation batch (column -> one value per completion).

        Args:
            step: the optimizer step that trains on the batch.
            rollout: the generation batch (completions, rewards, advantages).
            extra: ``log_extra`` columns, one value per completion of ``rollout``, in its order (None past the end of
                a shorter list).
        """
        prompts = [self.tokenizer.decode(ids[mask], skip_special_tokens=False)
                   for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask, strict=True)]
        n = rollout.num_completions
        table: dict[str, list[Any]] = {"step": [step] * n, "prompt": [prompts[int(i)] for i in rollout.group_index],
                                       "completion": list(rollout.texts)}
        for k, name in enumerate(self.reward_names):
            table[name] = [None if math.isnan(v) else v for v in rollout.rewards[:, k].tolist()]
        for column, values in (extra or {}).items():
            table[column] = [values[r] if r < len(values) else None for r in range(n)]
        advantages = rollout.advantages
        if advantages.ndim == 2:  # token-level estimators: the mean over the completion's tokens
            mask = rollout.completion_mask.to(advantages.dtype)
            advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        table["advantage"] = advantages.tolist()
        return table

    def _one_type(self, column: str, values: list[Any]) -> list[Any]:
        """A ``log_extra`` column's ``values``, or their text (None kept) when ``datasets`` cannot make one column of
        them (``[1, "n/a"]``: pyarrow's "Expected bytes, got a 'int' object" stopped the run), with a warning, once per
        column; a column once written as text stays text (every step's table has the same type)."""
        import datasets
        import pyarrow as pa

        if column not in self._as_text:
            try:
                datasets.Dataset.from_dict({column: values})  # its conversions: tensors, arrays, images
                return values
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._as_text.add(column)
                log.warning("the log_extra column %r holds values of several types; the completions table holds "
                            "their text", column)
        return [None if v is None else str(v) for v in values]

    def record(self, step: int, rollout: Rollout, *,
               extra: Mapping[str, Sequence[Any]] | None = None) -> Path | None:
        """Write the table of a generation batch (:meth:`table`) to ``completions/step-NNNNNN.parquet``
        (atomically) and to the trackers; returns the file. Under torchrun every rank calls it with its share:
        rank 0 writes every rank's rows (in rank order) and returns the file, the others None.

        Raises:
            OSError: the write failed.
        """
        import datasets

        table = self.table(step, rollout, extra=extra)
        if self.dist.enabled:
            shares = self.dist.all_gather_object(table)
            if not self.dist.is_main:
                return None
            n = [len(t["step"]) for t in shares]
            columns = list(dict.fromkeys(c for t in shares for c in t))  # a log_extra column of some ranks only
            table = {c: [v for t, k in zip(shares, n, strict=True) for v in t.get(c, [None] * k)] for c in columns}
        table = {c: v if c in self.OWN_COLUMNS or c in self.reward_names else self._one_type(c, v)
                 for c, v in table.items()}
        buffer = io.BytesIO()
        datasets.Dataset.from_dict(table).to_parquet(buffer)
        path = self.directory / f"step-{step:06d}.parquet"
        atomic_write_bytes(path, buffer.getvalue())
        if self.trackers is not None:
            self.trackers.log_table("completions", table, step)
        return path
