"""Reading a checkpoint's files: a file that cannot be read (cut short by a copy, a full or failing disk) is named,
with the earlier checkpoints a run can resume from instead (:func:`reading`), and the ``step-N`` directory names
checkpoints are found by (:func:`step_of`)."""

import contextlib
import re
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
        DamagedCheckpointError: the block failed (chained to its error; ``RLZOO_DEBUG=1`` shows it).
    """
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: DCP's, of every rank

    try:
        yield
    except (Exception, CheckpointException) as err:  # any failure to read the file
        cause = next(iter(err.failures.values()))[0] if isinstance(err, CheckpointException) and err.failures else err
        said = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        step = step_of(checkpoint)
        earlier = sorted((p for p in checkpoint.parent.glob("step-*") if (p / "trainer_state.json").is_file()
                          and (step_of(p) or 0) < (step or 0)), key=lambda p: step_of(p) or 0)
        instead = (f"resume from the earlier checkpoint instead: --resume {earlier[-1]}" if earlier else
                   "copy it again, or start the run afresh (no earlier checkpoint is there)")
        raise DamagedCheckpointError(f"checkpoint {checkpoint}: {file} cannot be read ({said:.160}); if it is damaged "
                                     f"(a copy cut short, a full or failing disk), {instead}") from err
