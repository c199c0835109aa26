"""Trainer wiring of the 2026-frontier signals on the tiny random model: a teacher for on-policy distillation
(``--teacher``), the KL in the reward with its controller (``--use-kl-in-reward``), and the optimal token
baseline's ``sum_pi_squared`` from the fused kernel. Each run is a few tiny steps."""

import itertools
import math

import pytest
import torch
from tolerances import tol

from rlzoo.kernels import sum_pi_squared_from_logits
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.models import TinyRandomSpec, build_tiny_random
from rlzoo.trainer.scorer import completion_logprobs, model_logits

TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 6,
        "eval_size": 0, "progress": False, "learning_rate": 1e-3, "reward_funcs": ()}
F32 = tol(torch.float32)


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _trainer(run, **overrides) -> Trainer:
    return Trainer(TrainConfig(**{**TINY, "output_dir": str(run), **overrides}), reward_funcs=[digit_fraction])


def _teacher_dir(tmp_path, *, seed: int = 1, extra_token: bool = False):
    """A tiny random model with other weights (and, with ``extra_token``, another tokenizer), saved as a checkpoint."""
    model, tokenizer = build_tiny_random(TinyRandomSpec(seed=seed))
    if extra_token:
        tokenizer.add_tokens(["<teacher-only>"])
        model.resize_token_embeddings(len(tokenizer))
    path = tmp_path / f"teacher-{seed}-{extra_token}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------------ the teacher


def test_opd_scores_the_teacher_into_teacher_logprobs(tmp_path):
    """--algorithm opd --teacher DIR: each generation batch carries the teacher's log-probs of the sampled tokens
    (equal to scoring the teacher directly), and the loss reports the distillation KL, non-zero for another model."""
    trainer = _trainer(tmp_path / "run", algorithm="opd", teacher=str(_teacher_dir(tmp_path)), max_steps=2)
    seen = []
    original = trainer.rollouts.generate

    def generate():
        rollout, stats = original()
        direct, _ = completion_logprobs(trainer.teacher.module.model, prompt_ids=rollout.prompt_ids,
                                        prompt_mask=rollout.prompt_mask, group_index=rollout.group_index,
                                        completion_ids=rollout.completion_ids,
                                        completion_mask=rollout.completion_mask)
        seen.append((rollout.teacher_logprobs, direct, rollout.completion_mask))
        return rollout, stats

    trainer.rollouts.generate = generate
    history = trainer.train()
    assert len(seen) == 2
    for teacher_logprobs, direct, mask in seen:
        torch.testing.assert_close(teacher_logprobs[mask], direct[mask], **F32)
    for row in history:
        assert math.isfinite(row["loss"]) and row["distillation/kl"] != 0.0  # near-uniform random models: small
    assert not any(p.requires_grad for p in trainer.teacher.module.parameters())


def test_a_teacher_equal_to_the_initial_policy_has_zero_kl_at_the_first_step(tmp_path):
    """The teacher tiny-random is the initial policy: the first step's distillation KL is 0 (to float32 rounding)."""
    history = _trainer(tmp_path / "run", algorithm="opd", teacher="tiny-random", max_steps=1).train()
    assert abs(history[0]["distillation/kl"]) < 1e-6


def test_teacher_errors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="give --teacher MODEL"):
        _trainer(tmp_path / "a", algorithm="opd")
    with pytest.raises(ValueError, match="does not use teacher_logprobs"):
        _trainer(tmp_path / "b", teacher="tiny-random")
    with pytest.raises(ValueError, match="its tokenizer differs from the policy's"):
        _trainer(tmp_path / "c", algorithm="opd", teacher=str(_teacher_dir(tmp_path, extra_token=True)))
    model, tokenizer = build_tiny_random(TinyRandomSpec(seed=3))  # user trial: the same tokenizer, fewer rows
    model.resize_token_embeddings(200)  # crashed at the first scoring with IndexError (a sampled id >= 200)
    model.save_pretrained(tmp_path / "small")
    tokenizer.save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match=r"--teacher .*small: its embeddings have 200 rows, fewer than the policy's "
                                         r"\d+ output tokens"):
        _trainer(tmp_path / "d", algorithm="opd", teacher=str(tmp_path / "small"))


# ------------------------------------------------------------------------------------------- KL in the reward


def test_kl_in_reward_adaptive_controller_follows_the_batch_kl(tmp_path):
    """--use-kl-in-reward --kl-ctrl adaptive: step 1 uses kl_coef, and each next step's coefficient is the previous
    one times 1 + clip(KL / target - 1, -0.2, 0.2) * N / horizon with the logged KL (Ziegler et al.). The first
    batch is sampled by the reference itself: its KL is exactly 0."""
    horizon, target, n = 50, 0.01, 8
    history = _trainer(tmp_path / "run", max_steps=3, use_kl_in_reward=True, kl_ctrl="adaptive", kl_coef=0.2,
                       target_kl=target, kl_horizon=horizon).train()
    assert history[0]["reward_kl_penalty_coeff"] == 0.2
    assert history[0]["reward_kl_penalty"] == 0.0
    assert history[-1]["reward_kl_penalty"] != 0.0  # the policy moved away from the reference
    for before, after in itertools.pairwise(history):
        error = min(max(before["reward_kl_penalty"] / target - 1, -0.2), 0.2)
        want = before["reward_kl_penalty_coeff"] * (1 + error * n / horizon)
        assert after["reward_kl_penalty_coeff"] == pytest.approx(want, rel=1e-12)


