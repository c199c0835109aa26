"""The run directory and the rules that keep it safe over days-long runs.

- One run per directory (:mod:`~rlzoo.trainer.run_lock`): a lock file (``.rlzoo.lock``, holding pid and host)
  held with ``fcntl.flock`` for the whole run; the kernel drops it when the process dies, so a stale lock (a killed
  run) is taken over with a warning, and a live one refuses the second run before its files are read.
- Nothing is written inside another run's own files (:func:`inside_a_run`): its checkpoints, ``abandoned/``, ...
- A fresh run (no ``--resume``) never starts in a directory that holds a run: it is refused, naming
  ``--resume`` and ``--overwrite``; ``--overwrite`` deletes that run's files first (and only those). A resume
  of this directory's run (``latest``, ``auto``, one of its checkpoints) with ``--overwrite`` is refused: the
  two contradict each other.
- ``--resume auto`` in a directory without a checkpoint starts fresh; what an earlier start that wrote no
  checkpoint left (its config and metrics) moves to ``abandoned/no-checkpoint-TIMESTAMP/``.
- At start, what interrupted atomic writes of the run's own files left is cleaned up
  (:func:`rlzoo.trainer.io.recover_interrupted_writes`; a user's own ``.NAME.old`` or ``.NAME.tmp`` is not touched).
- Resuming from a checkpoint older than the run's newest work starts a new timeline: the newer checkpoints and
  metrics rows move to ``abandoned/AFTER-STEP-N-TIMESTAMP/`` (nothing is deleted), so ``--resume latest``
  never picks them again.
- ``config.json`` holds the current settings and, under ``segments``, what each segment of the run used.
"""

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.checkpoint import is_run_config, no_checkpoint_message, step_of
from rlzoo.trainer.io import atomic_write_text, check_writable, recover_interrupted_writes
from rlzoo.trainer.metrics import read_metrics, write_metrics
from rlzoo.trainer.run_lock import LOCK_FILE, RunLockedError, hold_lock, refuse_a_live_run

__all__ = ["LOCK_FILE", "RUN_FILES", "RunDirectory", "RunLockedError", "default_output_dir", "inside_a_run",
           "timeline_rows"]

log = logging.getLogger("rlzoo.train")

RUN_FILES = ("config.json", "metrics.jsonl", "reward.png", "checkpoints", "abandoned", "completions", "tensorboard",
             "wandb", "trackers.json")
"""What a run writes into its directory (``--overwrite`` deletes these and nothing else)."""
_COMPLETIONS = re.compile(r"step-\d+\.parquet")
"""A completions table of the run (``completions/step-NNNNNN.parquet``)."""
_TRACKER_FILES = {"tensorboard": re.compile(r"events\.out\.tfevents\..+"),
                  "wandb": re.compile(r"(offline-)?run-\d{8}_\d{6}-\w+(-\d+)?|latest-run|debug(-internal|-cli\.[\w.-]+)?\.log")}
"""What TensorBoard's SummaryWriter and wandb write into ``tensorboard/`` and ``wandb/`` (``--overwrite`` deletes
those, not a user's own files there); wandb adds ``-N`` to a run directory when a start in the same second made it."""


def _written_by_run(directory: str, path: Path) -> bool:
    """Whether ``path``, in the run's ``directory`` (checkpoints, completions, tensorboard, wandb), is the run's."""
    if directory in _TRACKER_FILES:
        return bool(_TRACKER_FILES[directory].fullmatch(path.name))
    return (step_of(path) is not None and path.is_dir()) or bool(_COMPLETIONS.fullmatch(path.name))


