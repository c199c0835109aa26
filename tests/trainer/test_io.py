"""Atomic writes: readers see the old content or the whole new one; a failed write leaves the old one."""

import warnings

import pytest
import torch

from rlzoo.trainer.io import atomic_dir, atomic_write_text


def test_atomic_dir_replaces_a_tree_as_a_whole(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("two")
    assert (target / "sub" / "b.txt").read_text() == "two"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("three")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"] and (target / "a.txt").read_text() == "three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or .old left behind


def test_a_failed_save_leaves_the_previous_tree_and_no_debris(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("kept")
    with pytest.raises(RuntimeError, match="disk full"), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("disk full")
    assert (target / "a.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_write_text_replaces_the_file(tmp_path):
    path = tmp_path / "deep" / "metrics.jsonl"
    atomic_write_text(path, "a\n")
    atomic_write_text(path, "b\n")
    assert path.read_text() == "b\n"
    assert [p.name for p in path.parent.iterdir()] == ["metrics.jsonl"]


def test_recovery_removes_temporaries_and_puts_back_a_tree_moved_aside(tmp_path):
    """A kill between the two renames of a re-save leaves only ``.NAME.old``: it is renamed back; next to a
    complete ``NAME`` it is removed; temporaries (files and trees) are removed; other hidden files stay."""
    from rlzoo.trainer.io import recover_interrupted_writes

    (tmp_path / ".step-000002.old").mkdir()
    (tmp_path / ".step-000002.old" / "a.txt").write_text("complete")
    (tmp_path / "step-000003").mkdir()
    (tmp_path / ".step-000003.old").mkdir()
    (tmp_path / ".step-000004.k2j3h4g5.tmp").mkdir()
    (tmp_path / ".metrics.jsonl.a1b2c3d4.tmp").write_text("half")
    (tmp_path / ".rlzoo.lock").write_text("")
    done = recover_interrupted_writes(tmp_path)
    assert len(done) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rlzoo.lock", "step-000002", "step-000003"]
    assert (tmp_path / "step-000002" / "a.txt").read_text() == "complete"
    assert recover_interrupted_writes(tmp_path) == []


def test_atomic_writes_respect_the_umask(tmp_path):
    import os
    import stat

    previous = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_dir(tmp_path / "tree") as tmp:
            (tmp / "sub").mkdir(mode=0o700)
            (tmp / "sub" / "b.bin").write_bytes(b"y")
            (tmp / "sub" / "b.bin").chmod(0o600)  # as safetensors writes its files
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "tree").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "tree" / "sub").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "tree" / "sub" / "b.bin").stat().st_mode) == 0o640


