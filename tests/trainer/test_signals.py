"""Run safety around stops: no completed step's metrics row is ever lost (a kill during the final evaluation,
which follows the last checkpoint), and repeated signals end a run with the exit code of the signal that ended
it (a repeated SIGTERM from a scheduler lets the checkpoint finish; a second Ctrl-C stops at once)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.interrupts import GracefulInterrupt, RunInterrupted

TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 4,
        "eval_size": 2, "eval_batch_size": 2, "progress": False, "max_steps": 2, "save_steps": 100}
TINY_FLAGS = ["--model", "tiny-random", "--num-generations", "4", "--per-device-train-batch-size", "8",
              "--max-completion-length", "4", "--eval-size", "0", "--no-progress"]
TIMING = ("step_time", "generation_time", "train_time", "tokens_per_second")


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(run) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


# ------------------------------------------------------------------- a kill during the final evaluation
def test_a_resume_writes_the_last_steps_row_that_a_kill_during_the_final_evaluation_lost(tmp_path):
    """The last step's checkpoint is written before the final evaluation (minutes on a real model). SIGKILL (an OOM
    kill, a scheduler's hard stop) during that evaluation leaves the checkpoint without its metrics row;
    ``--resume latest`` evaluates that step on the checkpoint's weights and writes the row (its training metrics
    the killed run's, carried by the checkpoint). (That the evaluation's numbers are the uninterrupted run's is
    the next test's: across processes they could differ by the thread count.)"""
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        from rlzoo.trainer import TrainConfig, Trainer
        trainer = Trainer(TrainConfig(**{TINY!r}, output_dir=sys.argv[1]))
        generate = trainer.evaluator.generator.generate
        def killed(*args, **kwargs):
            if trainer.step == 2:  # the final evaluation's first batch
                os.kill(os.getpid(), signal.SIGKILL)
            return generate(*args, **kwargs)
        trainer.evaluator.generator.generate = killed
        trainer.train()
        """))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert [r["step"] for r in _rows(run)] == [0, 1]  # step 2's row is lost with the process
    assert _checkpoints(run) == ["step-000002"]

    got = Trainer(TrainConfig(**TINY, output_dir=str(run), resume="latest")).train()
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]  # exactly one row per step
    assert rows == got
    assert "eval/accuracy" in rows[-1] and "eval/accuracy" in rows[0]
    carried = json.loads((run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["row"]
    assert {k: v for k, v in rows[-1].items() if not k.startswith("eval/")} == carried  # bit for bit, timings too
    assert {k for k in carried if k not in TIMING} >= {"loss", "reward", "grad_norm"}
    # a second resume finds the row: the run is complete, and --resume latest says so
    with pytest.raises(ValueError, match="nothing to train"):
        Trainer(TrainConfig(**TINY, output_dir=str(run), resume="latest")).train()
    assert len(_rows(run)) == 3


def test_a_row_torn_by_a_kill_after_the_final_evaluation_is_rewritten_identically(tmp_path):
    """A kill while the last row is appended (a torn line, repaired at the next start) loses the row too; the
    resume rewrites it byte for byte (same process: the evaluation's numbers are the same; timings from the
    checkpoint)."""
    run = tmp_path / "run"
    Trainer(TrainConfig(**TINY, output_dir=str(run))).train()
    whole = (run / "metrics.jsonl").read_text()
    last = whole.splitlines(keepends=True)[-1]
    (run / "metrics.jsonl").write_text(whole[: -len(last)] + last[:20])  # torn in the middle of the last row
    Trainer(TrainConfig(**TINY, output_dir=str(run), resume="auto")).train()
    assert (run / "metrics.jsonl").read_text() == whole


def test_a_step0_checkpoint_after_the_step0_evaluation_does_not_log_it_twice(tmp_path):
    """A signal right after the step-0 evaluation checkpoints step 0 (nothing trained); its resume does not
    evaluate step 0 again (one row per step), and trains as the uninterrupted run, bit for bit: the checkpoint
    holds no optimizer state (DCP's state dict of an optimizer without one is a zero-gradient step's, whose AdamW
    step count 1 shifted the resumed run's bias correction)."""
    import torch

    config = dict(TINY, learning_rate=1e-3)  # a visible update: AdamW's first step moves every weight by ~lr
    run = tmp_path / "run"
    trainer = Trainer(TrainConfig(**config, output_dir=str(run)))
    write = trainer.logger.write

    def then_signal(row):
        write(row)
        if row["step"] == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer.logger.write = then_signal
    with pytest.raises(RunInterrupted, match="after step 0"):
        trainer.train()
    assert _checkpoints(run) == ["step-000000"]
    assert not trainer.optimizer.optimizer.state  # the checkpoint left the live optimizer as it was
    resumed = Trainer(TrainConfig(**config, output_dir=str(run), resume="latest"))
    resumed.train()
    assert [r["step"] for r in _rows(run)] == [0, 1, 2]
    whole = Trainer(TrainConfig(**config, output_dir=str(tmp_path / "whole")))
    whole.train()
    timeless = [{k: v for k, v in r.items() if k not in TIMING} for r in _rows(run)]
    assert timeless == [{k: v for k, v in r.items() if k not in TIMING} for r in _rows(tmp_path / "whole")]
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------- repeated signals
@pytest.mark.parametrize(("signals", "requested", "at_once"), [
    ((signal.SIGTERM, signal.SIGTERM), signal.SIGTERM, False),  # a scheduler's SIGTERM, forwarded by torchrun too
    ((signal.SIGINT, signal.SIGTERM), signal.SIGINT, False),
    ((signal.SIGTERM, signal.SIGINT), signal.SIGTERM, True),  # a person's Ctrl-C overrides a graceful stop
    ((signal.SIGINT, signal.SIGINT), signal.SIGINT, True),
], ids=["term-term", "int-term", "term-int", "int-int"])
def test_a_repeated_sigterm_is_ignored_and_a_second_sigint_stops_at_once(signals, requested, at_once, caplog):
    def stops_at_once(signum: int) -> bool:
        try:
            os.kill(os.getpid(), signum)
        except KeyboardInterrupt:
            return True
        return False

    with GracefulInterrupt() as interrupt:
        assert not stops_at_once(signals[0])
        assert interrupt.requested == requested
        assert stops_at_once(signals[1]) == at_once
        assert interrupt.requested == requested  # the first signal stays the one the run exits with
    if not at_once:
        assert "the stop goes on (the current step finishes, then its checkpoint is written" in caplog.text


@pytest.mark.parametrize("torchrun", [False, True])
def test_the_first_sigints_hint_says_how_to_stop_at_once(torchrun, monkeypatch, caplog):
    """In one process a second Ctrl-C stops at once; under torchrun a terminal's Ctrl-C reaches the agent, not the
    rank (docs/distributed.md), so the hint names the rank's pid to signal instead of a second Ctrl-C."""
    if torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with GracefulInterrupt():
        os.kill(os.getpid(), signal.SIGINT)
    hint = f"kill -INT {os.getpid()} or SIGKILL stops this rank at once"
    assert (hint in caplog.text) == torchrun and ("press Ctrl-C again" in caplog.text) != torchrun, caplog.text
    caplog.clear()  # a SIGTERM while stopping (torchrun's agent forwards one on a second Ctrl-C): the same advice
    with GracefulInterrupt():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    assert "the stop goes on" in caplog.text
    assert (f"kill -INT {os.getpid()} or SIGKILL stop this rank at once" in caplog.text) == torchrun
    assert ("Ctrl-C or SIGKILL stop at once" in caplog.text) != torchrun, caplog.text


def test_a_stopped_run_draws_its_plot_after_the_checkpoint(tmp_path):
    """reward.png was drawn at the end of a run and with each periodic checkpoint, not when a signal stopped it: a
    preempted run's directory had no plot until it was resumed. It is drawn after the stop's checkpoint (which the
    plot must not delay), with the steps done."""
    calls, plotted = [], []

    def stopping(prompts, completions, **columns):
        calls.append(1)
        if len(calls) == 3:  # the dry check, step 1, then during step 2's generation
            os.kill(os.getpid(), signal.SIGTERM)
        return [0.0] * len(completions)

    run = tmp_path / "run"
    trainer = Trainer(TrainConfig(**{**TINY, "eval_size": 0, "max_steps": 3}, output_dir=str(run)),
                      reward_funcs=[stopping])
    plot = trainer.logger.plot

    def plot_after_checkpoint():
        plotted.append(_checkpoints(run))
        return plot()

    trainer.logger.plot = plot_after_checkpoint
    with pytest.raises(RunInterrupted) as stop:
        trainer.train()
    assert (stop.value.step, stop.value.exit_code) == (2, 143)
    assert plotted == [["step-000002"]]  # once, after the checkpoint
    assert (run / "reward.png").stat().st_size > 0


def test_a_signal_after_the_last_step_says_the_run_is_ending(tmp_path, caplog):
    """A Ctrl-C while a finished run draws its plot logged "finishing the current step, then writing a checkpoint",
    which never came (the run had taken its last step and checkpointed it, and ended normally). It says the run is
    ending; a second Ctrl-C still stops at once."""
    run = tmp_path / "run"
    trainer = Trainer(TrainConfig(**{**TINY, "eval_size": 0, "max_steps": 1}, output_dir=str(run)))
    plot, second = trainer.logger.plot, []

    def plot_with_a_signal():
        os.kill(os.getpid(), signal.SIGINT)
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            second.append(True)
        return plot()

    trainer.logger.plot = plot_with_a_signal
    history = trainer.train()
    assert [row["step"] for row in history] == [1] and _checkpoints(run) == ["step-000001"] and second == [True]
    assert "SIGINT received: the run has finished its steps and is ending (nothing is left to checkpoint)" in caplog.text
    assert "finishing the current step" not in caplog.text


def _train_cli(tmp_path, signals: str, *flags: str) -> tuple[subprocess.CompletedProcess, object]:
    """``python -m rlzoo train`` whose reward sends ``signals`` to the process during step 2's generation."""
    reward = tmp_path / "signals.py"
    reward.write_text(textwrap.dedent(f"""
        import os, signal
        calls = []
        def reward(prompts, completions, **kw):
            calls.append(1)
            if len(calls) == 3:  # the dry check, step 1, then step 2
                for name in {signals.split()!r}:
                    os.kill(os.getpid(), getattr(signal, name))
            return [0.0] * len(completions)
        """))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rlzoo", "train", *TINY_FLAGS, "--max-steps", "3",
                           "--reward-funcs", f"{reward}:reward", "--output-dir", str(run), *flags],
                          capture_output=True, text=True, timeout=600,
                          check=False)
    return done, run


