"""Run safety for days-long runs: changed settings on resume, occupied directories, timelines, signals, leftovers
of interrupted writes, the run lock, the umask, append-only metrics, fail-fast checks, one-line errors and the
saved tokenizer. Everything on the tiny random model, through public component APIs and the console script."""

import errno
import inspect
import json
import logging
import os
import re
import shutil
import signal
import stat

import pytest
import torch

from rlzoo.cli import console_main, parse_train_args
from rlzoo.trainer import RunInterrupted, TrainConfig, Trainer
from rlzoo.trainer.checkpoint import Checkpointer
from rlzoo.trainer.config import CheckpointConfig
from rlzoo.trainer.models import TinyRandomSpec, build_tiny_random
from rlzoo.trainer.rewards import RewardFunctionError
from rlzoo.trainer.run_dir import RunDirectory, RunLockedError

TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 6,
        "eval_size": 4, "eval_batch_size": 4, "progress": False, "learning_rate": 1e-3, "reward_funcs": ()}
TINY_FLAGS = ["--model", "tiny-random", "--num-generations", "4", "--per-device-train-batch-size", "8",
              "--max-completion-length", "4", "--eval-size", "0", "--no-progress"]


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _config(run, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "output_dir": None if run is None else str(run), **overrides})


def _train(run, **overrides) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(_config(run, **overrides), reward_funcs=[digit_fraction])
    return trainer, trainer.train()


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["rlzoo", *map(str, args)])
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    code = console_main()
    return code, capsys.readouterr().err


def _untimed(rows: list[dict]) -> list[dict]:
    timing = ("step_time", "generation_time", "train_time", "tokens_per_second")
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


def _error_line(err: str) -> str:
    """The one ``rlzoo: error:`` line of a failed command (and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _hidden(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") and p.name != ".rlzoo.lock")


# ------------------------------------------------------------------------------------------------ 1. resume
def test_resume_applies_changed_optimizer_settings_and_records_the_segments(tmp_path, caplog):
    """A lower learning rate (and other AdamW settings) given on resume are what the next step uses, with one log
    line per changed field; config.json keeps each segment's settings."""
    run = tmp_path / "run"
    _train(run, max_steps=1)
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        resumed, history = _train(run, max_steps=2, learning_rate=2e-4, adam_beta2=0.99, weight_decay=0.1,
                                  resume="latest")
    assert history[-1]["step"] == 2 and history[-1]["learning_rate"] == 2e-4
    group = resumed.optimizer.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (2e-4, (0.9, 0.99), 0.1)
    lines = sorted(r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("resume: "))
    assert lines == ["adam_beta2", "learning_rate", "max_steps", "weight_decay"]
    config = json.loads((run / "config.json").read_text())
    assert config["learning_rate"] == 2e-4
    first, second = config["segments"]
    assert (first["start_step"], first["settings"]["learning_rate"], first["changes"]) == (0, 1e-3, {})
    assert second["start_step"] == 1 and second["changes"]["learning_rate"] == [1e-3, 2e-4]
    assert second["resumed_from"] == str((run / "checkpoints" / "step-000001").resolve())  # absolute: valid anywhere


def test_resume_rebuilds_a_changed_schedule_at_the_resumed_step(tmp_path):
    """From constant to linear decay over a longer run: steps 3 and 4 use lr * (4 - s) / 4 for s = 2, 3."""
    run = tmp_path / "run"
    _train(run, max_steps=2, learning_rate=1e-3)
    _, history = _train(run, max_steps=4, lr_scheduler="linear", resume="latest")
    assert [row["learning_rate"] for row in history if row["step"] > 2] == pytest.approx([5e-4, 2.5e-4], rel=1e-12)


