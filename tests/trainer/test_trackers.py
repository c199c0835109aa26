"""Watching a run: --report-to tensorboard / trackio / wandb (offline) with the metrics.jsonl names, the completions
table, and the plot. Tiny random model."""

import dataclasses
import json
import re

import pytest
import torch

from rlzoo.cli import console_main, main
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.config import TrackingConfig
from rlzoo.trainer.plots import plot_metrics
from rlzoo.trainer.rewards import RewardFunctionError
from rlzoo.trainer.run_dir import RunDirectory
from rlzoo.trainer.trackers import Trackers

FLAGS = ["--model", "tiny-random", "--num-generations", "4", "--per-device-train-batch-size", "8",
         "--max-completion-length", "4", "--eval-size", "2", "--eval-batch-size", "2", "--no-progress"]


def test_report_to_tensorboard_writes_the_metric_tags(tmp_path):
    """The issue's check: `rlzoo train --report-to tensorboard` for 2 steps leaves an event file whose scalar tags
    are the metrics.jsonl names, at their optimizer steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--max-steps", "2", "--output-dir", str(run), "--report-to", "tensorboard"]) == 0
    (events,) = (run / "tensorboard").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {k for row in rows for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
    assert logged <= tags and {"reward", "loss", "eval/accuracy", "rewards/accuracy/std", "num_tokens"} <= tags
    assert [e.step for e in accumulator.Scalars("loss")] == [1, 2]
    assert [e.value for e in accumulator.Scalars("reward")] == pytest.approx([r["reward"] for r in rows[1:]])
    assert [e.step for e in accumulator.Scalars("eval/accuracy")] == [0, 2]


def test_trackio_and_wandb_offline_log_the_same_metrics(tmp_path, monkeypatch):
    import trackio.sqlite_storage

    run = tmp_path / "run"
    monkeypatch.setenv("WANDB_PROJECT", "from-env")  # transformers' variable: wandb's project, not trackio's
    config = TrainConfig(model="tiny-random", num_generations=4, per_device_train_batch_size=8,
                         max_completion_length=4, eval_size=2, eval_batch_size=2, progress=False, max_steps=1,
                         output_dir=str(run), report_to="trackio,wandb", run_name="own-data-test", log_completions=True)
    row = Trainer(config).train()[-1]
    record = json.loads((run / "trackers.json").read_text())
    (trackio_run,) = [r for r in trackio.sqlite_storage.SQLiteStorage.get_run_records("rlzoo")
                      if r["id"] == record["trackio_id"]]
    assert trackio_run["name"] == "own-data-test"  # the name given, as wandb shows it (it was own-data-test-ID)
    logs = trackio.sqlite_storage.SQLiteStorage.get_logs(project="rlzoo", run_id=record["trackio_id"])
    scalar_rows = [entry for entry in logs if "reward" in entry]
    assert scalar_rows and scalar_rows[-1]["reward"] == pytest.approx(row["reward"])
    assert scalar_rows[-1]["step"] == 1 and any("completions" in entry for entry in logs)
    (offline,) = (run / "wandb").glob("offline-run-*")
    (log,) = offline.glob("*.wandb")  # wandb's offline log (wandb sync uploads it)
    history: dict[str, list] = {}
    records = _wandb_records(log)
    assert {r.run.project for r in records if r.WhichOneof("record_type") == "run"} == {"from-env"}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                history.setdefault(item.key or "/".join(item.nested_key), []).append(json.loads(item.value_json))
    assert history["reward"][-1] == pytest.approx(row["reward"])
    assert history["rewards/accuracy/mean"][-1] == pytest.approx(row["rewards/accuracy/mean"])
    assert history["eval/accuracy"][-1] == pytest.approx(row["eval/accuracy"])
    assert history["completions/_type"] == ["table-file"]  # the completions table, its rows in the run's files
    (table,) = (offline / "files" / "media" / "table").glob("completions_*.table.json")
    table = json.loads(table.read_text())
    assert table["columns"] == ["step", "prompt", "completion", "accuracy", "advantage"] and len(table["data"]) == 8


def test_the_project_is_the_flag_else_wandb_project_for_wandb_else_rlzoo(monkeypatch):
    """WANDB_PROJECT was ignored (the project was always rlzoo) and no flag set it; --project is TRL's project."""
    from rlzoo.trainer.config import TrackingConfig

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert TrackingConfig().project_of("wandb") == TrackingConfig().project_of("trackio") == "rlzoo"
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert (TrackingConfig().project_of("wandb"), TrackingConfig().project_of("trackio")) == ("from-env", "rlzoo")
    assert {TrackingConfig(project="mine").project_of(t) for t in ("wandb", "trackio")} == {"mine"}
    with pytest.raises(ValueError, match="project"):
        TrainConfig(project=" ")