def test_two_sigterms_exit_143_after_checkpointing_the_step(tmp_path):
    done, run = _train_cli(tmp_path, "SIGTERM SIGTERM", "--save-steps", "100")
    assert done.returncode == 143, done.stderr[-3000:]
    assert "stopped by SIGTERM after step 2" in done.stderr and "SIGTERM received again" in done.stderr
    assert f"(continue with --output-dir {run} --resume latest;" in done.stderr  # the run's directory named too
    assert _checkpoints(run) == ["step-000002"]  # the step in progress finished and was checkpointed
    assert [r["step"] for r in _rows(run)] == [1, 2]
    assert [p.name for p in run.iterdir() if p.name.startswith(".") and p.name != ".rlzoo.lock"] == []


def test_two_sigints_exit_130_at_once(tmp_path):
    done, run = _train_cli(tmp_path, "SIGINT SIGINT", "--save-steps", "1")
    assert done.returncode == 130, done.stderr[-3000:]
    assert "rlzoo: interrupted" in done.stderr and "Traceback" not in done.stderr
    assert _checkpoints(run) == ["step-000001"]  # step 2 abandoned: the last complete checkpoint stays
    assert [r["step"] for r in _rows(run)] == [1]


def test_a_second_sigint_during_the_checkpoint_write_exits_130_at_once(tmp_path):
    """User trial: a second Ctrl-C that landed inside torch.distributed.checkpoint's write exited 1 with ~60 lines
    of DCP's traceback (DCP wraps what a rank raised, the KeyboardInterrupt too, in a CheckpointException). The
    first SIGINT comes during step 2's generation, the second from inside the DCP write of its checkpoint."""
    reward = tmp_path / "signals.py"
    reward.write_text(textwrap.dedent("""
        import os, signal
        calls = []
        def reward(prompts, completions, **kw):
            calls.append(1)
            if len(calls) == 3:  # the dry check, step 1, then step 2
                os.environ["RLZOO_TEST_STOPPING"] = "1"
                os.kill(os.getpid(), signal.SIGINT)
            return [0.0] * len(completions)
        """))
    driver = textwrap.dedent("""
        import os, signal, sys
        from torch.distributed.checkpoint import filesystem
        write_data = filesystem.FileSystemWriter.write_data
        def second_sigint(self, *args, **kwargs):
            if os.environ.get("RLZOO_TEST_STOPPING"):
                os.kill(os.getpid(), signal.SIGINT)
            return write_data(self, *args, **kwargs)
        filesystem.FileSystemWriter.write_data = second_sigint
        from rlzoo.cli import console_main
        sys.argv = ["rlzoo", *sys.argv[1:]]
        sys.exit(console_main())
        """)
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", driver, "train", *TINY_FLAGS, "--max-steps", "3", "--save-steps", "100",
                           "--reward-funcs", f"{reward}:reward", "--output-dir", str(run)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "rlzoo: interrupted" in done.stderr and "Traceback" not in done.stderr
    assert "CheckpointException" not in done.stderr
    assert _checkpoints(run) == []  # the write was abandoned whole: no partial checkpoint, no temporary


