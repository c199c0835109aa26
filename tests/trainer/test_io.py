"""Atomic writes: readers see the old content or the whole new one; a failed write leaves the old one."""

import pytest

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