def test_resume_refuses_changes_it_cannot_honour(tmp_path, monkeypatch):
    """Refused naming the field, before the model loads (minutes for a large one)."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)
    model_dir = tmp_path / "same-weights"
    model, tokenizer = build_tiny_random()
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    for change, field in (({"num_generations": 2}, "num_generations"), ({"per_device_train_batch_size": 4},
                          "per_device_train_batch_size"), ({"task": "basic_arithmetic"}, "task"),
                          ({"seed": 1}, "seed"), ({"model": str(model_dir)}, "model")):
        with monkeypatch.context() as patch, pytest.raises(ValueError,
                                                           match=f"cannot resume with changed settings: {field} "):
            patch.setattr("rlzoo.trainer.adapters.build_policy", _no_model)
            Trainer(_config(run, max_steps=2, eval_size=0, resume="latest", **change), reward_funcs=[digit_fraction])
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1]  # nothing was written by the refusals


def _no_model(*args, **kwargs):
    raise AssertionError("a model loaded")


# ------------------------------------------------------------------------------- 2. occupied directories
def test_a_fresh_run_refuses_a_directory_holding_a_run_and_overwrite_starts_clean(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _train(run, max_steps=2, save_steps=1)
    loaded = []
    monkeypatch.setattr("rlzoo.trainer.models.load_model", lambda *a, **k: loaded.append(a))
    with pytest.raises(FileExistsError, match="--resume latest.*--overwrite"):
        Trainer(_config(run, max_steps=1))
    assert not loaded  # refused before the model loads
    monkeypatch.undo()
    _train(run, max_steps=1, overwrite=True)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000001"]
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [0, 1]
    assert len(json.loads((run / "config.json").read_text())["segments"]) == 1


def test_overwrite_deletes_the_runs_files_and_not_a_users_own(tmp_path):
    """--overwrite deleted every name a run may write (checkpoints/, wandb/, tensorboard/, completions/) whatever they
    held, and a checkpoints/ directory of a user's own (my_resnet.pt) counted as a run, whose refusal steered to
    --overwrite (helper trial). Now a directory without an rlzoo checkpoint, metrics or config holds no run, and
    --overwrite deletes the run's checkpoints and tables and the trackers its config.json names, not the rest."""
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "checkpoints" / "my_resnet.pt").write_text("w")
    (mine / "wandb").mkdir()
    (mine / "wandb" / "other.txt").write_text("x")
    assert not RunDirectory(mine).holds_run()
    _train(mine, max_steps=1, eval_size=0)  # not refused: no run there
    assert (mine / "checkpoints" / "my_resnet.pt").read_text() == "w" and (mine / "checkpoints" / "step-000001").is_dir()
    (mine / "checkpoints" / "step-notes.txt").write_text("n")  # named like the run's, but no checkpoint
    (mine / "completions").mkdir()
    (mine / "completions" / "step-000009.parquet.bak").write_text("b")
    _train(mine, max_steps=1, eval_size=0, overwrite=True, report_to="tensorboard")
    assert sorted(p.name for p in (mine / "checkpoints").iterdir()) == ["my_resnet.pt", "step-000001", "step-notes.txt"]
    assert [p.name for p in (mine / "completions").iterdir()] == ["step-000009.parquet.bak"]
    assert (mine / "wandb" / "other.txt").read_text() == "x" and (mine / "tensorboard").is_dir()
    _train(mine, max_steps=1, eval_size=0, overwrite=True)  # the tensorboard run's config names it: deleted
    assert not (mine / "tensorboard").exists() and (mine / "wandb" / "other.txt").exists()
    _train(mine, max_steps=1, eval_size=0, overwrite=True, report_to="tensorboard")
    (mine / "tensorboard" / "my_notes.txt").write_text("mine")  # a file of the user's beside the event files
    _train(mine, max_steps=1, eval_size=0, overwrite=True)  # the event files go, the notes stay (they went too)
    assert [p.name for p in (mine / "tensorboard").iterdir()] == ["my_notes.txt"]
    (mine / "wandb" / "other.txt").unlink()
    _train(mine, max_steps=1, eval_size=0, overwrite=True, report_to="wandb")
    (run,) = (mine / "wandb").glob("offline-run-*")
    (mine / "wandb" / f"{run.name}-1").mkdir()  # wandb's name for a second start in the same second
    (mine / "wandb" / "other.txt").write_text("x")
    _train(mine, max_steps=1, eval_size=0, overwrite=True)
    assert [p.name for p in (mine / "wandb").iterdir()] == ["other.txt"]
    assert [r["step"] for r in _rows(mine / "metrics.jsonl")] == [1]


def test_a_users_own_hidden_old_and_tmp_entries_are_not_recovered(tmp_path):
    """Every start treated any hidden .X.old / .X.tmp in the output directory as its own interrupted write: a user's
    .data.old/ was deleted (data/ existed), .backup.old/ renamed to backup/ and .notes.tmp deleted (helper trial)."""
    run = tmp_path / "proj"
    for name in ("data", ".data.old", ".backup.old"):
        (run / name).mkdir(parents=True)
    (run / ".data.old" / "v1.csv").write_text("x")
    (run / ".notes.tmp").write_text("z")
    (run / ".metrics.jsonl.x1y2z3a4.tmp").write_text("partial")  # the run's own: removed
    mine = run / "checkpoints"  # also in checkpoints/: only .step-N... entries are the run's
    (mine / ".mydata.old").mkdir(parents=True)
    (mine / ".mydata.old" / "file").write_text("m")
    (mine / ".scratch.x.tmp").mkdir()
    (mine / "step-notes.txt").write_text("n")  # not a checkpoint: the directory holds no run
    (mine / ".step-000007.ab12cd34.tmp").mkdir()  # a killed checkpoint write: removed
    tables = run / "completions"  # and a killed completions-table write, not a user's own temporary
    tables.mkdir()
    (tables / ".step-000002.parquet.ab12cd34.tmp").write_text("partial")
    (tables / ".mine.tmp").write_text("m")
    _train(run, max_steps=1, eval_size=0)
    assert _hidden(run) == [".backup.old", ".data.old", ".notes.tmp"] and not (run / "backup").exists()
    assert (run / ".data.old" / "v1.csv").read_text() == "x"
    assert _hidden(mine) == [".mydata.old", ".scratch.x.tmp"] and not (mine / "mydata").exists()
    assert _hidden(tables) == [".mine.tmp"]
    assert sorted(p.name for p in mine.iterdir() if not p.name.startswith(".")) == ["step-000001", "step-notes.txt"]


def test_a_run_that_started_in_the_directory_after_the_check_is_refused_under_the_lock(tmp_path, monkeypatch):
    """The occupied-directory check ran before the model load and the lock only in train(): a second fresh run
    launched at once into the same directory went on after the first finished, mixing both runs' metrics and
    replacing its checkpoint (helper trial). The check runs again once the lock is held."""
    run = tmp_path / "race"
    second = Trainer(_config(run, max_steps=1, eval_size=0), reward_funcs=[digit_fraction])  # checked: empty
    _train(run, max_steps=1, eval_size=0)  # the first run, during the second's model load
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="already holds a run; continue it with --resume latest") as refused:
        second.train()
    assert (run / "metrics.jsonl").read_text() == before and (run / ".rlzoo.lock").read_text() == ""
    import fcntl

    fd = os.open(run / ".rlzoo.lock", os.O_RDWR)  # released by the refusal, not by garbage collection: the
    try:  # exception (and its frames) is still alive here, as in a notebook's last traceback
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert refused.value is not None


