"""The checkpointer: atomic checkpoints of a run, found by step number, pruned, loaded back exactly.

A checkpoint ``checkpoints/step-NNNNNN/`` holds:

- ``dcp/``: the model and optimizer state, written by every rank with ``torch.distributed.checkpoint`` (DCP:
  each rank its shards, resharded on load, so a checkpoint of 2 ranks resumes on 1 and the reverse);
- ``model/``: the consolidated Hugging Face model (safetensors, config, tokenizer) that
  ``AutoModelForCausalLM.from_pretrained`` and ``rlzoo eval --model`` load (for a LoRA run the adapter and the
  tokenizer, :mod:`rlzoo.trainer.adapters`);
- ``NAME.pt``: state shared by the ranks (the learning-rate schedule), and ``NAME-rankR.pt``: each rank's
  own (its generation cycle and unfinished batch, its RNGs);
- ``trainer_state.json``: the step, the world size and the run's settings; for a checkpoint written before its
  step's ``metrics.jsonl`` row (the run's last step, checkpointed before the final evaluation), that row's training
  metrics (``row``), so that a kill during the evaluation loses no row.

It is written into a temporary sibling (every rank writes into the one rank 0 made) and renamed into place
by rank 0 once all have written (:func:`rlzoo.trainer.io.atomic_dir`), so a kill never leaves half a
checkpoint.
"""

import contextlib
import dataclasses
import json
import logging
import random
import shutil
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlzoo.trainer.checkpoint_files import DamagedCheckpointError, reading, step_of
from rlzoo.trainer.config import CheckpointConfig
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.interrupts import interrupts_unwrapped
from rlzoo.trainer.io import atomic_dir, disk_full_is_os_error, json_row, save_pretrained_atomic
from rlzoo.trainer.parallel import ParallelModel

__all__ = ["Checkpoint", "Checkpointer", "DamagedCheckpointError", "is_run_config", "no_checkpoint_message",
           "rank_states", "rng_state", "run_of", "set_rng_state", "step_of"]

log = logging.getLogger("rlzoo.train")

def rng_state() -> dict[str, Any]:
    """The process's torch, CUDA and Python RNG states."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python": random.getstate()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`rng_state` (the CUDA states only where CUDA is available)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint (the model weights are already in the model).

    Attributes:
        path: its directory.
        step: optimizer steps it had taken.
        world_size: the number of ranks that wrote it.
        settings: the run's config (``TrainConfig.to_dict()``) when it was written.
        states: the shared states and this rank's own (``NAME-rankR.pt``; rank 0's when the world size
            changed), by name.
        row: the step's metrics row without its evaluation, for a checkpoint written before that row (else None).
    """

    path: Path
    step: int
    world_size: int
    settings: Mapping[str, Any]
    states: Mapping[str, Any]
    row: Mapping[str, Any] | None = None


def is_run_config(path: Path) -> bool:
    """Whether ``path`` is an rlzoo run's ``config.json`` (a JSON object with the run's ``max_steps`` or
    ``segments``), not a Hugging Face model's (``model_type``, ``architectures``, ...). A file that is not JSON
    counts as a run's: what is unknown is not overwritten."""
    if not path.is_file():
        return False
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return True
    return not isinstance(config, dict) or "segments" in config or "max_steps" in config


def no_checkpoint_message(checkpoints: Path) -> str:
    """The refusal of ``--resume latest`` where ``checkpoints`` (``RUN/checkpoints``) holds no checkpoint: what to
    do instead, ``--overwrite`` only where the directory holds a run to delete."""
    run = checkpoints.parent
    holds_run = (run / "metrics.jsonl").exists() or is_run_config(run / "config.json")
    instead = ("start over with --overwrite" if holds_run else
               f"drop --resume to start a new run{' there' if run.exists() else ''}")
    return (f"--resume latest: no checkpoint under {checkpoints}; pass --output-dir of the run, give --resume auto "
            f"(resume if there is a checkpoint, else start fresh), or {instead}")


def run_of(path: str | Path) -> Path:
    """The run directory holding the checkpoint ``path`` (``RUN/checkpoints/step-N`` -> ``RUN``, resolved): where
    that run's ``metrics.jsonl`` and ``config.json`` are."""
    return Path(path).resolve().parent.parent