def _wandb_records(path) -> list:
    """The protobuf records (``wandb_internal_pb2.Record``) of a wandb offline log (``run-ID.wandb``). wandb 0.31
    ships no Python reader for it (wandb-core, in Go, reads it for ``wandb sync``), so this reads its framing: a
    7-byte header (``:W&B``, magic, version), then LevelDB-log records in 32 KiB blocks, each with a 7-byte header
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last); a block's tail shorter than a header is padding."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if (length, kind) == (0, 0):  # zero padding: the end of what was written
            break
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _trackio_runs(name: str, project: str = "rlzoo") -> list[list[int]]:
    """The steps of each trackio run of ``project`` named ``name``, in the order created."""
    from trackio.sqlite_storage import SQLiteStorage

    records = sorted((r for r in SQLiteStorage.get_run_records(project) if r["name"] == name),
                     key=lambda r: r["created_at"])
    return [[entry["step"] for entry in SQLiteStorage.get_logs(project=project, run_id=r["id"])
             if "x" in entry or "loss" in entry] for r in records]


def _wandb_ids(run) -> list[str]:
    """The wandb run id of each offline run under ``run/wandb`` (one per start: ``offline-run-TIME-ID``, with a
    ``-N`` suffix when a start in the same second already made that directory)."""
    names = [p.name for p in (run / "wandb").glob("offline-run-*")]
    return sorted(re.fullmatch(r"offline-run-[^-]+-([^-]+)(?:-\d+)?", name).group(1) for name in names)


def test_runs_in_directories_of_the_same_name_are_separate_tracker_runs(tmp_path):
    """exp1/seed0 and exp2/seed0 used to be one trackio run (named "seed0", resumed): steps 0-3, then 0-2 again."""
    opened = []
    for experiment, steps in (("exp1", 4), ("exp2", 3)):
        trackers = Trackers(TrackingConfig(report_to="trackio"), output_dir=tmp_path / experiment / "seed-names",
                            settings={})
        trackers.open(0)
        for step in range(steps):
            trackers.log({"step": step, "x": float(step)})
        trackers.close()
        opened.append(trackers)
    assert (_trackio_runs("exp1/seed-names"), _trackio_runs("exp2/seed-names")) == ([[0, 1, 2, 3]], [[0, 1, 2]])
    assert opened[0].run_id != opened[1].run_id


def test_tracker_runs_follow_the_runs_timelines(tmp_path):
    """A resume continues the tracker run; a resume from an older checkpoint (a new timeline) and --overwrite
    start new ones, in trackio and wandb alike. Before, wandb's id was a hash of the directory (--overwrite
    attached to the old run) and a new timeline logged its steps a second time into the old runs."""
    run = tmp_path / "run"
    base = TrainConfig(model="tiny-random", num_generations=4, per_device_train_batch_size=8, max_completion_length=4,
                       eval_size=0, progress=False, save_steps=1, output_dir=str(run), report_to="trackio,wandb")
    name = f"{tmp_path.name}/run"
    Trainer(dataclasses.replace(base, max_steps=2)).train()
    Trainer(dataclasses.replace(base, max_steps=3, resume="latest")).train()
    assert _trackio_runs(name) == [[1, 2, 3]]  # the same timeline: one tracker run, each step once
    first, again = _wandb_ids(run)
    assert first == again
    Trainer(dataclasses.replace(base, max_steps=3, resume=str(run / "checkpoints" / "step-000002"))).train()
    assert _trackio_runs(name) == [[1, 2, 3], [3]]  # back to step 2: a new timeline, a new tracker run
    (second,) = set(_wandb_ids(run)) - {first}
    Trainer(dataclasses.replace(base, max_steps=1, overwrite=True)).train()
    assert _trackio_runs(name)[2:] == [[1]]
    (third,) = _wandb_ids(run)
    assert third not in (first, second)


def test_a_timeline_whose_run_name_another_run_took_goes_on_in_a_new_trackio_run(tmp_path, caplog):
    """trackio continues the newest run of a name; when another directory started a run of the same --run-name
    since, the resumed timeline must not log into that one."""
    import logging

    def segment(directory: str, start: int, steps: range) -> Trackers:
        trackers = Trackers(TrackingConfig(report_to="trackio", run_name=f"{tmp_path.name}-shared"),
                            output_dir=tmp_path / directory, settings={})
        trackers.open(start)
        for step in steps:
            trackers.log({"step": step, "x": float(step)})
        trackers.close()
        return trackers

    def record(directory: str) -> dict:
        return json.loads((tmp_path / directory / "trackers.json").read_text())

    a = segment("a", 0, range(2))
    first = record("a")["trackio_id"]
    segment("b", 0, range(1))
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        again = segment("a", 1, range(2, 4))
    assert again.run_id == a.run_id and "is not this timeline's" in caplog.text
    assert _trackio_runs(f"{tmp_path.name}-shared") == [[0, 1], [0], [2, 3]]  # b's run holds b's step only
    assert record("a")["trackio_id"] not in (first, record("b")["trackio_id"])


def test_a_resume_into_another_project_says_so_and_starts_one_run_there(tmp_path, caplog):
    """--project changed on resume: the timeline went on in the other project with a warning that another run took
    its --run-name, and trackio made two runs there. It says the project moved and starts one run in it."""
    import logging

    def segment(project: str, start: int, steps: range) -> None:
        trackers = Trackers(TrackingConfig(report_to="trackio", run_name=f"{tmp_path.name}-p", project=project),
                            output_dir=tmp_path / "a", settings={})
        trackers.open(start)
        for step in steps:
            trackers.log({"step": step, "x": float(step)})
        trackers.close()

    segment(f"{tmp_path.name}-one", 0, range(2))
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        segment(f"{tmp_path.name}-two", 1, range(2, 4))
    assert (f"trackers: the trackio project is now '{tmp_path.name}-two', not '{tmp_path.name}-one' as before"
            in caplog.text) and "is not this timeline's" not in caplog.text
    assert _trackio_runs(f"{tmp_path.name}-p", f"{tmp_path.name}-one") == [[0, 1]]
    assert _trackio_runs(f"{tmp_path.name}-p", f"{tmp_path.name}-two") == [[2, 3]]


def test_a_run_recorded_before_trackio_ids_resumes_its_trackio_run(tmp_path, caplog):
    """A trackers.json written before trackio runs were named --run-name (no trackio_id: the run was NAME-ID) used
    to resume into a new trackio run named NAME; it continues the recorded NAME-ID run. A record whose run the
    trackio store does not hold goes on in a new run, with a warning."""
    import logging

    import trackio

    def old_run(directory: str, steps: range | None) -> str:
        """A run directory as rlzoo wrote it before: trackers.json without trackio_id, the trackio run NAME-ID."""
        timeline = f"{directory[:4]}0123"
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "trackers.json").write_text(json.dumps({"id": timeline, "start_step": 0, "step": 1}))
        name = f"{tmp_path.name}/{directory}"
        if steps is not None:
            run = trackio.init(project="rlzoo", name=f"{name}-{timeline}", group=name, resume="never",
                               auto_log_gpu=False, auto_log_cpu=False, embed=False)
            for step in steps:
                run.log({"x": float(step)}, step=step)
            run.finish()
        return name

    def resume(directory: str, start: int = 1) -> dict:
        trackers = Trackers(TrackingConfig(report_to="trackio"), output_dir=tmp_path / directory, settings={})
        trackers.open(start)
        for step in (start + 1, start + 2):
            trackers.log({"step": step, "x": float(step)})
        trackers.close()
        return json.loads((tmp_path / directory / "trackers.json").read_text())

    name = old_run("kept", range(2))
    record = resume("kept")
    assert _trackio_runs(f"{name}-kept0123") == [[0, 1, 2, 3]] and _trackio_runs(name) == []
    assert (record["id"], record["trackio_name"], record["step"]) == ("kept0123", f"{name}-kept0123", 3)
    assert resume("kept", 3)["trackio_id"] == record["trackio_id"]  # and again, now by the recorded name and id
    assert _trackio_runs(f"{name}-kept0123") == [[0, 1, 2, 3, 4, 5]]
    name = old_run("lost", None)
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        record = resume("lost")
    assert "which the trackio store does not hold" in caplog.text
    assert _trackio_runs(name) == [[2, 3]] and record["trackio_name"] == name


def test_wandb_without_credentials_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """Online wandb without a login used to fail after the model loaded with a UsageError traceback, leaving an
    empty metrics.jsonl that refused the next plain start."""
    import wandb

    for variable in ("WANDB_MODE", "WANDB_API_KEY", "RLZOO_DEBUG"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("rlzoo.trainer.adapters.build_policy", no_model)
    run = tmp_path / "run"
    monkeypatch.setattr("sys.argv", ["rlzoo", "train", *FLAGS, "--max-steps", "1", "--output-dir", str(run),
                                     "--report-to", "wandb"])
    wandb.teardown()  # forget the offline settings of earlier tests
    try:
        assert console_main() == 2
    finally:
        monkeypatch.undo()
        wandb.teardown()
    err = capsys.readouterr().err
    assert err.startswith("rlzoo: error: --report-to wandb cannot start: No API key configured")
    assert "WANDB_MODE=offline" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not RunDirectory(run).holds_run()  # the next start is not refused


def test_the_plot_has_its_panels_title_and_integer_steps(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    history = [{"step": 0, "eval/accuracy": 0.4, "eval/ci_low": 0.33, "eval/ci_high": 0.47}]
    for step in (1, 2, 3):
        history.append({"step": step, "reward": 0.3 + 0.1 * step, "loss": -0.01 * step, "kl": 0.001 * step,
                        "entropy": 1.0 - 0.1 * step, "completions/mean_length": 20 + step,
                        "completions/clipped_ratio": 0.1, "clip_ratio/region_mean": 0.0})
    history[-1].update({"eval/accuracy": 0.6, "eval/ci_low": 0.53, "eval/ci_high": 0.67})
    captured = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def capture(fig, *args, **kwargs):
        captured["fig"] = fig
        return real_savefig(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", capture)
        path = plot_metrics(history, tmp_path / "reward.png", title="grpo on chain_sum - tiny-random")
    assert path.stat().st_size > 0
    fig = captured["fig"]
    assert fig._suptitle.get_text() == "grpo on chain_sum - tiny-random"
    titles = [ax.get_title() for ax in fig.axes]
    for panel in ("loss", "KL to reference", "entropy (nats / token)", "clip ratio"):
        assert panel in titles
    top = fig.axes[0]
    assert [t for t in top.get_xticks() if 0 <= t <= 3] == [0, 1, 2, 3]  # one tick per step, integers
    accuracy_axis = next(ax for ax in fig.axes if ax.get_ylabel() == "held-out accuracy")
    assert accuracy_axis.collections  # the 95 % band


def test_report_to_takes_trls_list_form_in_config_files(tmp_path):
    """TRL's configs write ``report_to: [tensorboard, trackio]`` (``[]``: none); rlzoo's flag is the comma form."""
    from rlzoo.cli import parse_train_args

    path = tmp_path / "run.yaml"
    for listed, trackers in (("[tensorboard, trackio]", ("tensorboard", "trackio")), ("[]", ())):
        path.write_text(f"report_to: {listed}\nmodel: tiny-random\n")
        assert parse_train_args(["--config", str(path)]).trackers == trackers


def test_log_extra_columns_of_mixed_types_or_named_as_the_tables_own(tmp_path, caplog):
    """A log_extra column of mixed types (``[1, "n/a"]``) stopped the run at its first table write with pyarrow's
    25-line "Expected bytes, got a 'int' object"; it is written as text now, with one warning. A column named as one
    of the table's own (``completion``) replaced the completion text without a word: refused by the start-up check,
    before anything is written."""
    import datasets

    def judge(completions, log_extra, **kwargs):
        log_extra("parsed", [len(c) if i % 2 else "n/a" for i, c in enumerate(completions)])
        log_extra("length", torch.tensor([float(len(c)) for c in completions]))  # datasets converts tensors
        return [0.0] * len(completions)

    def clash(completions, log_extra, **kwargs):
        log_extra("completion", ["mine"] * len(completions))
        return [0.0] * len(completions)

    common = {"model": "tiny-random", "num_generations": 2, "per_device_train_batch_size": 4,
              "max_completion_length": 4, "eval_size": 0, "progress": False, "max_steps": 2, "log_completions": True,
              "reward_funcs": ()}
    run = tmp_path / "mixed"
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        Trainer(TrainConfig(**common, output_dir=str(run)), reward_funcs=[judge]).train()
    table = datasets.Dataset.from_parquet(str(run / "completions" / "step-000001.parquet"))
    assert table["parsed"][0] == "n/a" and table["parsed"][1].isdigit()
    assert table.features["length"].dtype == "float32"  # numbers, not "tensor(4.)"
    assert caplog.text.count("the log_extra column 'parsed' holds values of several types") == 1
    with pytest.raises(RewardFunctionError, match=r"^reward function 'clash' logged the column 'completion' with "
                                                  r"log_extra, one of the completions table's own \(advantage, clash, "
                                                  r"completion, prompt, step\), which it would replace"):
        Trainer(TrainConfig(**common, output_dir=str(tmp_path / "clash")), reward_funcs=[clash]).train()
    assert not (tmp_path / "clash" / "metrics.jsonl").exists()

    def advantage(completions, **kwargs):  # its column would be replaced by the advantages
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"^reward function 'advantage' is named as a column of the completions table "
                                         r"\(step, prompt, completion, advantage\), .*: rename it$"):
        Trainer(TrainConfig(**common, output_dir=str(tmp_path / "named")), reward_funcs=[advantage])
