"""A signal during an evaluation abandons it (a 200-problem evaluation of a real model takes minutes): the run
stops at once with the usual exit code, and no partial accuracy is logged; the final evaluation is run again by
the resume."""

import dataclasses
import json
import os
import signal

import pytest

from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.interrupts import RunInterrupted


def test_sigint_during_the_step0_evaluation_abandons_it(tmp_path):
    config = TrainConfig(model="tiny-random", num_generations=4, per_device_train_batch_size=8,
                         max_completion_length=4, eval_size=8, eval_batch_size=2, progress=False, max_steps=2,
                         output_dir=str(tmp_path / "run"))
    trainer = Trainer(config)
    generate, batches = trainer.evaluator.generator.generate, []

    def interrupted(*args, **kwargs):
        batches.append(1)
        if len(batches) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return generate(*args, **kwargs)

    trainer.evaluator.generator.generate = interrupted
    with pytest.raises(RunInterrupted) as stop:
        trainer.train()
    assert (stop.value.step, stop.value.exit_code) == (0, 130)
    assert len(batches) == 1  # of 4: the other 3 batches were never decoded
    assert trainer.step == 0
    assert "eval/accuracy" not in (tmp_path / "run" / "metrics.jsonl").read_text()


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)], ids=["once", "twice"])
def test_a_signal_during_the_final_evaluation_keeps_the_checkpoint_and_leaves_the_row_to_the_resume(tmp_path,
                                                                                                    signals):
    """The last step is complete when its evaluation starts (minutes on a real model): one signal abandons the
    evaluation and the run exits 143 (SIGTERM); a second one stops at once (KeyboardInterrupt, exit 130). Either
    way the last step's checkpoint is written (save_steps 10 would not have saved step 2) and carries the step's
    row, which is not written without its evaluation: ``--resume latest`` runs the final evaluation and writes
    it (it used to be written without one, and the resume then said "nothing to train": the final accuracy was
    lost for good under a preemption)."""
    run = tmp_path / "run"
    config = TrainConfig(model="tiny-random", num_generations=4, per_device_train_batch_size=8,
                         max_completion_length=4, eval_size=8, eval_batch_size=2, progress=False, max_steps=2,
                         output_dir=str(run))
    trainer = Trainer(config)
    generate, batches = trainer.evaluator.generator.generate, []

    def interrupted(*args, **kwargs):
        if trainer.step == 2:  # the final evaluation (step 0's ran 4 batches)
            batches.append(1)
            if len(batches) == 1:
                for signum in signals:
                    os.kill(os.getpid(), signum)
        return generate(*args, **kwargs)

    trainer.evaluator.generator.generate = interrupted
    with pytest.raises(RunInterrupted if len(signals) == 1 else KeyboardInterrupt) as stop:
        trainer.train()
    if len(signals) == 1:
        assert (stop.value.step, stop.value.exit_code) == (2, 143)
    assert len(batches) == 1  # the evaluation was cut short

    def rows():
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert [row["step"] for row in rows()] == [0, 1]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    assert (run / "reward.png").is_file() == (len(signals) == 1)  # drawn after the stop (not after a second Ctrl-C)
    Trainer(dataclasses.replace(config, resume="latest")).train()
    assert [row["step"] for row in rows()] == [0, 1, 2]
    assert "loss" in rows()[-1] and "eval/accuracy" in rows()[-1]