def test_a_models_directory_is_not_a_run_and_is_never_written_over(tmp_path, monkeypatch, capsys):
    """A Hugging Face model's config.json is not a run's: an export can replace an earlier export with
    --overwrite (it was refused as "a training run's directory"), and a run into a model's directory is refused
    before the model loads, --overwrite or not (--overwrite replaced the model's config.json with the run's)."""
    model = tmp_path / "model"
    tiny, tokenizer = build_tiny_random(TinyRandomSpec())
    tiny.save_pretrained(model)
    tokenizer.save_pretrained(model)
    for overwrite in (False, True):
        monkeypatch.setattr("rlzoo.trainer.models.load_model", _no_model)
        with pytest.raises(FileExistsError, match="config.json that is not an rlzoo run's"):
            Trainer(_config(model, max_steps=1, overwrite=overwrite))
    monkeypatch.undo()
    assert "model_type" in json.loads((model / "config.json").read_text())
    assert _cli(monkeypatch, capsys, "export", model, tmp_path / "out")[0] == 0
    assert _cli(monkeypatch, capsys, "export", model, tmp_path / "out", "--overwrite")[0] == 0
    code, err = _cli(monkeypatch, capsys, "export", model, tmp_path / "out")
    assert code == 2 and "--overwrite" in _error_line(err)


def test_a_resume_from_a_checkpoint_that_is_not_there_says_so(tmp_path):
    """A path that does not exist (a checkpoint pruned by save_total_limit) was "not an rlzoo checkpoint (no
    trainer_state.json)"; it names the checkpoints there are."""
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in (2, 3):
        (checkpoints / f"step-00000{step}").mkdir(parents=True)
        (checkpoints / f"step-00000{step}" / "trainer_state.json").write_text("{}")
    finder = Checkpointer(CheckpointConfig(), checkpoints)
    with pytest.raises(FileNotFoundError, match=r"step-000001: no such checkpoint; .* holds step-000002, step-000003 "
                                                r"\(older checkpoints are pruned by --save-total-limit\)"):
        finder.find(str(checkpoints / "step-000001"))
    with pytest.raises(FileNotFoundError, match=r"^--resume /nonexistent/step-1: no such checkpoint$"):
        finder.find("/nonexistent/step-1")
    # Checkpointer.find takes paths (a bare name, as the listing shows them, is looked up by the config below):
    # the message lists the run's and shows the path
    with pytest.raises(FileNotFoundError, match=rf"^--resume step-000002: no such checkpoint; {re.escape(str(checkpoints))}"
                                                rf" holds step-000002, step-000003 .*: give its path, e.g. --resume "
                                                rf"{re.escape(str(checkpoints / 'step-000002'))} \(or, with the run's "
                                                r"--output-dir, its name\), or --resume latest$"):
        finder.find("step-000002")
    run = checkpoints.parent  # the run directory given as --resume (user trial): said only "not an rlzoo checkpoint"
    (run / "config.json").write_text('{"max_steps": 3, "segments": []}')
    with pytest.raises(FileNotFoundError, match=rf"^--resume {run}: not an rlzoo checkpoint \(no trainer_state.json\); "
                                                rf"it is a run directory: continue it with --output-dir {run} --resume "
                                                rf"latest, or start a new run from one of its checkpoints: --resume "
                                                rf"{checkpoints}/step-N$"):
        finder.find(str(run))


def test_a_checkpoint_is_resumed_by_its_name_in_the_output_dir(tmp_path, monkeypatch):
    """--resume step-000001 was refused with "no such checkpoint; RUN/checkpoints holds step-000001" (rlzoo eval
    --checkpoint takes names): a bare name that is no path here names the output dir's checkpoint of that name or
    step, as a path (what the run records); a checkpoint's model/ names the checkpoint; other values are kept."""
    run = tmp_path / "run"
    for step in (2, 30):
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").write_text("{}")
    for name, step in (("step-000002", 2), ("step-2", 2), ("step-30", 30)):
        assert TrainConfig(output_dir=str(run), resume=name).resume == str(run / "checkpoints" / f"step-{step:06d}")
    assert TrainConfig(output_dir=str(run), resume="latest").resume == "latest"
    (run / "checkpoints" / "step-000002" / "model").mkdir()  # its model/, as rlzoo eval and export take it
    assert TrainConfig(resume=str(run / "checkpoints" / "step-000002" / "model")).resume == \
        str(run / "checkpoints" / "step-000002")
    with pytest.raises(ValueError, match="resume must be"):
        TrainConfig(output_dir=str(run), resume="step-3")  # no such checkpoint
    monkeypatch.chdir(tmp_path)
    (tmp_path / "step-2").mkdir()  # a directory of that name here is what the name means
    assert TrainConfig(output_dir=str(run), resume="step-2").resume == "step-2"
    assert parse_train_args(["--output-dir", str(run), "--resume", "step-30", "--model", "tiny-random"]).resume == \
        str(run / "checkpoints" / "step-000030")


