"""An option that acts only under a switch (``--kl-coef`` with ``--use-kl-in-reward``) and is set while its switch is
off gets one warning line saying so; the run goes on. (``rlzoo train --kl-coef 0.5`` trained without a word: a verl
user's --kl-coef is not the loss's KL coefficient, which is --loss.beta.)"""

import dataclasses
import logging

import pytest

from rlzoo.trainer import TrainConfig
from rlzoo.trainer.inert_options import DEPENDENT_OPTIONS, inert_options

FIELDS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
SET = {"kl_ctrl": "adaptive", "kl_coef": 0.5, "kl_penalty": "abs", "target_kl": 3.0, "kl_horizon": 1,
       "max_sampling_rounds": 9, "overlong_penalty": 3.0, "vllm_gpu_memory_utilization": 0.5,
       "fsdp_cpu_offload": True, "run_name": "exp1", "project": "grpo-sweep", "eval_steps": 5,
       "exclude_eval_questions": True}
"""A value away from the default for each option of the table."""
OFF = {"eval_size": 0}  # the switches whose default is on


def test_a_project_without_a_tracker_that_has_projects_is_inert():
    """--project with --report-to tensorboard (no projects there) was taken silently."""
    assert inert_options(TrainConfig(project="sweep", report_to="tensorboard")) == [
        "--project sweep has no effect without --report-to trackio or wandb (the trackio / wandb project)"]
    assert inert_options(TrainConfig(project="sweep", report_to="tensorboard,wandb")) == []


def test_the_reported_options_each_get_one_line_naming_the_switch():
    lines = inert_options(TrainConfig(kl_coef=0.5, kl_penalty="abs", target_kl=3, max_sampling_rounds=9,
                                      overlong_penalty=3))
    assert lines == [
        "--kl-coef 0.5 has no effect without --use-kl-in-reward (the loss's KL coefficient is --loss.beta)",
        "--kl-penalty abs has no effect without --use-kl-in-reward (the loss's KL estimator is --loss.kl_estimator)",
        "--target-kl 3.0 has no effect without --use-kl-in-reward --kl-ctrl adaptive",
        "--max-sampling-rounds 9 has no effect without --dynamic-sampling",
        "--overlong-penalty 3.0 has no effect without --overlong-buffer N (N > 0)",
    ]
    assert inert_options(TrainConfig(kl_ctrl="adaptive", kl_horizon=1)) == [
        "--kl-ctrl adaptive has no effect without --use-kl-in-reward",
        "--kl-horizon 1 has no effect without --use-kl-in-reward"]
    # with the switch on they act; a fixed controller still ignores the adaptive one's options
    assert inert_options(TrainConfig(use_kl_in_reward=True, kl_coef=0.5, kl_penalty="abs", dynamic_sampling=True,
                                     max_sampling_rounds=9, overlong_buffer=8, overlong_penalty=3)) == []
    assert inert_options(TrainConfig(use_kl_in_reward=True, target_kl=3)) == [
        "--target-kl 3.0 has no effect without --kl-ctrl adaptive"]
    assert inert_options(TrainConfig(use_kl_in_reward=True, kl_ctrl="adaptive", target_kl=3, kl_horizon=10**6)) == []


@pytest.mark.parametrize("dependent", DEPENDENT_OPTIONS, ids=lambda d: d.option)
def test_every_dependent_option_is_said_inert_only_while_a_switch_is_off(dependent):
    assert dependent.option in FIELDS and all(s.field in FIELDS for s in dependent.switches)
    assert SET[dependent.option] != FIELDS[dependent.option]
    assert inert_options(TrainConfig()) == []  # the defaults say nothing
    switches_off = {s.field: OFF[s.field] for s in dependent.switches if s.field in OFF}
    lines = inert_options(TrainConfig(**{dependent.option: SET[dependent.option]}, **switches_off))
    flag = "--" + dependent.option.replace("_", "-")
    assert len(lines) == 1 and lines[0].startswith(flag) and "has no effect without" in lines[0], lines
    assert not [line for line in inert_options(TrainConfig(**switches_off)) if line.startswith(flag)]


def test_the_trainer_warns_once_before_the_model_loads(tmp_path, monkeypatch, caplog):
    from rlzoo.trainer import loop

    def no_model(*args, **kwargs):
        raise RuntimeError("the model would load here")

    monkeypatch.setattr(loop, "build_models", no_model)
    config = TrainConfig(model="tiny-random", kl_coef=0.5, max_sampling_rounds=9, output_dir=str(tmp_path / "run"),
                         progress=False, eval_size=2, num_generations=2, per_device_train_batch_size=4)
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"), pytest.raises(RuntimeError, match="would load"):
        loop.Trainer(config)
    warned = [r.getMessage() for r in caplog.records if "has no effect without" in r.getMessage()]
    assert warned == [
        "--kl-coef 0.5 has no effect without --use-kl-in-reward (the loss's KL coefficient is --loss.beta)",
        "--max-sampling-rounds 9 has no effect without --dynamic-sampling"]


def test_loss_options_of_a_part_that_is_off_are_warned():
    """User trial: --loss.rollout_rs_threshold without --loss.rollout_rs (or --loss.kl_estimator with beta 0) trained
    without the correction (or KL) configured, without a word, though --kl-coef without its switch is warned."""
    import rlzoo

    loss_options = {"rollout_is_threshold": 3.0, "rollout_rs_threshold": 2.0, "kl_estimator": "k1", "epsilon_high": 0.3}
    config = TrainConfig(algorithm="dapo", loss=loss_options)
    assert inert_options(config, rlzoo.get_loss("dapo", **loss_options)) == [
        "--loss.rollout_is_threshold 3.0 has no effect while --loss.rollout_is is None (the part 'rollout_is' is off)",
        "--loss.rollout_rs_threshold 2.0 has no effect while --loss.rollout_rs is None (the part 'rollout_rs' is off)",
        "--loss.kl_estimator k1 has no effect while --loss.beta is 0.0 (the part 'kl' is off)",
    ]
    on = {**loss_options, "rollout_is": "token", "rollout_rs": "token_k1", "beta": 0.04}
    assert inert_options(TrainConfig(algorithm="dapo", loss=on), rlzoo.get_loss("dapo", **on)) == []
    off = {"rollout_rs": None, "beta": 0.0, "geo_mask_low": None, "geo_mask_high": None, "kl_estimator": "k3"}
    assert inert_options(TrainConfig(algorithm="dapo", loss=off), rlzoo.get_loss("dapo", **off)) == []  # (reviewer)
