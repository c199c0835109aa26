"""The PolicyBatch fields the trainer derives from its rollouts: ``group_index`` (for ``aggregation="prompt-mean"``)
and ``rewards`` (VAPO's positive-example NLL term), and the step's Normalizer built from them. Tiny random model,
a few tiny steps each."""

import dataclasses

import pytest
import torch
from tolerances import tol

import rlzoo
from rlzoo.trainer import TrainConfig, Trainer

TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 2, "max_completion_length": 6,
        "eval_size": 0, "progress": False, "learning_rate": 1e-3, "reward_funcs": ()}
F64 = tol(torch.float64)


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _record(trainer: Trainer) -> list[list[tuple[rlzoo.PolicyBatch, rlzoo.Normalizer, object]]]:
    """Wrap the scorer and the loss: per optimizer step, each micro-batch's PolicyBatch, normalizer and Rollout."""
    steps: list[list] = []
    scored, loss_fn = trainer.scorer.policy_batch, trainer.loss_fn

    def policy_batch(module, micro_batch, loss_mask, **fields):
        batch = scored(module, micro_batch, loss_mask, **fields)
        steps[-1].append([batch, None, micro_batch])
        return batch

    class Recording:
        def __getattr__(self, name):
            return getattr(loss_fn, name)

        def loss_mask(self, *args, **kwargs):  # defined, not looked up: Python 3.12's isinstance of a Protocol
            return loss_fn.loss_mask(*args, **kwargs)  # (rlzoo.batch.LossMasker) skips __getattr__

        def __call__(self, batch, normalizer=None):
            steps[-1][-1][1] = normalizer
            return loss_fn(batch, normalizer=normalizer)

    original_next = trainer.rollouts.next_optimizer_step

    def next_optimizer_step():
        steps.append([])
        return original_next()

    trainer.scorer.policy_batch = policy_batch
    trainer.loss_fn = Recording()
    trainer.rollouts.next_optimizer_step = next_optimizer_step
    return steps


@pytest.mark.parametrize("steps_per_generation", [None, 2])
def test_prompt_mean_in_the_trainer_is_the_whole_steps_prompt_mean(tmp_path, steps_per_generation):
    """Groups of 4 in micro-batches of 2 (every group split), and with steps_per_generation 2 < 4 accumulation
    steps a step spans two generation batches (whose prompt rows both start at 0): the micro-batch losses sum to
    the prompt-mean of the whole step computed in one call, with groups told apart by their prompt tokens."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 2,
                            "gradient_accumulation_steps": 4, "steps_per_generation": steps_per_generation,
                            "loss": {"aggregation": "prompt-mean"}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    steps = _record(trainer)
    trainer.train()
    assert len(steps) == 2
    for step in steps:
        batches = [b for b, _, _ in step]
        prompts = [tuple(mb.prompt_ids[g][mb.prompt_mask[g]].tolist()) for _, _, mb in step for g in mb.group_index]
        ids = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
        assert len(ids) == 2  # 8 completions of the step: 2 prompts of 4
        whole = rlzoo.PolicyBatch(
            logprobs=torch.cat([b.logprobs.detach() for b in batches]).double(),
            advantages=torch.cat([b.advantages for b in batches]).double(),
            completion_mask=torch.cat([b.completion_mask for b in batches]),
            ref_logprobs=torch.cat([b.ref_logprobs for b in batches]).double(),
            group_index=torch.tensor([ids[p] for p in prompts]))
        expected = trainer.loss_fn(whole).loss
        got = sum(
            trainer.loss_fn(rlzoo.PolicyBatch(logprobs=b.logprobs.detach().double(), advantages=b.advantages.double(),
                                              completion_mask=b.completion_mask, ref_logprobs=b.ref_logprobs.double(),
                                              group_index=b.group_index), normalizer=n).loss
            for b, n, _ in step)
        torch.testing.assert_close(got, expected, **F64)
        assert int(step[0][1].num_groups) == 2


def test_vapo_gets_the_rewards_and_the_positive_token_count(tmp_path):
    """--algorithm vapo: each micro-batch's PolicyBatch.rewards is its combined reward, and the normalizer's
    num_positive_tokens counts the step's tokens of completions with reward > 0."""
    trainer = Trainer(TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1,
                                     "gradient_accumulation_steps": 2, "algorithm": "vapo"}),
                      reward_funcs=[digit_fraction])
    steps = _record(trainer)
    history = trainer.train()
    (step,) = steps
    positive = 0
    for batch, normalizer, micro_batch in step:
        assert torch.equal(batch.rewards, micro_batch.reward)
        positive += int((batch.completion_mask & (batch.rewards > 0).unsqueeze(-1)).sum())
    assert float(step[0][1].num_positive_tokens) == positive
    assert torch.isfinite(torch.tensor(history[0]["loss"]))


