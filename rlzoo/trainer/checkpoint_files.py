"""Reading a checkpoint's files: a file that cannot be read (cut short by a copy, a full or failing disk) is named,
with the earlier checkpoints a run can resume from instead (:func:`reading`), and the ``step-N`` directory names
checkpoints are found by (:func:`step_of`)."""

import contextlib
import json
import pickle
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DamagedCheckpointError", "reading", "step_of"]

_STEP_DIR = re.compile(r"^step-(\d+)$")


class DamagedCheckpointError(ValueError):
    """A checkpoint file that exists but cannot be read (truncated, corrupted)."""


def step_of(path: Path) -> int | None:
    """The step number of a ``step-N`` directory name, else None."""
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def reading(checkpoint: Path, file: str) -> Iterator[None]:
    """Run the block that reads ``file`` (relative to ``checkpoint``); an error it raises (torch's "failed reading
    zip archive", pickle's "data was truncated", JSON's "Expecting value", an OSError) becomes one line naming the
    checkpoint and the file, and the newest earlier checkpoint to resume from instead.

    Raises:
        DamagedCheckpointError: the block failed to read the file (chained to its error; ``RLZOO_DEBUG=1`` shows
            it); other errors (an interrupt, a lost rank, a state that does not fit the model) pass unchanged.
    """
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: DCP's, of every rank

    try:
        yield
    except (Exception, CheckpointException) as err:
        cause = next(iter(err.failures.values()))[0] if isinstance(err, CheckpointException) and err.failures else err
        if not _unreadable(cause):  # an interrupt, a rank gone, a state that does not fit: not the file's fault
            raise
        said = textwrap.shorten(f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}", 160,
                                placeholder=" ...")
        step = step_of(checkpoint)
        earlier = sorted((p for p in checkpoint.parent.glob("step-*") if (p / "trainer_state.json").is_file()
                          and (step_of(p) or 0) < (step or 0)), key=lambda p: step_of(p) or 0)
        instead = (f"resume from the earlier checkpoint instead: --resume {earlier[-1]}" if earlier else
                   "copy it again, or start the run afresh (no earlier checkpoint is there)")
        raise DamagedCheckpointError(f"checkpoint {checkpoint}: {file} cannot be read ({said}); if it is damaged "
                                     f"(a copy cut short, a full or failing disk), {instead}") from err


def _unreadable(err: BaseException) -> bool:
    """Whether ``err`` says a file's bytes could not be read or decoded: an OSError, pickle's or JSON's decoding
    errors, an early end of file, torch's "PytorchStreamReader failed reading zip archive"."""
    if isinstance(err, OSError | pickle.UnpicklingError | EOFError | json.JSONDecodeError | UnicodeDecodeError):
        return True
    return isinstance(err, RuntimeError) and re.search(r"PytorchStreamReader|zip archive|unexpected EOF", str(err)) \
        is not None