def test_a_start_that_wrote_no_checkpoint_is_not_offered_to_resume(tmp_path):
    """A start that failed before its first checkpoint (a broken reward) left config.json and an empty
    metrics.jsonl; the next fresh start was told to "continue it with --resume latest", which has nothing to
    continue. It is told to use --resume auto or --overwrite, and --resume auto starts fresh."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"max_steps": 1, "segments": []}')
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match=r"holds a start that wrote no checkpoint .* --resume auto .* --overwrite"):
        Trainer(_config(run, max_steps=1))
    fork = RunDirectory(run, resume=str(tmp_path / "other" / "checkpoints" / "step-000001"))
    with pytest.raises(FileExistsError, match=r"start over with --overwrite") as refused:
        fork.check()  # a fork from another run's checkpoint: --resume auto would drop that checkpoint
    assert "--resume auto" not in str(refused.value)
    _train(run, max_steps=1, eval_size=0, resume="auto")
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1]


# ------------------------------------------------------------------------------------------- 3. timelines
def test_config_segments_hold_the_timeline_of_the_checkpoint_a_run_starts_from(tmp_path):
    """config.json's segments drop those of abandoned work: the ones started after the resumed step, and those that
    resumed at it (a second resume from checkpoint 2 kept the first one's segment, whose timeline went to abandoned/;
    a fork from checkpoint 3 inherited the source run's segment that resumed at 3). The fresh start at step 0 stays."""
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()

    def start(step: int, resumed_from: str | None, lr: float) -> None:
        run.write_config({"learning_rate": lr}, {}, start_step=step, resumed_from=resumed_from, changes={})

    start(0, None, 1e-3)
    start(2, "ck/step-000002", 2e-3)
    start(4, "ck/step-000004", 3e-3)
    start(2, "ck/step-000002", 4e-3)  # back to checkpoint 2: the segments at 2 and 4 were abandoned work
    segments = json.loads((run.path / "config.json").read_text())["segments"]
    assert [(s["start_step"], s["settings"]["learning_rate"]) for s in segments] == [(0, 1e-3), (2, 4e-3)]
    fork = RunDirectory(tmp_path / "fork")
    fork.path.mkdir()
    fork.write_config({}, {}, start_step=2, resumed_from="ck/step-000002", changes={}, source=run.path / "config.json")
    segments = json.loads((fork.path / "config.json").read_text())["segments"]
    assert [(s["start_step"], s["settings"]) for s in segments] == [(0, {"learning_rate": 1e-3}), (2, {})]
    start(0, "ck/step-000000", 5e-3)  # resumed at step 0: the fresh start's segment stays
    segments = json.loads((run.path / "config.json").read_text())["segments"]
    assert [(s["start_step"], s["resumed_from"]) for s in segments] == [(0, None), (0, "ck/step-000000")]


def test_an_abandoned_timeline_takes_its_completions_tables_along(tmp_path):
    """Resuming in place from checkpoint 2 moved the later checkpoints and metrics rows to abandoned/ but left the
    completions tables of steps 3 and 4 in completions/, where a new timeline without --log-completions kept showing
    them as its own."""
    run = RunDirectory(tmp_path / "run")
    (run.path / "completions").mkdir(parents=True)
    for n in (1, 2, 3, 4):
        (run.checkpoints / f"step-{n:06d}").mkdir(parents=True)
        (run.path / "completions" / f"step-{n:06d}.parquet").write_text(str(n))
    (run.path / "metrics.jsonl").write_text("".join(json.dumps({"step": n}) + "\n" for n in (1, 2, 3, 4)))
    target = run.abandon_after(2)
    assert sorted(p.name for p in (run.path / "completions").iterdir()) == ["step-000001.parquet", "step-000002.parquet"]
    assert sorted(p.name for p in (target / "completions").iterdir()) == ["step-000003.parquet", "step-000004.parquet"]
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == ["step-000003", "step-000004"]


def test_train_runs_once_and_a_second_call_touches_nothing(tmp_path):
    """A second ``train()`` on the same Trainer (a notebook continuing after RunInterrupted) re-ran the start: with
    ``overwrite=True`` it deleted the finished run's checkpoints and metrics and returned []. It is refused, naming
    how to continue, and the run's files stay as they were."""
    run = tmp_path / "run"
    trainer, history = _train(run, max_steps=2, save_steps=1, eval_size=0, overwrite=True)
    files = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != "lock"}
    with pytest.raises(RuntimeError, match=r"Trainer.train\(\) runs once, and this Trainer was started \(at step 2\).*"
                                           r"resume_config\("):
        trainer.train()
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != "lock"} == files
    assert [r["step"] for r in history] == [1, 2]


