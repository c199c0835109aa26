"""Watching a run: --report-to tensorboard / trackio / wandb (offline) with the metrics.jsonl names, the completions
table, and the plot. Tiny random model."""

import json

import pytest

from rlzoo.cli import main
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.plots import plot_metrics

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
    config = TrainConfig(model="tiny-random", num_generations=4, per_device_train_batch_size=8,
                         max_completion_length=4, eval_size=0, progress=False, max_steps=1, output_dir=str(run),
                         report_to="trackio,wandb", run_name="own-data-test", log_completions=True)
    row = Trainer(config).train()[-1]
    logs = trackio.sqlite_storage.SQLiteStorage.get_logs(project="rlzoo", run="own-data-test")
    scalar_rows = [entry for entry in logs if "reward" in entry]
    assert scalar_rows and scalar_rows[-1]["reward"] == pytest.approx(row["reward"])
    assert scalar_rows[-1]["step"] == 1 and any("completions" in entry for entry in logs)
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))  # wandb's offline log (wandb sync uploads it)


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