def test_an_adaptive_kl_horizon_that_could_drive_beta_below_zero_is_refused_at_start(tmp_path):
    """verl's controller multiplies beta by 1 + clip(e, -0.2, 0.2) N / horizon: horizon <= N / 5 can reach 0."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1,
                            "gradient_accumulation_steps": 4, "use_kl_in_reward": True, "kl_ctrl": "adaptive",
                            "kl_horizon": 1})
    with pytest.raises(ValueError, match=r"kl_horizon must be > 1\.6"):
        Trainer(config, reward_funcs=[digit_fraction])


def _perturb_sampler_logprobs(trainer: Trainer, *, seed: int) -> None:
    """Lower the sampler's log-probs by up to 0.5 (seeded): Hugging Face generate's equal the trainer's up to
    rounding, which makes every IS weight ~1."""
    generate, noise = trainer.rollouts.generator.generate, torch.Generator().manual_seed(seed)

    def perturbed(*args, **kwargs):
        gen = generate(*args, **kwargs)
        drift = 0.5 * torch.rand(gen.rollout_logprobs.shape, generator=noise)
        return dataclasses.replace(gen, rollout_logprobs=torch.where(gen.completion_mask,
                                                                     gen.rollout_logprobs - drift, 0.0))

    trainer.rollouts.generator.generate = perturbed


def test_rollout_is_batch_normalize_divides_by_the_whole_steps_mean_weight(tmp_path):
    """rollout_is_batch_normalize in the trainer: the step's Normalizer carries the IS weights' sums over every
    micro-batch (old log-probs are scored for them), so the micro-batch losses sum to the loss of the whole step
    computed in one call, as verl normalises over its training batch; each micro-batch's own mean would not. The
    sampler's log-probs are perturbed (Hugging Face generate's equal the trainer's up to rounding)."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1,
                            "gradient_accumulation_steps": 2,
                            "loss": {"beta": 0.0, "rollout_is": "token", "rollout_is_batch_normalize": True,
                                     "rollout_is_threshold": 10.0}})
    trainer = Trainer(config, reward_funcs=[lambda completions, **_: [sum(map(ord, c)) % 5 for c in completions]])
    _perturb_sampler_logprobs(trainer, seed=0)
    loss_fn = trainer.loss_fn
    steps = _record(trainer)
    trainer.train()
    (step,) = steps

    def as_f64(b: rlzoo.PolicyBatch) -> rlzoo.PolicyBatch:
        return rlzoo.PolicyBatch(logprobs=b.logprobs.detach().double(), advantages=b.advantages.double(),
                                 completion_mask=b.completion_mask, old_logprobs=b.old_logprobs.double(),
                                 rollout_logprobs=b.rollout_logprobs.double())

    batches = [as_f64(b) for b, _, _ in step]
    assert len(batches) == 2 and all(b.old_logprobs is not None for b in batches)
    whole = rlzoo.PolicyBatch(**{name: torch.cat([getattr(b, name) for b in batches]) for name in (
        "logprobs", "advantages", "completion_mask", "old_logprobs", "rollout_logprobs")})
    expected = loss_fn(whole).loss
    normalizers = [n for _, n, _ in step]
    assert normalizers[0].is_weight_sum is not None
    torch.testing.assert_close(float(normalizers[0].num_is_weights), float(whole.completion_mask.sum()))
    got = sum(loss_fn(b, normalizer=n).loss for b, n in zip(batches, normalizers, strict=True))
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    own_means = sum(loss_fn(b, normalizer=rlzoo.Normalizer.from_masks(*(c.completion_mask for c in batches)))
                    .loss for b in batches)
    assert whole.advantages.abs().max() > 0
    assert not torch.allclose(own_means, expected, **tol(torch.float32))  # the comparison has power


