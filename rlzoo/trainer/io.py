"""Atomic file writes: write to a temporary sibling, fsync, then ``os.replace``; and recovery of interrupted ones.

Every write keeps the user's umask (temporary files are created 0600 / 0700, and the files of a tree written by
other libraries may be too; all are given the modes the umask allows before they become visible). Temporaries are named ``.NAME.XXXX.tmp``; a tree being replaced is moved
aside to ``.NAME.old`` for the instant between two renames. :func:`recover_interrupted_writes` removes the
temporaries a killed process left and puts back a ``.NAME.old`` whose replacement never arrived, so a kill at
any point leaves either the old or the new content under ``NAME``, never nothing and never a mix.
"""

import contextlib
import copy
import errno
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "append_line",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "disk_full_is_os_error",
    "is_stream",
    "json_row",
    "recover_interrupted_writes",
    "save_pretrained_atomic",
    "umask_mode",
]


def umask_mode(mode: int) -> int:
    """``mode`` with the process umask applied (what ``open``/``mkdir`` would give a new file or directory)."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


@contextlib.contextmanager
def disk_full_is_os_error(path: str | os.PathLike[str], advice: str = "") -> Iterator[None]:
    """Turn "no space left on device" from any writer into ``OSError(ENOSPC)`` naming ``path`` (``advice``: what to
    do, added to the message).

    Python's own writes raise ``OSError(28)`` without a file name; safetensors raises its own error type
    with "No space left on device (os error 28)" in the message; ``torch.save`` (and so
    ``torch.distributed.checkpoint``, which wraps it in a ``CheckpointException``) a ``RuntimeError`` "unexpected pos
    N vs M" without an errno, read as a full disk when ``path``'s file system has less than 1 MiB left. Other errors
    pass through unchanged.

    Raises:
        OSError: ``[Errno 28] no space left on device: 'PATH'``.
    """
    try:
        yield
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename is not None:
            raise  # already names its file (a narrower ``disk_full_is_os_error`` inside this one)
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err) or (
                "unexpected pos" in str(err) and _free_bytes(Path(path)) < 2**20):  # torch's short write
            raise OSError(errno.ENOSPC, "no space left on device" + (f" ({advice})" if advice else ""), str(path)) \
                from err
        raise


def _free_bytes(path: Path) -> int:
    """The bytes this process may still write on the file system of ``path`` (its nearest existing parent)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    stats = os.statvfs(existing)
    return (stats.f_bfree if os.geteuid() == 0 else stats.f_bavail) * stats.f_frsize