class Checkpointer:
    """Writes, finds, prunes and loads the checkpoints under ``directory``.

    Args:
        config: the checkpoint section (``save_steps``, ``save_total_limit``, ``resume``).
        directory: ``OUTPUT_DIR/checkpoints``.
        model_digest: :func:`~rlzoo.trainer.model_digest.weights_digest` of the model the run started from,
            recorded in each checkpoint's ``trainer_state.json`` (a resume or an export onto a changed base warns).
    """

    def __init__(self, config: CheckpointConfig, directory: str | Path, *,
                 model_digest: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.directory = Path(directory)
        self.model_digest = model_digest  # of the model the run started from (rlzoo.trainer.model_digest)

    def path(self, step: int) -> Path:
        """The directory of the checkpoint of ``step``."""
        return self.directory / f"step-{step:06d}"

    def all(self) -> list[Path]:
        """Complete checkpoints, oldest first, ordered by step number (``step-999999`` before ``step-1000000``);
        temporaries of interrupted writes are never listed."""
        if not self.directory.is_dir():
            return []
        found = [(step_of(p), p) for p in self.directory.iterdir() if p.is_dir() and step_of(p) is not None]
        return [p for _, p in sorted(found, key=lambda pair: pair[0])]

    def find(self, resume: str) -> Path:
        """The checkpoint ``resume`` names: ``latest`` (the newest under ``directory``) or a checkpoint path.

        Raises:
            FileNotFoundError: ``latest`` without a checkpoint (names the directory), or a path that is not a
                checkpoint.
        """
        if resume != "latest":
            path = Path(resume)
            if not path.exists():
                parent = path.parent if path.parent != Path(".") or not self.directory.is_dir() else self.directory
                there = sorted(p.name for p in parent.glob("step-*") if (p / "trainer_state.json").is_file())
                kept = (f"; {parent} holds {', '.join(there)} (older checkpoints are pruned by --save-total-limit): "
                        f"give its path, e.g. --resume {parent / (path.name if path.name in there else there[-1])} "
                        "(or, with the run's --output-dir, its name), or --resume latest" if there else "")
                raise FileNotFoundError(f"--resume {resume}: no such checkpoint{kept}")
            if not (path / "trainer_state.json").is_file():
                run = (path / "metrics.jsonl").exists() or is_run_config(path / "config.json")
                hint = (f"; it is a run directory: continue it with --output-dir {resume} --resume latest, or start "
                        f"a new run from one of its checkpoints: --resume {Path(resume) / 'checkpoints' / 'step-N'}"
                        if run else "")
                raise FileNotFoundError(f"--resume {resume}: not an rlzoo checkpoint (no trainer_state.json){hint}")
            return path
        found = self.all()
        if not found:
            raise FileNotFoundError(no_checkpoint_message(self.directory))
        return found[-1]

    def due(self, step: int, *, final: bool) -> bool:
        """Whether a checkpoint is due after ``step`` (every ``save_steps``, and at the end)."""
        return final or bool(self.config.save_steps and step % self.config.save_steps == 0)

    def save(self, step: int, *, policy: ParallelModel, optimizer: torch.optim.Optimizer, tokenizer: Any,
             shared: Mapping[str, Any], per_rank: Mapping[str, Any], settings: Mapping[str, Any],
             dist: Distributed, row: Mapping[str, Any] | None = None) -> Path:
        """Write the checkpoint of ``step`` atomically (every rank calls it), then keep the newest
        ``save_total_limit``.

        Args:
            policy: the model (its DCP state and its consolidated Hugging Face export).
            optimizer: the optimizer over ``policy``'s parameters.
            tokenizer: saved with the consolidated model.
            shared: states equal on every rank (written by rank 0 as ``NAME.pt``).
            per_rank: this rank's states (``NAME-rankR.pt``).
            settings: the run's config, recorded for resume checks.
            dist: the process group context.
            row: the step's metrics row (without evaluation metrics) when the checkpoint is written before it
                is (JSON numbers; NaN allowed): a resume writes it if ``metrics.jsonl`` lacks it.

        Raises:
            OSError: the write failed (disk full: ``no space left on device`` naming the file); the previous
                checkpoints are untouched.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        path = self.path(step)
        kept = [p.name for p in self.all()]  # what a full disk's message offers to free (pruned only after a write)
        advice = ("" if not kept else f"free space; --resume latest continues from {kept[0]}" if len(kept) == 1 else
                  f"free space, e.g. delete the run's older checkpoints {', '.join(kept[:-1])}: --resume latest "
                  f"continues from the newest, {kept[-1]} (--save-total-limit prunes only after a new one is written)")
        pristine = not optimizer.state  # no optimizer step yet (a step-0 checkpoint): see below
        with _staging(path, dist) as tmp:  # the trained parameters: a LoRA run's adapter, not its frozen base
            state = {"model": _trained_state(policy.module),
                     "optimizer": get_optimizer_state_dict(policy.module, optimizer)}
            if pristine:  # DCP made a state with a zero-gradient step (AdamW's step count 1): not this run's
                optimizer.state.clear()
            with disk_full_is_os_error(path / "dcp", advice), _one_process_quietly(dist), interrupts_unwrapped():
                dcp.save(state, checkpoint_id=tmp / "dcp", no_dist=not dist.initialized)
            full = policy.full_state_dict() if policy.sharded else None  # every rank gathers, rank 0 writes
            if full:
                full = _without_tied_copies(policy.model, full)
            if dist.is_main:
                save_pretrained_atomic(policy.model, tokenizer, tmp / "model", state_dict=full)
            files = {f"{name}-rank{dist.rank}.pt": value for name, value in per_rank.items()}
            if dist.is_main:
                files.update({f"{name}.pt": value for name, value in shared.items()})
            for name, value in files.items():
                with disk_full_is_os_error(path / name, advice), open(tmp / name, "wb") as fh:
                    torch.save(value, fh)
            if dist.is_main:
                trainer_state = {"step": step, "world_size": dist.world_size, "settings": dict(settings),
                                 "model_digest": self.model_digest}
                if row is not None:
                    trainer_state["row"] = json_row(dict(row))  # as metrics.jsonl writes it
                with disk_full_is_os_error(path / "trainer_state.json", advice):
                    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
        if dist.is_main:
            for old in self.all()[: -self.config.save_total_limit]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return path

    @staticmethod
    def settings(path: str | Path) -> dict[str, Any]:
        """The run settings a checkpoint was written with (its ``world_size`` added).

        Raises:
            FileNotFoundError: not an rlzoo checkpoint.
        """
        state = _trainer_state(Path(path))
        return {**state.get("settings", {}), "world_size": state.get("world_size", 1)}

    def load(self, path: str | Path, *, policy: ParallelModel, optimizer: torch.optim.Optimizer,
             dist: Distributed) -> Checkpoint:
        """Load a checkpoint's model and optimizer state into ``policy`` and ``optimizer`` (resharded to this
        world size) and read its other states onto ``policy``'s device.

        Raises:
            FileNotFoundError: not an rlzoo checkpoint.
            ValueError: the checkpoint does not fit the model: names the checkpoint and the first missing,
                unexpected or differently shaped tensor.
            DamagedCheckpointError: a file of the checkpoint cannot be read (names it, and the earlier checkpoint).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path = Path(path)
        trainer_state = _trainer_state(path)
        model_state = _trained_state(policy.module)
        frozen = set(get_model_state_dict(policy.module)) - set(model_state)
        _check_fits(path, model_state, frozen=frozen)
        state = {"model": model_state, "optimizer": get_optimizer_state_dict(policy.module, optimizer)}
        with _one_process_quietly(dist), interrupts_unwrapped(), reading(path, "dcp/ (the model and optimizer)"):
            dcp.load(state, checkpoint_id=path / "dcp", no_dist=not dist.initialized)
        set_model_state_dict(policy.module, state["model"], options=_trained_only())
        set_optimizer_state_dict(policy.module, optimizer, state["optimizer"])
        if int(trainer_state["step"]) == 0:  # no optimizer step taken: no state, as the uninterrupted run's
            optimizer.state.clear()  # (the saved one is DCP's zero-gradient initialisation: step count 1)
        world_size = int(trainer_state.get("world_size", 1))
        rank = dist.rank if world_size == dist.world_size else 0
        states = {}
        for file in sorted(path.glob("*.pt")):  # on the CPU: RNG states must stay there (their owners move the rest)
            name, _, owner = file.stem.partition("-rank")
            if not owner or int(owner) == rank:
                with reading(path, file.name):
                    states[name] = torch.load(file, map_location="cpu", weights_only=True)
        return Checkpoint(path=path, step=int(trainer_state["step"]), world_size=world_size,
                          settings=trainer_state.get("settings", {}), states=states, row=trainer_state.get("row"))