@pytest.mark.slow
def test_under_torchrun_a_sigterm_to_every_process_checkpoints_the_step(tmp_path):
    """Slurm's preemption: SIGTERM to the workers and to torchrun's agent, which forwards its own, so each rank
    receives SIGTERM twice. The ranks still finish the step, checkpoint it and stop with SIGTERM's message
    (before the fix the second SIGTERM stopped one rank mid-step and the other failed in a collective: no
    checkpoint). torchrun itself exits 1 with its SignalException traceback (its agent's own behaviour; see
    docs/distributed.md)."""
    run, log = tmp_path / "run", tmp_path / "log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                  "2", "-m", "rlzoo", "train", *TINY_FLAGS, "--per-device-train-batch-size", "4",
                                  "--max-steps", "1000", "--save-steps", "1000", "--output-dir", str(run)],
                                 stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 300
            while "step 1/1000" not in log.read_text() and agent.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True,
                                                      text=True, check=False).stdout.split()]
            assert len(workers) == 2, log.read_text()[-3000:]
            for pid in workers:
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.2)
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=300) == 1
        finally:
            if agent.poll() is None:
                agent.kill()
    text = log.read_text()
    assert text.count("rlzoo: stopped by SIGTERM after step") == 2, text[-3000:]
    last = _rows(run)[-1]["step"]
    assert [r["step"] for r in _rows(run)] == list(range(1, last + 1))
    assert _checkpoints(run) == [f"step-{last:06d}"]