def check_writable(directory: str | os.PathLike[str], what: str) -> None:
    """Fail before any work when files could not be created in ``directory`` (created later if missing): its nearest
    existing ancestor must be a directory this process can write (probed with a temporary file, removed at once).

    Raises:
        OSError: ``[Errno N] WHAT is not writable (REASON): 'DIRECTORY'`` (a parent is a file, permission denied,
            a read-only or virtual file system, ...).
    """
    path = Path(directory)
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise OSError(err.errno, f"{what} is not writable ({err.strerror})", str(path)) from None


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` exists as something other than a regular file or a directory: ``/dev/null``,
    ``/dev/stdout``, a FIFO (followed through symbolic links). Such a path is written in place: renaming a file over
    it would replace the device itself (as root, ``rlzoo eval --output /dev/null`` left a regular file there). A path
    under ``/dev`` or ``/proc`` that exists is one whatever it names (``/dev/stdout`` links to the file a shell
    redirects to)."""
    if os.path.lexists(path) and os.path.abspath(path).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part; a
    :func:`is_stream` path (``/dev/null``, ``/dev/stdout``) is written in place instead.

    Raises:
        OSError: the write failed (disk full: ``[Errno 28] no space left on device: 'PATH'``); the old file
            is untouched and no temporary is left.
    """
    path = Path(path)
    if is_stream(path):
        with disk_full_is_os_error(path), open(path, "wb") as fh:
            fh.write(data)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a parent is a file, ...: named with the file asked for
        raise OSError(err.errno, f"cannot write {path} ({err.strerror})", err.filename) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # named as the file asked for, not its temporary
        raise OSError(err.errno, f"cannot write {path} ({err.strerror})") from None
    try:
        with disk_full_is_os_error(path), os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), umask_mode(0o666))
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (a newline is added) and fsync: a kill leaves at most a torn last line, which the
    reader repairs (:meth:`rlzoo.trainer.metrics.MetricsLogger.open`).

    Raises:
        OSError: the write failed (disk full names the file).
    """
    with disk_full_is_os_error(path), open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``path`` as a whole.

    Used for checkpoints: a crash mid-save leaves the previous checkpoint (or nothing), never half a one.
    Every file and directory of the new tree is fsynced before the rename, and the parent after it.
    Replacing an existing ``path`` takes two renames (old aside to ``.NAME.old``, new in); a kill between them
    leaves the old tree at ``.NAME.old``, which :func:`recover_interrupted_writes` (run by the trainer at start,
    under its run lock: concurrent writers of one target must not recover each other's work) puts back.

    Raises:
        OSError: from the writes (disk full names the directory); the previous tree is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        with disk_full_is_os_error(path):
            yield tmp
        _finish_tree(tmp)  # the umask's modes, and the data on disk before the rename makes it visible
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            if old.exists():  # left by an earlier interrupted save; ``path`` is complete, so it is redundant
                shutil.rmtree(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
        _fsync_path(path.parent)  # and the rename itself
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_pretrained_atomic(model: Any, tokenizer: Any, path: str | os.PathLike[str],
                           state_dict: dict[str, Any] | None = None) -> Path:
    """Save a Hugging Face model (safetensors), its tokenizer, config and generation config as one directory,
    atomically (:func:`atomic_dir`): a crash leaves the previous directory or nothing, never half a checkpoint.
    An existing ``path`` is replaced. Load it back with ``rlzoo.trainer.models.load_model(path)``. A PEFT model
    saves its adapter without a hub lookup of its base (:func:`~rlzoo.trainer.adapters.adapter_save_options`).

    The tokenizer is saved as configured, whatever the process did with it before: a fast tokenizer's
    backend keeps the padding and truncation of its last call (e.g. left padding for generation), which
    ``save_pretrained`` would write into ``tokenizer.json``; a copy without them is saved.

    Args:
        model, tokenizer: a Hugging Face model and its tokenizer.
        path: the directory.
        state_dict: the weights to save instead of the model's own (a consolidated FSDP2 state dict).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        NotADirectoryError: ``path`` exists and is a file.
        OSError: the writes failed (disk full names the directory).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"save path {str(path)!r} exists and is not a directory")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and (backend.padding is not None or backend.truncation is not None):
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.backend_tokenizer.no_padding()
        tokenizer.backend_tokenizer.no_truncation()
    from rlzoo.trainer.adapters import adapter_save_options, is_peft_model
    from rlzoo.trainer.reference_adapter import REFERENCE_ADAPTER

    adapters = [a for a in model.peft_config if a != REFERENCE_ADAPTER] if is_peft_model(model) else []  # not its copy
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, **({"state_dict": state_dict} if state_dict is not None else {}),
                              **adapter_save_options(model), **({"selected_adapters": adapters} if adapters else {}))
        tokenizer.save_pretrained(tmp)
    return path


def recover_interrupted_writes(directory: str | os.PathLike[str],
                               names: Collection[str] | Callable[[str], bool] | None = None) -> list[str]:
    """Undo what a killed atomic write left in ``directory`` (not recursive).

    Removes temporaries (``.NAME.XXXX.tmp`` files and trees); a ``.NAME.old`` tree is renamed back to ``NAME``
    when ``NAME`` is missing (the kill came between the two renames of :func:`atomic_dir`) and removed when
    ``NAME`` is there (the kill came after the new tree was in place).

    Args:
        directory: where to look (nothing happens if it does not exist).
        names: only these ``NAME`` s, or those it says yes to (None: all).

    Returns:
        What was done, one line per entry (for a log message).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    done = []
    for entry in sorted(directory.iterdir()):
        hidden = entry.name
        if not hidden.startswith("."):
            continue
        if hidden.endswith(".tmp"):
            name = hidden[1:].rsplit(".", 2)[0]
            if not _wanted(name, names):
                continue
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            done.append(f"removed the temporary {entry}")
        elif hidden.endswith(".old") and entry.is_dir():
            name = hidden[1:-len(".old")]
            if not _wanted(name, names):
                continue
            target = directory / name
            if target.exists():
                shutil.rmtree(entry)
                done.append(f"removed {entry} (its replacement {target} is complete)")
            else:
                os.replace(entry, target)
                done.append(f"restored {target} from {entry} (a save was interrupted between two renames)")
    if done:
        _fsync_path(directory)
    return done


def _wanted(name: str, names: Collection[str] | Callable[[str], bool] | None) -> bool:
    return names is None or (names(name) if callable(names) else name in names)


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (directories where the platform allows opening them)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_tree(root: Path) -> None:
    """Give every file and directory under ``root`` the modes the umask allows (some writers, e.g. safetensors,
    create 0600 files), and fsync them."""
    file_mode, dir_mode = umask_mode(0o666), umask_mode(0o777)
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            path.chmod(file_mode)
            _fsync_path(path)
        Path(dirpath).chmod(dir_mode)
        _fsync_path(Path(dirpath))


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with non-finite floats as None: JSON has no NaN or infinity (Python's json would write the
    non-standard tokens ``NaN`` / ``Infinity``, which jq and strict parsers reject)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