def test_disk_full_errors_name_the_file(tmp_path):
    """Python writes raise ENOSPC without a file name and safetensors its own error type; both become one
    ``OSError(ENOSPC)`` naming the file, and the innermost name wins."""
    import errno

    from rlzoo.trainer.io import disk_full_is_os_error

    class SafetensorError(Exception):
        pass

    for raised in (OSError(errno.ENOSPC, "No space left on device"),
                   SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")):
        with (pytest.raises(OSError, match=r"no space left on device: '.*x\.pt'") as info,
              disk_full_is_os_error(tmp_path / "dir"), disk_full_is_os_error(tmp_path / "dir" / "x.pt")):
            raise raised
        assert info.value.errno == errno.ENOSPC
    with pytest.raises(ValueError, match="other"), disk_full_is_os_error(tmp_path):
        raise ValueError("other")


def test_torchs_short_write_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """A real full disk (a 4 MB tmpfs, helper trial) ended a run in a 60-line traceback: torch.save, and DCP around it,
    raise RuntimeError "unexpected pos N vs M" with no errno. With under 1 MiB left on the file system that is the
    one-line disk-full error naming the file; with space left (another cause) it passes through. /dev/full gives
    torch's real error; the free space is what the file system of a full disk reports."""
    import errno
    import os

    import torch.distributed.checkpoint as dcp

    from rlzoo.trainer.io import disk_full_is_os_error

    real_statvfs = os.statvfs

    def free(blocks: int):
        def statvfs(path):
            stats = real_statvfs(path)
            return os.statvfs_result((stats.f_bsize, 4096, stats.f_blocks, blocks, blocks, *stats[5:]))
        return statvfs

    state = {"w": torch.randn(64, 64)}
    monkeypatch.setattr(os, "statvfs", free(0))
    with pytest.raises(OSError, match=r"no space left on device: '.*step-000001'") as info, \
            disk_full_is_os_error(tmp_path / "step-000001"):
        torch.save(state, "/dev/full")
    assert info.value.errno == errno.ENOSPC and "unexpected pos" in str(info.value.__cause__)
    full_dcp = tmp_path / "dcp"  # DCP's data file is /dev/full: its CheckpointException carries torch's error
    full_dcp.mkdir()
    (full_dcp / "__0_0.distcp").symlink_to("/dev/full")
    with pytest.raises(OSError, match=r"no space left on device: '.*dcp'"), disk_full_is_os_error(full_dcp), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming ... a single process"
        dcp.save(state, checkpoint_id=full_dcp)
    monkeypatch.setattr(os, "statvfs", free(1000))  # 4 MB left: not a full disk
    with pytest.raises(RuntimeError, match="unexpected pos"), disk_full_is_os_error(tmp_path / "x.pt"):
        torch.save(state, "/dev/full")


def _fifo_reader(path):
    """A FIFO at ``path`` and a thread reading it to the end: ``(thread, chunks)``."""
    import os
    import threading

    os.mkfifo(path)
    chunks: list[bytes] = []

    def read():
        with open(path, "rb") as fh:  # blocks until a writer opens it
            chunks.append(fh.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, chunks


def test_a_stream_output_is_written_in_place_never_replaced(tmp_path, monkeypatch):
    """`rlzoo eval --output /dev/null` (or a FIFO, /dev/stdout) renamed its file over the path: as root, /dev/null
    became a regular file (every shell redirect to it then wrote there). A path that exists as neither a file
    nor a directory is written in place, by the atomic writes and by rlzoo plot; rlzoo bench, which reads its
    output back, refuses one. Tested on FIFOs (no root needed)."""
    import os
    import stat

    from rlzoo.cli import main
    from rlzoo.losses.pictures import plot_objective
    from rlzoo.trainer.eval_run import _check_output
    from rlzoo.trainer.io import atomic_write_bytes, is_stream

    for name, write, start in [("eval.json", lambda p: atomic_write_text(p, '{"accuracy": 1.0}\n'), b'{"accuracy"'),
                               ("plot", lambda p: plot_objective("dapo", p, dpi=20), b"\x89PNG")]:
        fifo = tmp_path / name
        thread, chunks = _fifo_reader(fifo)
        write(fifo)
        thread.join(timeout=10)
        assert stat.S_ISFIFO(fifo.stat().st_mode), f"{name}: the FIFO was replaced by a file"
        assert len(chunks) == 1 and chunks[0].startswith(start), name  # what was written reached the reader
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "plot"]  # no temporary left beside them
    atomic_write_bytes(tmp_path / "file", b"x")  # a regular file is still replaced atomically
    assert (tmp_path / "file").read_bytes() == b"x"
    # /dev/stdout links to whatever a shell redirects to (a regular file too): written in place, never replaced
    assert is_stream("/dev/stdout") and is_stream("/dev/null") and not is_stream(tmp_path / "file")
    fifo = tmp_path / "out.json"  # rlzoo eval --output FIFO: its directory need not be writable (/dev is not, to a user)
    os.mkfifo(fifo)
    monkeypatch.setattr("rlzoo.trainer.io.check_writable", lambda *a, **k: (_ for _ in ()).throw(PermissionError()))
    _check_output(fifo)
    os.mkfifo(tmp_path / "bench.json")
    with pytest.raises(ValueError, match=r"^rlzoo bench --output .*bench.json: not a regular file"):
        main(["bench", "--output", str(tmp_path / "bench.json"), "--no-render"])
