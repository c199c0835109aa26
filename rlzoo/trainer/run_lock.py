"""One run per directory: the run lock.

A run holds ``OUTPUT_DIR/.rlzoo.lock`` (its pid, host and start time) with ``fcntl.flock`` for its whole life. The
kernel drops the lock when the process dies, so the lock of a killed run is taken over with a warning, and a live
one refuses a second run at once, before anything reads what the live run has written so far (which would
otherwise look like a stopped run: a start without a checkpoint, a run to resume).
"""

import contextlib
import errno
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.io import umask_mode

__all__ = ["LOCK_FILE", "RunLockedError", "hold_lock", "refuse_a_live_run"]

log = logging.getLogger("rlzoo.train")

LOCK_FILE = ".rlzoo.lock"


class RunLockedError(OSError):
    """Another live process runs in this directory (names its pid and host); shown as ``output directory DIR:
    another run is using it (pid ..., host ...); ...`` (errno EBUSY, without OSError's ``[Errno 16]``)."""

    def __str__(self) -> str:
        return f"output directory {self.filename}: {self.strerror}"


@contextlib.contextmanager
def hold_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s run lock for the duration of the block (the directory is created if needed); a lock
    left by a dead process is taken over with a warning naming it. The lock file is left empty on release; a
    directory this call created that holds nothing else then (a start refused before it wrote anything) is removed.

    Raises:
        RunLockedError: another live process holds it (names pid and host).
    """
    import fcntl

    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, umask_mode(0o666))
    try:
        for attempt in range(6):  # a start's brief probe (refuse_a_live_run) may hold it for microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                error = _locked_error(directory, fd, err)
                if not isinstance(error, RunLockedError) or attempt == 5:
                    raise error from None
                time.sleep(0.1)
        try:  # the file this start locked is still the directory's (not one a refused start removed meanwhile)
            same = os.path.samestat(os.fstat(fd), os.stat(directory / LOCK_FILE))
        except FileNotFoundError:
            same = False
        if not same:
            raise RunLockedError(errno.EBUSY, "another start was using it a moment ago; start again", str(directory))
        previous = _read_lock(fd)
        if previous:
            log.warning("output directory %s: taking over the lock of a run that ended without releasing it (%s)",
                        directory, _describe(previous))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # an empty lock file: released cleanly
            if created and [p.name for p in directory.iterdir()] == [LOCK_FILE]:  # still holding the lock
                with contextlib.suppress(OSError):  # another start's files appeared: keep the directory
                    (directory / LOCK_FILE).unlink()
                    directory.rmdir()
    finally:
        os.close(fd)  # also releases the flock


def refuse_a_live_run(directory: Path) -> None:
    """Raise :class:`RunLockedError` when another live process holds ``directory``'s run lock (probed with a shared
    lock, released at once; never call it while holding the lock: it would refuse its own holder).

    Raises:
        RunLockedError: names the live run's pid and host.
    """
    import fcntl

    if not (directory / LOCK_FILE).is_file():
        return
    fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        raise _locked_error(directory, fd, err) from None
    finally:
        os.close(fd)


def _locked_error(directory: Path, fd: int, err: OSError) -> OSError:
    """``err`` of ``flock`` on the lock file ``fd``: a :class:`RunLockedError` naming the live run when the lock is
    held, else ``err`` itself."""
    if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        return err
    return RunLockedError(errno.EBUSY, f"another run is using it ({_describe(_read_lock(fd))}); wait for it or "
                          "choose another --output-dir", str(directory))


def _read_lock(fd: int) -> dict[str, Any]:
    data = os.pread(fd, 4096, 0)
    try:
        value = json.loads(data) if data.strip() else {}
    except ValueError:
        return {"content": data[:100].decode(errors="replace")}
    return value if isinstance(value, dict) else {}


def _describe(lock: Mapping[str, Any]) -> str:
    if not lock:
        return "unknown process"
    return ", ".join(f"{k} {v}" for k, v in lock.items())