def _without_tied_copies(model: torch.nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with a tied parameter (``lm_head.weight``, the embedding's) under its first name only, as
    ``save_pretrained`` writes a whole model: gathered from shards, the tied names hold separate tensors, which it
    would write twice."""
    first: dict[int, str] = {}
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), name) != name}
    return {name: value for name, value in state.items() if name not in tied}


def rank_states(path: str | Path, name: str) -> list[Any]:
    """Every rank's own state ``NAME-rankR.pt`` of the checkpoint at ``path``, in rank order, on the CPU (e.g. to
    combine the ranks' counts when another number of ranks resumes it).

    Raises:
        FileNotFoundError: the checkpoint lacks a rank's file (names it).
    """
    path = Path(path)
    world_size = int(_trainer_state(path).get("world_size", 1))
    files = [path / f"{name}-rank{rank}.pt" for rank in range(world_size)]
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"checkpoint {path} lacks {file.name} (written by {world_size} ranks)")
    return [torch.load(file, map_location="cpu", weights_only=True) for file in files]


def _trained_only() -> Any:
    """Options that set a model state without requiring its frozen parameters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def _trained_state(module: torch.nn.Module) -> dict[str, Any]:
    """The model state of checkpoints: the trained parameters only (a LoRA run's adapter; its frozen base comes from
    ``--model``). ``ignore_frozen_params`` keeps the second name of a tied frozen weight (``lm_head.weight`` tied to
    the frozen embedding): tensors sharing a frozen parameter's storage are dropped too."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    def storage(t: Any) -> int:
        return (t.to_local() if isinstance(t, DTensor) else t).untyped_storage().data_ptr()

    full = get_model_state_dict(module)
    trained = get_model_state_dict(module, options=_trained_only())
    frozen = {storage(v) for k, v in full.items() if k not in trained}
    return {k: v for k, v in trained.items() if storage(v) not in frozen}


@contextlib.contextmanager
def _staging(path: Path, dist: Distributed) -> Iterator[Path]:
    """The temporary directory every rank writes a checkpoint into; rank 0 renames it to ``path`` once all
    have written."""
    if dist.is_main:
        with atomic_dir(path) as tmp:
            dist.broadcast_object(str(tmp))
            yield tmp
            dist.barrier()  # every rank has written its part
    else:
        yield Path(dist.broadcast_object(None))
        dist.barrier()


@contextlib.contextmanager
def _one_process_quietly(dist: Distributed) -> Iterator[None]:
    """DCP warns at every single-process save and load that it assumes one process; that is the intent here."""
    with warnings.catch_warnings():
        if not dist.initialized:
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _trainer_state(path: Path) -> dict[str, Any]:
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not an rlzoo checkpoint (no trainer_state.json)")
    with reading(path, "trainer_state.json"):
        return json.loads(state_file.read_text())


def _check_fits(path: Path, model_state: Mapping[str, Any], *, frozen: set[str] = frozenset()) -> None:
    """Raise naming the first tensor where the checkpoint and the model's trained parameters differ (``frozen``: the
    model's frozen parameters, which checkpoints written before they were left out may still hold)."""
    from torch.distributed.checkpoint import FileSystemReader

    with reading(path, "dcp/.metadata"):
        metadata = FileSystemReader(str(path / "dcp")).read_metadata()
    saved = {k.removeprefix("model."): v for k, v in metadata.state_dict_metadata.items() if k.startswith("model.")}
    for name, value in model_state.items():
        if name not in saved:
            raise ValueError(f"checkpoint {path} does not fit the model: it lacks {name.removeprefix('model.')!r} "
                             "(a checkpoint of another model?)")
        want, have = tuple(saved[name].size), tuple(value.shape)
        if want != have:
            raise ValueError(f"checkpoint {path} does not fit the model: {name.removeprefix('model.')} has shape "
                             f"{want} in the checkpoint and {have} in the model (a checkpoint of another model?)")
    extra = sorted(set(saved) - set(model_state) - frozen)
    if extra:
        raise ValueError(f"checkpoint {path} does not fit the model: it has a tensor {extra[0].removeprefix('model.')!r} "
                         "the model lacks (a checkpoint of another model?)")