def test_kl_in_reward_with_a_zero_coefficient_changes_nothing(tmp_path):
    """A fixed coefficient of 0 adds exactly 0 to every reward: the run equals the default run bit for bit."""
    plain = _trainer(tmp_path / "a", max_steps=2).train()
    shaped = _trainer(tmp_path / "b", max_steps=2, use_kl_in_reward=True, kl_coef=0.0).train()
    for want, got in zip(plain, shaped, strict=True):
        for key in ("loss", "reward", "grad_norm", "entropy"):
            assert got[key] == want[key], key


def test_kl_in_reward_changes_token_level_advantages(tmp_path):
    """With a token-level estimator the penalty enters as token rewards: the advantages differ from the run
    without it once the policy has moved (step 2), and the loss stays finite."""
    common = {"max_steps": 2, "advantage": "reinforce_pp", "eval_size": 0}
    plain = _trainer(tmp_path / "a", **common).train()
    shaped = _trainer(tmp_path / "b", use_kl_in_reward=True, kl_coef=0.5, **common).train()
    assert plain[0]["loss"] == shaped[0]["loss"]  # step 1: the KL is exactly 0
    assert plain[1]["loss"] != shaped[1]["loss"]
    assert all(math.isfinite(r["loss"]) for r in shaped)


def test_resume_restores_the_kl_controller_exactly(tmp_path):
    """Resuming from step 2 continues with the checkpointed adaptive coefficient: step 3 equals the uninterrupted
    run's bit for bit (metrics, the coefficient, the weights)."""
    common = {"max_steps": 3, "save_steps": 1, "save_total_limit": 5, "use_kl_in_reward": True,
              "kl_ctrl": "adaptive", "kl_coef": 0.2, "target_kl": 0.01, "kl_horizon": 20}
    full = _trainer(tmp_path / "a", **common)
    history = full.train()
    resumed = _trainer(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoints" / "step-000002"), **common)
    again = resumed.train()
    assert history[1]["reward_kl_penalty_coeff"] != history[0]["reward_kl_penalty_coeff"]  # a real check
    for key in ("loss", "reward", "grad_norm", "reward_kl_penalty", "reward_kl_penalty_coeff"):
        assert again[-1][key] == history[-1][key], key
    assert resumed.rollouts.kl_reward.controller.value == full.rollouts.kl_reward.controller.value
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(("first", "then"), [({"kl_ctrl": "fixed", "kl_coef": 0.001}, {"kl_ctrl": "fixed", "kl_coef": 0.05}),
                                             ({"kl_ctrl": "adaptive", "kl_coef": 0.2}, {"kl_ctrl": "fixed", "kl_coef": 0.01})])
def test_a_kl_coef_changed_on_resume_is_the_one_used(tmp_path, first, then):
    """``--resume latest --kl-coef 0.05`` was logged "(applied)" while the checkpoint's coefficient kept being used
    (the controller's state overwrote it), also when switching an adaptive run to a fixed one: a resume that changes
    kl_ctrl or kl_coef starts the coefficient from the new settings."""
    common = {"max_steps": 2, "save_steps": 1, "use_kl_in_reward": True, "target_kl": 0.01, "kl_horizon": 20}
    _trainer(tmp_path / "a", **common, **first).train()
    resumed = _trainer(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoints" / "step-000001"), **common, **then)
    history = resumed.train()
    assert history[-1]["reward_kl_penalty_coeff"] == then["kl_coef"]


def test_kl_in_reward_errors_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="kl_horizon"):
        TrainConfig(**TINY, kl_horizon=0)
    with pytest.raises(ValueError, match="kl_penalty"):
        TrainConfig(**TINY, kl_penalty="full")  # verl's "full" needs whole distributions (verl raises too)


# ------------------------------------------------------------------------------------- optimal token baseline


def test_optimal_token_baseline_gets_the_fused_kernels_sum_pi_squared(tmp_path):
    """--advantage optimal_token_baseline: the estimator receives the sampling policy's log-probs and
    sum_pi_squared from the scorer's one fused pass, equal to the plain-logits computation of the model's own
    forward; the run trains."""
    trainer = _trainer(tmp_path / "run", advantage="optimal_token_baseline", max_steps=2)
    estimator, calls = trainer.rollouts.advantage_fn, []

    class Spy:
        needs, accepts = estimator.needs, estimator.accepts

        def __call__(self, rewards, **inputs):
            calls.append(inputs)
            return estimator(rewards, **inputs)

    trainer.rollouts.advantage_fn = Spy()
    original = trainer.rollouts.generate

    def generate():
        rollout, stats = original()
        inputs, mask = calls[-1], rollout.completion_mask
        with torch.no_grad():
            logits = model_logits(trainer.model, rollout.prompt_ids, rollout.prompt_mask, rollout.group_index,
                                  rollout.completion_ids)
            lp = torch.log_softmax(logits.float(), -1).gather(-1, rollout.completion_ids[..., None])[..., 0]
        torch.testing.assert_close(inputs["sum_pi_squared"][mask], sum_pi_squared_from_logits(logits)[mask], **F32)
        torch.testing.assert_close(inputs["old_logprobs"][mask], lp[mask], **F32)
        assert rollout.advantages.shape == mask.shape
        return rollout, stats

    trainer.rollouts.generate = generate
    history = trainer.train()
    assert len(calls) == 2 and all(math.isfinite(r["loss"]) for r in history)


def test_kl_penalty_takes_verls_names_with_verls_meanings():
    """--kl-penalty is verl's algorithm.kl_penalty: 'kl' and 'mse' are its names for k1 and k2, and its 'k3' is the
    clamped low_var_kl (rlzoo's loss estimator 'k3' is TRL's unclamped one: -1799.5 here instead of verl's -10)."""
    from rlzoo.advantages import kl_in_reward
    from rlzoo.trainer.config import SignalConfig
    from rlzoo.trainer.reward_shaping import KLRewardShaping

    old, ref = torch.tensor([[-8.0, -1.0]], dtype=torch.float64), torch.tensor([[-0.5, -1.2]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for verl_name, estimator in (("kl", "k1"), ("mse", "k2"), ("k3", "low_var_kl"), ("low_var_kl", "low_var_kl")):
        shaping = KLRewardShaping(SignalConfig(kl_penalty=verl_name, kl_coef=1.0))
        _, token_rewards, _ = shaping.apply(torch.zeros(1, dtype=torch.float64), old, ref, mask, token_level=True)
        torch.testing.assert_close(token_rewards, kl_in_reward(old, ref, mask, kl_coef=1.0, kl_penalty=estimator)[0])
    assert token_rewards[0, 0].item() == -10.0  # verl's clamp
    with pytest.raises(ValueError, match=r"kl_penalty.*one of 'kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3'"):
        SignalConfig(kl_penalty="full")


def test_a_batch_coupled_loss_under_gradient_accumulation_says_its_statistics_are_per_micro_batch(tmp_path, caplog):
    """One process with 2 micro-batches per step: the entropy quantile is taken per micro-batch (as TRL's), which the
    run says once at start-up (before, only under torchrun); without accumulation the micro-batch is the step's."""
    import logging

    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        _trainer(tmp_path / "a", algorithm="dapo", loss={"top_entropy_quantile": 0.5}, gradient_accumulation_steps=2,
                 per_device_train_batch_size=4)
    assert ("loss dapo uses statistics of the batch it is given (entropy_mask(top_entropy_quantile=0.5)): each "
            "micro-batch of per_device_train_batch_size completions computes them on its own") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        _trainer(tmp_path / "b", algorithm="dapo", loss={"top_entropy_quantile": 0.5})
    assert "uses statistics of the batch" not in caplog.text


@pytest.mark.parametrize(("estimator", "why"), [("remax", "baseline_rewards: the reward of a greedy completion"),
                                                  ("gae", "values: a value model's per-token values")])
def test_an_estimator_whose_inputs_the_trainer_lacks_is_refused_naming_what_is_missing(estimator, why):
    """``--advantage remax`` was refused with "(no value model / token rewards)", though remax needs neither: it needs
    the reward of a greedy baseline completion. The refusal names each missing input and what it is."""
    from rlzoo.trainer.algorithm import AlgorithmConfig, build_loss

    with pytest.raises(ValueError, match=rf"advantage estimator '{estimator}' needs what the trainer does not provide "
                                         rf"\({why}.*choose one of .*grpo"):
        build_loss(AlgorithmConfig(advantage=estimator), None, max_completion_length=8)


@pytest.mark.parametrize(("given", "scale"), [(False, "none"), (True, "group"), ("batch", "batch")])
def test_trls_boolean_scale_rewards_is_a_scale(given, scale):
    """--advantage.scale false (TRL's scale_rewards=False) was refused: "scale must be one of 'batch', 'group',
    'none'; got False". TRL maps True / False to "group" / "none"."""
    from rlzoo.trainer.algorithm import AlgorithmConfig, build_loss

    _, estimator, _ = build_loss(AlgorithmConfig(advantage_options={"scale": given}), None, max_completion_length=8)
    assert estimator.scale == scale