def test_resuming_an_older_checkpoint_starts_a_new_timeline(tmp_path):
    run = tmp_path / "run"
    common = {"save_steps": 1, "save_total_limit": 5, "eval_size": 0}
    _train(run, max_steps=3, **common)
    _train(run, max_steps=2, resume=str(run / "checkpoints" / "step-000001"), **common)
    assert [p.name for p in Checkpointer(CheckpointConfig(), run / "checkpoints").all()] == ["step-000001",
                                                                                               "step-000002"]
    (abandoned,) = (run / "abandoned").iterdir()
    assert sorted(p.name for p in (abandoned / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert [r["step"] for r in _rows(abandoned / "metrics.jsonl")] == [1, 2, 3]  # the old timeline, whole
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    trainer, history = _train(run, max_steps=3, resume="latest", **common)
    assert [r["step"] for r in history] == [1, 2, 3] and trainer.checkpointer.find("latest").name == "step-000003"
    assert (abandoned / "checkpoints" / "step-000003").is_dir()  # never picked again
    # an abandoned checkpoint is not resumed in place, and --overwrite beside it deletes nothing (it deleted the
    # whole run, that checkpoint included); forked into another directory, its whole timeline's rows come along
    old = abandoned / "checkpoints" / "step-000003"
    with pytest.raises(ValueError, match=r"abandoned; continue it as a new run in another directory: --output-dir NEW"):
        RunDirectory(run, resume=str(old)).check()
    with pytest.raises(ValueError, match="--overwrite and --resume .* contradict"):
        RunDirectory(run, resume=str(old), overwrite=True).check()
    assert old.is_dir() and (run / "checkpoints" / "step-000003").is_dir()
    _train(tmp_path / "fork", max_steps=4, resume=str(old), **common)
    assert [r["step"] for r in _rows(tmp_path / "fork" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert _rows(tmp_path / "fork" / "metrics.jsonl")[:3] == _rows(abandoned / "metrics.jsonl")


def test_a_fork_of_an_abandoned_timeline_keeps_its_rows_and_segments_after_later_abandons(tmp_path, caplog):
    """Two abandons, the second going back before the first's step (resume from 3, then from 1): a fork of the
    first abandoned timeline's step-4 checkpoint continues that timeline's rows 1-4 and its segments (they were
    read from RUN/metrics.jsonl, which by then held rows 1 only, and the segments started afresh)."""
    run = tmp_path / "run"
    common = {"save_steps": 1, "save_total_limit": 10, "eval_size": 0}
    _, first = _train(run, max_steps=4, **common)
    _train(run, max_steps=5, resume=str(run / "checkpoints" / "step-000003"), **common)
    _train(run, max_steps=2, resume=str(run / "checkpoints" / "step-000001"), **common)
    timelines = {int(p.name.split("-")[2]): p for p in (run / "abandoned").iterdir()}
    assert sorted(timelines) == [1, 3]
    segments = json.loads((run / "config.json").read_text())["segments"]
    assert [s["start_step"] for s in segments] == [0, 1]  # the segment from step 3 went with its timeline
    assert [s["start_step"] for s in json.loads((timelines[1] / "config.json").read_text())["segments"]] == [0, 3]
    assert [r["step"] for r in _rows(timelines[1] / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    fork = tmp_path / "fork"
    with caplog.at_level("INFO", logger="rlzoo.train"):
        _train(fork, max_steps=5, resume=str(timelines[3] / "checkpoints" / "step-000004"), **common)
    assert (f"resume: checkpoint {timelines[3] / 'checkpoints' / 'step-000004'} continues as a new run in {fork} (its "
            "metrics up to step 4 come along)") in [r.getMessage() for r in caplog.records]
    rows = _rows(fork / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[:4] == first
    segments = json.loads((fork / "config.json").read_text())["segments"]
    assert [(s["start_step"], s["resumed_from"]) for s in segments] == [
        (0, None), (4, str((timelines[3] / "checkpoints" / "step-000004").resolve()))]


def test_a_resume_of_another_runs_checkpoint_without_output_dir_says_where_it_goes(tmp_path, monkeypatch, caplog):
    """``--resume RUN/checkpoints/step-N`` without ``--output-dir`` forks into a new runs/... directory (TRL users
    expect RUN to go on): the log says so, and how to continue RUN itself."""
    run = tmp_path / "run"
    _train(run, max_steps=1, save_steps=1, eval_size=0)
    monkeypatch.chdir(tmp_path)
    checkpoint = run / "checkpoints" / "step-000001"
    with caplog.at_level("INFO", logger="rlzoo.train"):
        trainer, _ = _train(None, max_steps=2, eval_size=0, resume=str(checkpoint))
    assert trainer.run_dir.path.parent.name == "runs"
    assert (f"resume: checkpoint {checkpoint} continues as a new run in {trainer.run_dir.path} (its metrics up to "
            f"step 1 come along; --output-dir {run.resolve()} continues that run instead)") in [
        r.getMessage() for r in caplog.records]


def test_checkpoints_order_by_step_number_and_ignore_temporaries(tmp_path):
    for name in ("step-999999", "step-1000000", "step-000010", ".step-2000000.abcd1234.tmp", ".step-000011.old",
                 "notes"):
        (tmp_path / name).mkdir()
    checkpointer = Checkpointer(CheckpointConfig(), tmp_path)
    assert [p.name for p in checkpointer.all()] == ["step-000010", "step-999999", "step-1000000"]
    assert checkpointer.find("latest").name == "step-1000000"


# --------------------------------------------------------------------------------------------- 4. signals
def test_sigterm_finishes_the_step_checkpoints_it_and_resume_continues_exactly(tmp_path):
    """Preemption during step 2: the step completes, is checkpointed (save_steps would not have), the run
    raises RunInterrupted (exit code 143), and resuming reproduces the uninterrupted run bit for bit."""
    full, want = _train(tmp_path / "full", max_steps=3, eval_size=0, save_steps=100)
    calls = []

    def preempted(prompts, completions, **columns):
        calls.append(len(prompts))
        if len(calls) == 3:  # the dry check, step 1, then during step 2's generation
            os.kill(os.getpid(), signal.SIGTERM)
        return digit_fraction(prompts, completions)

    preempted.__name__ = "digit_fraction"  # the same metric names as the uninterrupted run
    run = tmp_path / "run"
    trainer = Trainer(_config(run, max_steps=3, eval_size=0, save_steps=100), reward_funcs=[preempted])
    with pytest.raises(RunInterrupted) as stop:
        trainer.train()
    assert (stop.value.signum, stop.value.step, stop.value.exit_code) == (signal.SIGTERM, 2, 143)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    resumed, got = _train(run, max_steps=3, eval_size=0, save_steps=100, resume="latest")
    assert _untimed(got) == _untimed(want)
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_second_ctrl_c_exits_at_once_and_leaves_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    reward = tmp_path / "twice.py"
    reward.write_text(
        "import os, signal\ncalls = []\n"
        "def reward(prompts, completions, **kw):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return [0.0] * len(completions)\n")
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--max-steps", "3", "--save-steps", "1",
                     "--reward-funcs", f"{reward}:reward", "--output-dir", run)
    assert code == 130 and "interrupted" in err
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000001"]
    assert _hidden(run) == [] and _hidden(run / "checkpoints") == []
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1]


def test_the_console_script_exits_143_after_sigterm(tmp_path, monkeypatch, capsys):
    reward = tmp_path / "term.py"
    reward.write_text(
        "import os, signal\ncalls = []\n"
        "def reward(prompts, completions, **kw):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return [0.0] * len(completions)\n")
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--max-steps", "3",
                     "--reward-funcs", f"{reward}:reward", "--output-dir", tmp_path / "run")
    assert code == 143 and "SIGTERM after step 1" in err and "--resume latest" in err


# ----------------------------------------------------------------------------- 5. interrupted writes
def test_leftovers_of_interrupted_writes_are_removed_and_a_moved_aside_checkpoint_is_put_back(tmp_path):
    run = tmp_path / "run"
    common = {"save_steps": 1, "save_total_limit": 5, "eval_size": 0}
    _train(run, max_steps=2, **common)
    checkpoints = run / "checkpoints"
    os.replace(checkpoints / "step-000002", checkpoints / ".step-000002.old")  # killed between the two renames
    (checkpoints / ".step-000003.abcd1234.tmp").mkdir()  # killed while writing a checkpoint
    (checkpoints / ".step-000003.abcd1234.tmp" / "optimizer.pt").write_bytes(b"partial")
    (run / ".metrics.jsonl.x1y2z3a4.tmp").write_text("partial")
    _, history = _train(run, max_steps=3, resume="latest", **common)
    assert [r["step"] for r in history] == [1, 2, 3]  # resumed from the restored step 2
    assert _hidden(run) == [] and _hidden(checkpoints) == []
    assert [p.name for p in Checkpointer(CheckpointConfig(), checkpoints).all()] == [
        "step-000001", "step-000002", "step-000003"]


# ------------------------------------------------------------------------------------------------ 6. lock
def test_one_run_per_directory_and_a_stale_lock_is_taken_over(tmp_path, caplog):
    run = tmp_path / "run"
    trainer = Trainer(_config(run, max_steps=1, eval_size=0), reward_funcs=[digit_fraction])
    with RunDirectory(run).lock(), pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        trainer.train()
    with pytest.raises(RuntimeError, match=r"runs once"):  # a retry would skip __init__'s directory checks
        trainer.train()
    run.mkdir()  # (the refused start left no directory)
    (run / ".rlzoo.lock").write_text(json.dumps({"pid": 999999, "host": "gone"}))  # a run killed with -9
    trainer = Trainer(_config(run, max_steps=1, eval_size=0), reward_funcs=[digit_fraction])
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        assert trainer.train()[-1]["step"] == 1
    assert "taking over the lock of a run that ended without releasing it (pid 999999, host gone)" in caplog.text
    assert (run / ".rlzoo.lock").read_text() == ""  # released cleanly


def test_a_directory_the_lock_created_for_a_start_that_wrote_nothing_is_removed(tmp_path):
    """A start refused under the lock (a resume of a checkpoint written mid-cycle by another world size) left a new
    output directory holding only the lock file; a directory that existed, or that the run wrote to, stays."""
    new = tmp_path / "fork" / "run"
    with pytest.raises(ValueError, match="refused"), RunDirectory(new).lock():
        assert (new / ".rlzoo.lock").is_file()
        raise ValueError("refused")
    assert not new.exists() and (tmp_path / "fork").is_dir()  # only the directory the lock made
    existing = tmp_path / "existing"
    existing.mkdir()
    with RunDirectory(existing).lock():
        pass
    assert [p.name for p in existing.iterdir()] == [".rlzoo.lock"]
    with RunDirectory(new).lock():
        (new / "config.json").write_text("{}")
    assert sorted(p.name for p in new.iterdir()) == [".rlzoo.lock", "config.json"]


def test_a_live_run_is_refused_as_live_before_its_files_are_read(tmp_path, monkeypatch):
    """User trial: while a fresh run was live in L (no checkpoint yet), a second start said L "holds a start that
    wrote no checkpoint (it stopped before its first)" and `--resume latest` "no checkpoint under L/checkpoints",
    suggesting commands the lock would then refuse. Both name the live run now, before the model loads."""
    run = tmp_path / "L"
    monkeypatch.setattr("rlzoo.trainer.models.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with RunDirectory(run).lock():  # the live run, having written its config and first metrics
        (run / "config.json").write_text(json.dumps({"max_steps": 3, "segments": []}))
        (run / "metrics.jsonl").write_text("")
        for resume in (None, "latest"):
            with pytest.raises(RunLockedError, match=f"^output directory {run}: another run is using it \\(pid {os.getpid()}"):
                Trainer(_config(run, resume=resume))
    with pytest.raises(FileExistsError, match="holds a start that wrote no checkpoint"):  # the run has stopped
        Trainer(_config(run))


# ----------------------------------------------------------------------------------------------- 7. umask
def test_outputs_respect_the_umask(tmp_path):
    run = tmp_path / "run"
    previous = os.umask(0o002)
    try:
        _train(run, max_steps=1)
    finally:
        os.umask(previous)
    checkpoint = run / "checkpoints" / "step-000001"
    for path in (run / "config.json", run / "metrics.jsonl", run / "reward.png", checkpoint / "rollouts-rank0.pt",
                 checkpoint / "scheduler.pt", checkpoint / "trainer_state.json", checkpoint / "dcp" / ".metadata",
                 checkpoint / "model" / "model.safetensors"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
    for path in (run / "checkpoints", checkpoint, checkpoint / "model", checkpoint / "dcp"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o775, path


# ---------------------------------------------------------------------------------------------- 8. metrics
def test_metrics_are_appended_and_a_torn_last_line_is_repaired(tmp_path, caplog):
    run = tmp_path / "run"
    inodes = []

    def watch(prompts, completions, **columns):
        if (run / "metrics.jsonl").exists():
            inodes.append((run / "metrics.jsonl").stat().st_ino)
        return digit_fraction(prompts, completions)

    Trainer(_config(run, max_steps=3, save_steps=1, save_total_limit=5), reward_funcs=[watch]).train()
    assert len(inodes) >= 3 and len(set(inodes)) == 1  # appended to, never rewritten
    assert "history" not in json.loads((run / "checkpoints" / "step-000003" / "trainer_state.json").read_text())
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": 0.')  # a kill in the middle of a write
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        _train(run, max_steps=4, resume="latest")
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert "its last line was cut off" in caplog.text  # said, not silently dropped


# -------------------------------------------------------------------------------------------- 9. fail fast
def test_a_bad_data_row_fails_before_the_model_loads(tmp_path, monkeypatch):
    """The task is built before the models (a hub download or a GGUF conversion can take minutes): a row without
    an answer is refused first."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}", **({} if i == 3 else {"answer": "1"})}) + "\n"
                            for i in range(10)))
    monkeypatch.setattr("rlzoo.trainer.models.load_model", _no_model)
    monkeypatch.setattr("rlzoo.trainer.adapters.build_policy", _no_model)
    with pytest.raises(ValueError, match=r"row 3 \(line 4\): the answer column 'answer' is missing"):
        Trainer(_config(tmp_path / "run", task=str(data)))


def test_a_broken_reward_fails_before_the_first_evaluation(tmp_path, monkeypatch):
    def broken(prompts, completions, **columns):
        return [columns["solution"][0]] * len(completions)  # a column the task does not have

    trainer = Trainer(_config(tmp_path / "run", eval_size=200), reward_funcs=[broken])
    evaluated = []
    monkeypatch.setattr(trainer.evaluator, "run", lambda *args, **kwargs: evaluated.append(args))
    with pytest.raises(RewardFunctionError, match="'broken' raised KeyError"):
        trainer.train()
    assert not evaluated
    # nothing was written (a config.json and an empty metrics.jsonl made the fixed command's rerun refused as a
    # "start that wrote no checkpoint", helper trial), nor left (the directory the start made is gone): the same
    # command runs once the reward is fixed
    assert not (tmp_path / "run").exists()
    assert _train(tmp_path / "run", max_steps=1, eval_size=0)[1][-1]["step"] == 1


def test_an_unwritable_output_dir_fails_before_the_model_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr("rlzoo.trainer.models.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(OSError, match="output directory is not writable"):
        Trainer(_config(blocker / "run"))


def test_an_output_dir_inside_another_runs_files_is_refused(tmp_path, monkeypatch):
    """User trial: `--output-dir RUN/checkpoints/step-000003` (or RUN/checkpoints, RUN/abandoned) trained into the
    other run's files, which its --overwrite, pruning or a new timeline then deleted; and a copied checkpoint."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-000003"
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"step": 3}')
    (run / "config.json").write_text('{"max_steps": 3, "segments": []}')
    monkeypatch.setattr("rlzoo.trainer.models.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for inside in (checkpoint, run / "checkpoints", run / "abandoned" / "x"):
        with pytest.raises(ValueError, match=rf"^--output-dir {re.escape(str(inside))} is (inside )?the "
                                             rf"(checkpoints|abandoned) of the training run '.*/run': that run's "
                                             r"--overwrite, pruning or next timeline would delete a run there"):
            Trainer(_config(inside))
    with pytest.raises(ValueError, match=rf"; to continue that run from it: --output-dir {re.escape(str(run))} "
                                         rf"--resume {re.escape(str(checkpoint))}$"):
        Trainer(_config(checkpoint))
    copied = tmp_path / "copied"
    copied.mkdir()
    (checkpoint / "trainer_state.json").rename(copied / "trainer_state.json")
    (checkpoint / "model").rename(copied / "model")
    with pytest.raises(ValueError, match=r"is inside the rlzoo checkpoint '.*/copied': a run there would be mixed"):
        Trainer(_config(copied / "run"))
    with pytest.raises(ValueError, match=rf"; to start a new run from it: --output-dir NEW --resume {copied}$"):
        Trainer(_config(copied))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoints", "config.json", "copied", "model", "run",
                                                           "step-000003", "trainer_state.json"]
    kept = tmp_path / "kept"  # a folder of copied checkpoints is no run (reviewer): a run may be written there
    (kept / "checkpoints").mkdir(parents=True)
    (copied).rename(kept / "checkpoints" / "step-000003")
    from rlzoo.trainer.run_dir import inside_a_run
    assert inside_a_run(kept / "checkpoints" / "new-run") is None
    # the run's lock file: an evaluation written there was emptied by the run's next start (user trial)
    assert inside_a_run(tmp_path / "run" / ".rlzoo.lock") == (
        f"is the .rlzoo.lock of the training run {str(tmp_path / 'run')!r}", tmp_path / "run")


# ----------------------------------------------------------------------------------------- 10. one-line errors
@pytest.mark.parametrize(("name", "content", "flags", "message"), [
    ("run.yaml", "max_steps: [1\n", ["--config"], r"run\.yaml:2:1: YAML syntax error"),
    ("run.toml", "max_steps = 1\nlearning_rate = \n", ["--config"], r"run\.toml: TOML syntax error: .*line 2"),
    # a value or key the settings refuse named no file; a key given twice was kept silently (the last one)
    ("run.toml", 'max_steps = "two"\n', ["--config"], r"run\.toml: max_steps must be an integer, got 'two'"),
    ("run.yaml", "max_stepz: 2\n", ["--config"], r"run\.yaml: unknown config keys \['max_stepz'\]"),
    ("run.yaml", "max_steps: 1\nmax_steps: 2\n", ["--config"], r"run\.yaml:2:1: YAML syntax error: duplicate key"),
    ("run.json", '{"max_steps": 1, "max_steps": 2}', ["--config"], r"run\.json: duplicate key\(s\) \['max_steps'\]"),
    ("task.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff", "answer": "2"}\n', ["--task"],
     r"task\.jsonl:2: not UTF-8 text"),
    ("rewards.py", "VALUE = 3\n", ["--reward-funcs", "{path}:missing"], r"rewards\.py:missing.*no attribute 'missing'"),
    ("rewards.py", "VALUE = 3\n", ["--reward-funcs", "{path}:VALUE"], r"'VALUE' is a int, not callable"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, name, content, flags, message):
    import re

    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    flags = [f.format(path=path) for f in flags] + ([] if "{path}" in "".join(flags) else [path])
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--max-steps", "1", "--output-dir",
                     tmp_path / "run", *flags)
    assert code == 2 and re.search(message, _error_line(err)), err


def test_a_checkpoint_of_another_model_names_the_first_mismatched_tensor(tmp_path, monkeypatch, capsys):
    model_dir, run = tmp_path / "model", tmp_path / "run"
    for spec in (TinyRandomSpec(), TinyRandomSpec(hidden_size=32)):
        model, tokenizer = build_tiny_random(spec)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        if spec.hidden_size == 64:  # train on the first, then replace it by a narrower one of the same path
            _train(run, model=str(model_dir), max_steps=1, eval_size=0)
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--model", model_dir, "--max-steps", "2",
                     "--reward-funcs", "accuracy", "--output-dir", run, "--resume", "latest")  # (was a Python callable)
    assert code == 2
    assert "step-000001 does not fit the model: model.embed_tokens.weight has shape (259, 64) in the checkpoint " \
           "and (259, 32) in the model" in _error_line(err)


def test_disk_full_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if hasattr(f, "name") and str(f.name).endswith("rollouts-rank0.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--max-steps", "2", "--reward-funcs", "accuracy",
                     "--output-dir", run, "--resume", "latest")  # (the run's reward was a Python callable)
    line = _error_line(err)
    assert code == 2 and "no space left on device" in line and "step-000002/rollouts-rank0.pt" in line
    assert "(free space; --resume latest continues from step-000001)" in line  # what to do (user trial)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000001"] and _hidden(run / "checkpoints") == []


# -------------------------------------------------------------------------------------------- 11. tokenizer
def test_the_saved_tokenizer_is_the_configured_one(tmp_path):
    """Generation pads on the left, which a fast tokenizer remembers in its backend; the checkpoint's tokenizer
    files are those of the untouched tokenizer."""
    run = tmp_path / "run"
    _train(run, max_steps=1)
    _, tokenizer = build_tiny_random()
    tokenizer.save_pretrained(tmp_path / "fresh")
    saved = run / "checkpoints" / "step-000001" / "model"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((saved / name).read_text()) == json.loads((tmp_path / "fresh" / name).read_text()), name


# ------------------------------------------------------------------------------------------------ structure
def test_the_training_loop_reads_in_one_screen():
    assert len(inspect.getsource(Trainer.train).splitlines()) <= 25


def test_the_progress_bar_stays_out_of_log_files(tmp_path, monkeypatch):
    """The default progress bar (on) draws on a terminal only: into a file (a Slurm log) it wrote a line per
    redraw."""
    import io

    from rlzoo.trainer.metrics import MetricsLogger

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr("sys.stderr", stream)
        logger = MetricsLogger(tmp_path / f"run-{drawn}", max_steps=3, progress=True)
        logger.open(0)
        logger.close()
        assert ("train:" in stream.getvalue()) is drawn, stream.getvalue()


def test_a_plot_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, caplog):
    """The plot is drawn after a stop's checkpoint, before RunInterrupted: a full disk while drawing it replaced the
    interrupt (exit 2 instead of 130 / 143, which requeue scripts read). It is a warning naming the file."""
    from rlzoo.trainer.metrics import MetricsLogger

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rlzoo.trainer.metrics.plot_metrics", full)
    logger = MetricsLogger(tmp_path / "run", max_steps=3, progress=False)
    logger.open(0)
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        assert logger.plot() == tmp_path / "run" / "reward.png"
    logger.close()
    assert "could not write the plot" in caplog.text and "No space left on device" in caplog.text
    assert "reward.png" in caplog.text



@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A run of two steps with a checkpoint of each (copied by each test that damages one)."""
    run = tmp_path_factory.mktemp("two") / "run"
    from rlzoo.cli import main

    assert main(["train", *TINY_FLAGS, "--output-dir", str(run), "--max-steps", "2", "--save-steps", "1",
                 "--save-total-limit", "3"]) == 0
    return run


@pytest.mark.parametrize("file", ["trainer_state.json", "dcp/.metadata", "dcp/__0_0.distcp", "scheduler.pt",
                                  "rng-rank0.pt", "rollouts-rank0.pt"])
def test_a_damaged_checkpoint_file_is_named_with_the_checkpoint_to_resume_from_instead(file, two_checkpoints, tmp_path,
                                                                                        monkeypatch, capsys):
    """A checkpoint file cut short (a copy, a full disk) gave torch's or pickle's traceback, or a line naming no
    file ("[Errno 22] Invalid argument", "Expecting value: line 57 ...") (user trial): one line names the checkpoint
    and the file, and the earlier checkpoint to resume from."""
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    damaged = run / "checkpoints" / "step-000002" / file
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "3")
    lines = [line for line in err.splitlines() if line.startswith("rlzoo: error")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"rlzoo: error: checkpoint {run / 'checkpoints' / 'step-000002'}: "
                               f"{file.split('/')[0] if file.endswith('distcp') else file}"), lines[0]
    assert f"resume from the earlier checkpoint instead: --resume {run / 'checkpoints' / 'step-000001'}" in lines[0]


def test_only_a_file_that_cannot_be_read_is_called_damaged(tmp_path):
    """The damaged-checkpoint line is for bytes that cannot be read or decoded; a second Ctrl-C during the load
    (DCP wraps it in a CheckpointException), a rank gone under torchrun, or a state that does not fit pass unchanged
    (review: they were called damage, advising to throw away a good checkpoint)."""
    import pickle

    from torch.distributed.checkpoint.api import CheckpointException

    from rlzoo.trainer.checkpoint_files import DamagedCheckpointError, reading

    checkpoint = tmp_path / "checkpoints" / "step-000002"
    for unreadable in (pickle.UnpicklingError("pickle data was truncated"), OSError(22, "Invalid argument"),
                       RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory"),
                       CheckpointException("x", {0: (EOFError("Ran out of input"), None)})):
        kind = "EOFError" if isinstance(unreadable, CheckpointException) else type(unreadable).__name__
        with pytest.raises(DamagedCheckpointError, match=rf"^checkpoint {re.escape(str(checkpoint))}: f.pt cannot be "
                                                         rf"read \({kind}"), reading(checkpoint, "f.pt"):
            raise unreadable
    for other in (CheckpointException("x", {0: (KeyboardInterrupt(), None)}),
                  RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:44188"),
                  RuntimeError("Missing key in checkpoint state_dict: optimizer.state.0.exp_avg")):
        with pytest.raises(type(other)), reading(checkpoint, "f.pt"):
            raise other