@pytest.mark.parametrize(("accumulation", "per_generation", "max_steps", "draws", "level"), [
    (2, 4, 2, [[0], [0]], "sequence"),  # a generation batch feeds two steps of two micro-batches
    (1, 2, 4, [[0], [0], [1], [1]], "token"),  # two steps per generation batch, then a new batch
    (3, 2, 2, [[0, 1], [1, 2]], "token"),  # each step spans two generation batches; the middle one counts in both
], ids=["two_steps_of_two", "two_steps_per_batch", "steps_span_batches"])
def test_each_step_takes_the_is_weight_sums_of_the_generation_batches_it_draws_from(
        tmp_path, accumulation, per_generation, max_steps, draws, level):
    """The step's is_weight_sum / num_is_weights are those of the whole generation batches its micro-batches come
    from (``draws``: their indices; verl normalises over its training batch, which its mini-batches share), not of
    its own micro-batches, nor of a batch it does not draw from; its token counts stay its own."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": max_steps,
                            "gradient_accumulation_steps": accumulation, "steps_per_generation": per_generation,
                            "loss": {"beta": 0.0, "rollout_is": level, "rollout_is_batch_normalize": True,
                                     "rollout_is_threshold": 10.0}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    _perturb_sampler_logprobs(trainer, seed=2)
    loss_fn = trainer.loss_fn
    steps = _record(trainer)
    trainer.train()
    micro = [b for step in steps for b, _, _ in step]  # in order: per_generation micro-batches per generation batch
    generations = [micro[i:i + per_generation] for i in range(0, len(micro), per_generation)]
    sums = [rlzoo.Normalizer.from_batch(*(_as_f64(b) for b in gen), loss=loss_fn) for gen in generations]
    assert len({float(n.is_weight_sum) for n in sums}) == len(sums)  # the batches differ
    for step, drawn in zip(steps, draws, strict=True):
        normalizer = step[0][1]
        torch.testing.assert_close(normalizer.is_weight_sum.double(), sum(sums[i].is_weight_sum for i in drawn),
                                   **tol(torch.float32))
        assert float(normalizer.num_is_weights) == sum(float(sums[i].num_is_weights) for i in drawn)
        assert float(normalizer.num_tokens) == sum(float(b.completion_mask.sum()) for b, _, _ in step)


def _as_f64(b: rlzoo.PolicyBatch) -> rlzoo.PolicyBatch:
    return rlzoo.PolicyBatch(logprobs=b.logprobs.detach().double(), advantages=b.advantages.double(),
                             completion_mask=b.completion_mask, old_logprobs=b.old_logprobs.double(),
                             rollout_logprobs=b.rollout_logprobs.double())


@pytest.mark.parametrize("where", ["masked", "counted"])
def test_a_nan_sampler_logprob_at_a_counted_token_stops_the_batch_normalised_run(tmp_path, where):
    """The generation batch's IS weight sums cover micro-batches that later steps train on, so a NaN there would
    silently unnormalise earlier steps: refused when the batch is generated (BatchError naming the NaN); a NaN at
    a masked position (padding) is ignored, as the loss ignores it."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1,
                            "gradient_accumulation_steps": 2,
                            "loss": {"beta": 0.0, "rollout_is": "token", "rollout_is_batch_normalize": True}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    generate = trainer.rollouts.generator.generate

    def with_nan(*args, **kwargs):
        gen = generate(*args, **kwargs)
        if where == "masked":
            gen.completion_mask[-1, -1] = False  # one padded position at least
        first = (~gen.completion_mask if where == "masked" else gen.completion_mask).nonzero()[0]
        logprobs = gen.rollout_logprobs.clone()
        logprobs[first[0], first[1]] = float("nan")
        return dataclasses.replace(gen, rollout_logprobs=logprobs)

    trainer.rollouts.generator.generate = with_nan
    if where == "masked":
        assert torch.isfinite(torch.tensor(trainer.train()[-1]["loss"]))
    else:
        with pytest.raises(rlzoo.BatchError, match="NaN at a counted token"):
            trainer.train()
