"""The checkpointer: atomic checkpoints of a run, found by step number, pruned, loaded back exactly.

A checkpoint ``checkpoints/step-NNNNNN/`` holds ``model/`` (a Hugging Face checkpoint: safetensors, config,
tokenizer; for a LoRA run the adapter and the tokenizer, :mod:`rlzoo.trainer.adapters`), one ``NAME.pt`` per stateful component (``optimizer``, ``rollouts``, ``rng``) and
``trainer_state.json`` (the step and the run's settings). It is written into a temporary sibling and renamed
into place (:func:`rlzoo.trainer.io.atomic_dir`), so a kill never leaves half a checkpoint.
"""

import dataclasses
import json
import logging
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlzoo.trainer.adapters import checkpoint_state_dict, load_checkpoint_weights
from rlzoo.trainer.config import CheckpointConfig
from rlzoo.trainer.io import atomic_dir, disk_full_is_os_error, save_pretrained_atomic

__all__ = ["Checkpoint", "Checkpointer", "rng_state", "set_rng_state"]

log = logging.getLogger("rlzoo.train")

_STEP_DIR = re.compile(r"^step-(\d+)$")


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
        settings: the run's config (``TrainConfig.to_dict()``) when it was written; {} for checkpoints written
            before rlzoo recorded it.
        states: each component's state, by file name (``optimizer``, ``rollouts``, ``rng``).
    """

    path: Path
    step: int
    settings: Mapping[str, Any]
    states: Mapping[str, Any]


def step_of(path: Path) -> int | None:
    """The step number of a ``step-N`` directory name, else None."""
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


class Checkpointer:
    """Writes, finds, prunes and loads the checkpoints under ``directory``.

    Args:
        config: the checkpoint section (``save_steps``, ``save_total_limit``, ``resume``).
        directory: ``OUTPUT_DIR/checkpoints``.
    """

    def __init__(self, config: CheckpointConfig, directory: str | Path) -> None:
        self.config = config
        self.directory = Path(directory)

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
            if not (path / "trainer_state.json").is_file():
                raise FileNotFoundError(f"--resume {resume}: not an rlzoo checkpoint (no trainer_state.json)")
            return path
        found = self.all()
        if not found:
            raise FileNotFoundError(f"--resume latest: no checkpoint under {self.directory}; pass --output-dir of "
                                    "the run, or start over with --overwrite")
        return found[-1]

    def due(self, step: int, *, final: bool) -> bool:
        """Whether a checkpoint is due after ``step`` (every ``save_steps``, and at the end)."""
        return final or bool(self.config.save_steps and step % self.config.save_steps == 0)

    def save(self, step: int, *, model: torch.nn.Module, tokenizer: Any, states: Mapping[str, Any],
             settings: Mapping[str, Any]) -> Path:
        """Write the checkpoint of ``step`` atomically, then keep only the newest ``save_total_limit``.

        Raises:
            OSError: the write failed (disk full: ``no space left on device`` naming the file); the previous
                checkpoints are untouched.
        """
        path = self.path(step)
        with atomic_dir(path) as tmp:
            save_pretrained_atomic(model, tokenizer, tmp / "model")
            for name, state in states.items():
                with disk_full_is_os_error(path / f"{name}.pt"), open(tmp / f"{name}.pt", "wb") as fh:
                    torch.save(state, fh)
            trainer_state = json.dumps({"step": step, "settings": dict(settings)}, indent=2, sort_keys=True)
            with disk_full_is_os_error(path / "trainer_state.json"):
                (tmp / "trainer_state.json").write_text(trainer_state + "\n")
        for old in self.all()[: -self.config.save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    @staticmethod
    def settings(path: str | Path) -> dict[str, Any]:
        """The run settings a checkpoint was written with ({} for checkpoints from before rlzoo recorded them).

        Raises:
            FileNotFoundError: not an rlzoo checkpoint.
        """
        state_file = Path(path) / "trainer_state.json"
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not an rlzoo checkpoint (no trainer_state.json)")
        return dict(json.loads(state_file.read_text()).get("settings", {}))

    def load(self, path: str | Path, *, model: torch.nn.Module, device: torch.device) -> Checkpoint:
        """Load a checkpoint's weights into ``model`` and read its states (onto ``device``).

        Raises:
            FileNotFoundError: not an rlzoo checkpoint.
            ValueError: the checkpoint does not fit the model: names the checkpoint and the first missing,
                unexpected or differently shaped tensor.
        """
        from safetensors.torch import load_file

        path = Path(path)
        state_file = path / "trainer_state.json"
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not an rlzoo checkpoint (no trainer_state.json)")
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted((path / "model").glob("*.safetensors")):
            weights.update(load_file(str(shard), device=str(device)))
        _check_fits(path, weights, model)
        load_checkpoint_weights(model, weights)  # the whole model, or a PEFT model's adapter
        trainer_state = json.loads(state_file.read_text())
        states = {p.stem: torch.load(p, map_location=device, weights_only=True) for p in sorted(path.glob("*.pt"))}
        return Checkpoint(path=path, step=int(trainer_state["step"]), settings=trainer_state.get("settings", {}),
                          states=states)


def _check_fits(path: Path, weights: Mapping[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Raise naming the first tensor where the checkpoint and the model differ (tied copies may be absent)."""
    own = checkpoint_state_dict(model)
    storage: dict[int, list[str]] = {}  # tied parameters share storage; a checkpoint holds one of them
    for name, tensor in own.items():
        storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(name)
    tied = {name for names in storage.values() if len(names) > 1 and any(n in weights for n in names) for name in names}
    for name, tensor in weights.items():
        if name not in own:
            raise ValueError(f"checkpoint {path} does not fit the model: it has a tensor {name!r} the model lacks "
                             "(a checkpoint of another model?)")
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(f"checkpoint {path} does not fit the model: {name} has shape {tuple(tensor.shape)} in "
                             f"the checkpoint and {tuple(own[name].shape)} in the model (a checkpoint of another "
                             "model?)")
    missing = [name for name in own if name not in weights and name not in tied]
    if missing:
        raise ValueError(f"checkpoint {path} does not fit the model: it lacks {missing[0]!r} "
                         f"({len(missing)} tensors missing; a checkpoint of another model?)")
