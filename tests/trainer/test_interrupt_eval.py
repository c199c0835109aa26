"""A signal during an evaluation abandons it (a 200-problem evaluation of a real model takes minutes): the run
stops at once with the usual exit code, and no partial accuracy is logged."""

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