def inside_a_run(target: Path) -> tuple[str, Path] | None:
    """Where ``target`` (an absolute path) lies among a training run's own files: ``("is (inside) the checkpoints of
    the training run 'RUN'", RUN)`` or ``("is (inside) the rlzoo checkpoint 'CKPT'", CKPT)`` (one copied out of its
    run), or None. What is written there is deleted by that run's ``--overwrite``, pruning or new timeline, or
    misread by it: a run, an export or an evaluation result must not be written there. A run is known by its
    ``config.json`` (written at its start; not by any ``metrics.jsonl`` or ``checkpoints/``)."""
    for run in target.parents:
        inside = target.relative_to(run).parts[0]
        if (inside in RUN_FILES or inside == LOCK_FILE) and is_run_config(run / "config.json"):
            return f"is {'' if target.parent == run else 'inside '}the {inside} of the training run {str(run)!r}", run
    checkpoint = next((d for d in (target, *target.parents)
                       if (d / "trainer_state.json").is_file() and (d / "model").is_dir()), None)
    if checkpoint is None:
        return None
    return f"is {'' if checkpoint == target else 'inside '}the rlzoo checkpoint {str(checkpoint)!r}", checkpoint


class RunDirectory:
    """A run's output directory.

    Args:
        path: the directory (created if needed).
        overwrite: a fresh start may delete the run already there.
        resume: the run continues from a checkpoint (``latest``, ``auto`` or a path), so the run already there
            is its own (``auto``: if the directory holds a checkpoint).
    """

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False, resume: str | None = None) -> None:
        self.path = Path(path)
        self.overwrite = overwrite
        self.resume = resume
        self._locked = False  # this object holds the directory's lock (:meth:`lock`)

    @property
    def checkpoints(self) -> Path:
        """``PATH/checkpoints``."""
        return self.path / "checkpoints"

    @property
    def metrics(self) -> Path:
        """``PATH/metrics.jsonl``."""
        return self.path / "metrics.jsonl"

    @property
    def starts_fresh(self) -> bool:
        """Whether what the directory holds is not this run's past: no ``--resume``, ``--resume auto`` without a
        checkpoint here, or a checkpoint from outside this directory's ``checkpoints/`` (a new run forked from
        another run)."""
        if self.resume == "auto":
            return not any(p.is_dir() and step_of(p) is not None
                           for p in (self.checkpoints.iterdir() if self.checkpoints.is_dir() else []))
        return not self.resumes_own_run

    @property
    def resumes_own_run(self) -> bool:
        """Whether ``resume`` names this directory's checkpoints: ``latest``, ``auto``, or a path under
        ``checkpoints/``."""
        if self.resume is None:
            return False
        if self.resume in ("latest", "auto"):
            return True
        return self.checkpoints.resolve() in Path(self.resume).resolve().parents

    def holds_run(self) -> bool:
        """Whether a run has written into the directory (its config, metrics or checkpoints; a Hugging Face
        model's ``config.json`` is not a run's, :func:`~rlzoo.trainer.checkpoint.is_run_config`, nor a
        ``checkpoints/`` directory without an rlzoo checkpoint)."""
        return ((self.path / "metrics.jsonl").exists() or self._may_hold_a_checkpoint()
                or is_run_config(self.path / "config.json"))

    def _resume_inside(self) -> bool:
        """Whether ``resume`` is a path inside this directory (``--overwrite`` would delete it)."""
        if self.resume in (None, "latest", "auto"):
            return False
        return self.path.resolve() in Path(self.resume).resolve().parents

    def _resumes_abandoned(self) -> bool:
        """Whether ``resume`` is a checkpoint of a timeline of this directory's run that a resume abandoned."""
        return self._resume_inside() and (self.path / "abandoned").resolve() in Path(self.resume).resolve().parents

    def check(self) -> None:
        """Fail fast, before anything heavy is loaded: the directory must be writable, and a fresh run must not
        land on another run.

        Raises:
            OSError: the directory cannot be created or written (names it).
            RunLockedError: another live run holds the directory.
            FileExistsError: a fresh run into a directory that holds a run (names --resume and --overwrite); a
                directory whose ``config.json`` is not an rlzoo run's (a model's).
            ValueError: a directory inside another run's own files (its checkpoints, metrics, ...: names the run);
                ``--overwrite`` with a resume of this directory's run or of a checkpoint inside it (names
                both); a resume in place of a checkpoint of this run's abandoned timeline (says how to fork it).
        """
        if not self._locked:  # what a live run has written so far is no stopped run's: refused as live first
            refuse_a_live_run(self.path)
        inside = inside_a_run(self.path.resolve())
        if inside is not None:
            where, owner = inside
            why = ("a run there would be mixed with the checkpoint's files" if (owner / "trainer_state.json").is_file()
                   else "that run's --overwrite, pruning or next timeline would delete a run there")
            hint = ""
            if (self.path / "trainer_state.json").is_file():  # a checkpoint: what was meant, probably
                hint = (f"; to continue that run from it: --output-dir {owner} --resume {self.path}"
                        if self.path.resolve().parent == (owner / "checkpoints").resolve() else
                        f"; to start a new run from it: --output-dir NEW --resume {self.path}")
            raise ValueError(f"--output-dir {self.path} {where}: {why}; choose a directory outside it{hint}")
        if self.overwrite and (self.resumes_own_run or self._resume_inside()):
            raise ValueError(f"--overwrite and --resume {self.resume} contradict each other: --resume continues the run "
                             f"in {self.path}, --overwrite would delete it; drop one of them")
        if self._resumes_abandoned():
            raise ValueError(f"--resume {self.resume} is a checkpoint of a timeline of the run in {self.path} that a "
                             "resume from an earlier step abandoned; continue it as a new run in another directory: "
                             f"--output-dir NEW --resume {self.resume} (its metrics up to that step are copied)")
        if self.resume == "latest" and not self._may_hold_a_checkpoint():  # (a moved-aside one is put back later)
            raise FileNotFoundError(no_checkpoint_message(self.checkpoints))
        check_writable(self.path, "output directory")  # nothing created: a run refused later leaves no directory
        config = self.path / "config.json"
        if config.is_file() and not is_run_config(config):
            raise FileExistsError(f"output directory {self.path} holds a config.json that is not an rlzoo run's (a "
                                  "model's?), which the run would replace; choose another --output-dir")
        if self.starts_fresh and not self.overwrite and self.resume != "auto" and self.holds_run():
            if not self._may_hold_a_checkpoint():  # nothing to continue: --resume latest would fail
                auto = "" if self.resume is not None else "--resume auto (keeps its files under abandoned/) or "
                raise FileExistsError(  # (a fork from another run's checkpoint keeps its --resume: no auto there)
                    f"output directory {self.path} holds a start that wrote no checkpoint (it stopped before its "
                    f"first); start over with {auto}--overwrite (deletes them), or choose another --output-dir")
            raise FileExistsError(
                f"output directory {self.path} already holds a run; continue it with --resume latest, or start "
                "over with --overwrite (deletes that run's files: checkpoints, metrics, plots, completions, ...; not "
                "yours), or choose another --output-dir"
            )

    def _may_hold_a_checkpoint(self) -> bool:
        """Whether ``checkpoints/`` holds a checkpoint (``step-N/``), or one an interrupted re-save moved aside
        (``.step-N.old/``)."""
        return self.checkpoints.is_dir() and any(
            p.is_dir() and (step_of(p) is not None or (p.name.endswith(".old") and step_of(Path(p.name[1:-4]))
                                                        is not None)) for p in self.checkpoints.iterdir())

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory's run lock (:func:`~rlzoo.trainer.run_lock.hold_lock`) for the duration of the block
        (the trainer then runs :meth:`check` again: a fresh run started in the directory between its first check
        and the lock, during a model load of minutes, is refused instead of mixed with this one).

        Raises:
            RunLockedError: another live process holds it (names pid and host).
        """
        with hold_lock(self.path):
            self._locked = True
            try:
                yield
            finally:
                self._locked = False

    def prepare(self) -> None:
        """Under the lock: clean up after interrupted writes (temporaries; a checkpoint moved aside between two
        renames is put back), then delete the old run (``--overwrite`` when :attr:`starts_fresh`), or under
        ``--resume auto`` without a checkpoint move what an earlier start left to ``abandoned/``."""
        is_step = lambda name: step_of(Path(name)) is not None
        is_table = lambda name: _COMPLETIONS.fullmatch(name) is not None
        for directory, names in ((self.path, RUN_FILES), (self.checkpoints, is_step),  # not a user's own .X.old
                                 (self.path / "completions", is_table)):
            for line in recover_interrupted_writes(directory, names):
                log.warning("%s", line)
        if not self.starts_fresh:
            return
        if self.overwrite and self.holds_run():
            self._delete_run()
        elif self.resume == "auto":
            self._set_aside_a_start_without_checkpoint()

    def _delete_run(self) -> None:
        """``--overwrite``: delete the run's files (:data:`RUN_FILES`), and of the names a user's own files could
        have (``checkpoints/``, ``completions/``, ``tensorboard/``, ``wandb/``) only what the run wrote: its
        checkpoints and completion tables, and a tracker's files (:data:`_TRACKER_FILES`) where its config.json
        names that tracker."""
        reported = _recorded_trackers(self.path / "config.json")
        for name in RUN_FILES:
            target = self.path / name
            if name in ("tensorboard", "wandb") and not ({name, "all"} & reported):
                continue
            if name in ("checkpoints", "completions", "tensorboard", "wandb"):  # the run's entries only
                ours = [p for p in (target.iterdir() if target.is_dir() else ()) if _written_by_run(name, p)]
                for path in ours:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                if ours and not any(target.iterdir()):
                    target.rmdir()
            elif target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def _set_aside_a_start_without_checkpoint(self) -> None:
        leftovers = [self.path / name for name in RUN_FILES
                     if name not in ("checkpoints", "abandoned") and (self.path / name).exists()]
        if not leftovers:
            return
        target = self.path / "abandoned" / f"no-checkpoint-{time.strftime('%Y%m%d-%H%M%S')}"
        target.mkdir(parents=True, exist_ok=True)
        for path in leftovers:
            os.replace(path, target / path.name)
        log.warning("--resume auto: no checkpoint in %s, starting fresh; what an earlier start left (%s) moved to %s",
                    self.path, ", ".join(p.name for p in leftovers), target)

    def abandon_after(self, step: int) -> Path | None:
        """Start a new timeline at ``step``: move the checkpoints, metrics rows and completions tables after it (work
        of the run this one resumes from an earlier point of) into ``abandoned/``; returns where, or None if there was
        nothing after ``step``. The abandoned directory is the old timeline whole: its ``metrics.jsonl`` holds
        every row (those up to ``step`` too) and its ``config.json`` the segments, so a later fork of one of its
        checkpoints finds them however many abandons follow (:func:`timeline_rows`)."""
        rows, _ = read_metrics(self.metrics)
        later_rows = [r for r in rows if r.get("step", 0) > step]
        later_checkpoints = [p for p in (self.checkpoints.iterdir() if self.checkpoints.is_dir() else [])
                             if p.is_dir() and (step_of(p) or 0) > step]
        tables = self.path / "completions"  # --log-completions: step-N.parquet, the table of step N's generation
        later_tables = [p for p in (tables.iterdir() if tables.is_dir() else [])
                        if p.is_file() and (step_of(p.with_suffix("")) or 0) > step]
        if not later_rows and not later_checkpoints and not later_tables:
            return None
        target = self.path / "abandoned" / f"after-step-{step:06d}-{time.strftime('%Y%m%d-%H%M%S')}"
        target.mkdir(parents=True, exist_ok=True)
        write_metrics(target / "metrics.jsonl", rows)
        if (self.path / "config.json").is_file():
            atomic_write_text(target / "config.json", (self.path / "config.json").read_text())
        if later_rows:
            write_metrics(self.metrics, [r for r in rows if r.get("step", 0) <= step])
        for checkpoint in later_checkpoints:
            (target / "checkpoints").mkdir(exist_ok=True)
            os.replace(checkpoint, target / "checkpoints" / checkpoint.name)
        for table in later_tables:
            (target / "completions").mkdir(exist_ok=True)
            os.replace(table, target / "completions" / table.name)
        log.warning("resumed at step %d: the later work of this run (%d checkpoints, %d metrics rows, %d completions "
                    "tables) moved to %s", step, len(later_checkpoints), len(later_rows), len(later_tables), target)
        return target

    def write_config(self, settings: Mapping[str, Any], resolved: Mapping[str, Any], *, start_step: int,
                     resumed_from: str | None, changes: Mapping[str, tuple[Any, Any]],
                     source: Path | None = None) -> None:
        """Write ``config.json``: the current ``settings`` and ``resolved`` values at the top level, and the list
        of segments (one per start or resume: its first step, checkpoint, changed settings and all settings),
        continued from this directory's ``config.json`` or else from ``source`` (the run a checkpoint came from),
        less those that started after ``start_step`` or resumed at it (their work is not on this timeline: the
        checkpoint at ``start_step`` was written before them)."""
        segments: list[Any] = []
        for candidate in (self.path / "config.json", source):
            if candidate is not None and candidate.is_file():
                with contextlib.suppress(ValueError, OSError):
                    segments = list(json.loads(candidate.read_text()).get("segments", []))
                break

        def later(s: Any) -> bool:  # (a segment of a hand-edited file without a step number is kept)
            step = s.get("start_step") if isinstance(s, Mapping) else None
            return isinstance(step, int) and (step > start_step or step == start_step and bool(s.get("resumed_from")))

        segments = [s for s in segments if not later(s)]
        segments.append({"start_step": start_step, "resumed_from": resumed_from,
                         "changes": {k: list(v) for k, v in changes.items()}, "settings": dict(settings),
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        payload = {**settings, **resolved, "segments": segments}
        atomic_write_text(self.path / "config.json", json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def default_output_dir(loss_name: str | None, task: str, *, python_dataset: bool) -> str:
    """``runs/ALGORITHM-DATA-TIMESTAMP-PID``, a run's directory without ``--output-dir``: ALGORITHM is the loss's
    name (``custom`` for a loss without one), DATA the task's name or data file's stem, or ``dataset`` for a data set
    given from Python (``python_dataset``; not the ``--task`` it replaces), PID this process's id (runs started in
    the same second, a sweep's seeds, got one directory: all but one were refused, advised to --overwrite it)."""
    data = "dataset" if python_dataset else Path(task).stem or task.replace("/", "-")
    return os.path.join("runs", f"{loss_name or 'custom'}-{data}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def timeline_rows(run: Path, step: int) -> list[dict[str, Any]]:
    """The metrics rows up to ``step`` of the timeline whose checkpoint a run forks from, ``run`` being where that
    checkpoint's run keeps them (:func:`~rlzoo.trainer.checkpoint.run_of`). An abandoned timeline
    (``RUN/abandoned/after-step-N-TIME/``, :meth:`RunDirectory.abandon_after`) holds all its rows beside its
    ``config.json``; one abandoned before that (no ``config.json``) holds the rows after step N only, and those up
    to N are read from ``RUN/metrics.jsonl`` (right unless a later resume went back before N)."""
    rows, _ = read_metrics(run / "metrics.jsonl")
    branch = _ABANDONED.match(run.name)
    if run.parent.name == "abandoned" and branch and not (run / "config.json").is_file():
        start = int(branch.group(1))
        shared, _ = read_metrics(run.parent.parent / "metrics.jsonl")
        rows = [r for r in shared if r.get("step", 0) <= start] + [r for r in rows if r.get("step", 0) > start]
    return [r for r in rows if r.get("step", 0) <= step]


_ABANDONED = re.compile(r"after-step-(\d+)-")


def _recorded_trackers(config: Path) -> set[str]:
    """The trackers a run's ``config.json`` names (``report_to`` of its settings and of every segment's)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict):
        return set()
    segments = [s.get("settings") for s in data.get("segments") or () if isinstance(s, dict)]
    values = [data.get("report_to"), *(s.get("report_to") for s in segments if isinstance(s, dict))]
    return {name.strip() for value in values if isinstance(value, str) for name in value.split(",")}
