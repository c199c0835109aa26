"""The sampler's log-probs from the Hugging Face backend (``rollout_logprobs``), and the trainer running the losses
that need them: bypass mode, rollout rejection (``rollout_rs``, M2PO), decoupled PPO with a recomputed or a
log-linear proximal policy. Tiny random model, a few tiny steps each."""

import dataclasses
import math

import pytest
import torch
from tolerances import tol

import rlzoo
from rlzoo.losses import Penalty, PolicyLoss, loglinear_proximal_logprobs
from rlzoo.losses.base import PartOutput
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.generation import HFGenerator
from rlzoo.trainer.models import load_model
from rlzoo.trainer.scorer import completion_logprobs, model_logits

PROMPTS = ["What is 2 + 3?", "Count the legs of 2 spiders and 1 cat, please.", "7 - 4 = ?"]
TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 2, "max_completion_length": 6,
        "eval_size": 0, "progress": False, "learning_rate": 1e-3, "reward_funcs": ()}
F32 = tol(torch.float32)
F64 = tol(torch.float64)


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _generate(**sampling):
    model, tok = load_model("tiny-random")
    model.eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in PROMPTS]
    generator = HFGenerator(tok, max_completion_length=10, rollout_logprobs=True, **sampling)
    return model, generator.generate(model, prompts, 4, seeds=[3, 5, 7])


@pytest.mark.parametrize("share_prefix", [True, False])
def test_sampler_logprobs_are_the_trainers_logprobs_without_truncation(share_prefix):
    """Temperature 0.7, no top-k / top-p, float32: the sampler's distribution is the trainer's (TRL divides the
    logits by the temperature too), so ``rollout_logprobs`` equal the scored log-probs of the same tokens up to the
    KV-cache forward's rounding, and are 0 outside the completion mask."""
    model, gen = _generate(temperature=0.7, share_prefix=share_prefix)
    scored, _ = completion_logprobs(model, prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask,
                                    group_index=gen.group_index, completion_ids=gen.completion_ids,
                                    completion_mask=gen.completion_mask, temperature=0.7)
    mask = gen.completion_mask
    assert gen.rollout_logprobs is not None and gen.rollout_logprobs.shape == mask.shape
    torch.testing.assert_close(gen.rollout_logprobs[mask], scored[mask], **F32)
    assert bool((gen.rollout_logprobs[~mask] == 0).all())
    assert bool((gen.rollout_logprobs[mask] < 0).all())


def test_top_k_sampler_logprobs_are_the_renormalised_truncated_distribution():
    """With top_k = 5 the sampler draws from the 5 most likely tokens, renormalised: its log-prob of a sampled
    token is the trainer's minus the log of the kept mass (>= the trainer's), computed here from the full logits."""
    model, gen = _generate(temperature=1.0, top_k=5)
    logits = model_logits(model, gen.prompt_ids, gen.prompt_mask, gen.group_index, gen.completion_ids).float()
    logp = logits.log_softmax(-1)
    kept_mass = logp.topk(5, dim=-1).values.logsumexp(-1)
    expected = logp.gather(-1, gen.completion_ids[..., None]).squeeze(-1) - kept_mass
    mask = gen.completion_mask
    torch.testing.assert_close(gen.rollout_logprobs[mask], expected[mask], **F32)
    in_top_k = (logp.topk(5, dim=-1).indices == gen.completion_ids[..., None]).any(-1)
    assert bool(in_top_k[mask].all())  # every sampled token was in the kept set


def test_sampler_logprobs_do_not_change_the_sampled_tokens():
    """Recording is read-only: the same seeds give the same completions with and without it."""
    model, tok = load_model("tiny-random")
    model.eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in PROMPTS]
    runs = [HFGenerator(tok, max_completion_length=10, temperature=0.9, top_p=0.8, rollout_logprobs=record)
            .generate(model, prompts, 4, seeds=[3, 5, 7]) for record in (True, False)]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert runs[1].rollout_logprobs is None


# ----------------------------------------------------------------------------------------------------- trainer
def _record(trainer: Trainer) -> list[list[list]]:
    """Per optimizer step, each micro-batch's ``[PolicyBatch, Normalizer]`` as the loss received them (until
    :func:`_stop_recording`)."""
    steps: list[list] = []
    loss_fn, original_next = trainer.loss_fn, trainer.rollouts.next_optimizer_step

    class Recording:
        def __getattr__(self, name):
            return getattr(loss_fn, name)

        def loss_mask(self, *args, **kwargs):  # defined, not looked up: Python 3.12's isinstance of a Protocol
            return loss_fn.loss_mask(*args, **kwargs)  # (rlzoo.batch.LossMasker) skips __getattr__

        def __call__(self, batch, normalizer=None):
            steps[-1].append([batch, normalizer])
            return loss_fn(batch, normalizer=normalizer)

    def next_optimizer_step():
        steps.append([])
        return original_next()

    trainer.loss_fn = Recording()
    trainer.rollouts.next_optimizer_step = next_optimizer_step
    return steps


def _train(trainer: Trainer) -> tuple[list[dict], list[list[list]], PolicyLoss]:
    """Train while recording (:func:`_record`); returns the metrics, the recorded steps and the loss itself."""
    loss_fn = trainer.loss_fn
    steps = _record(trainer)
    history = trainer.train()
    trainer.loss_fn = loss_fn
    return history, steps, loss_fn


def _detached(batch: rlzoo.PolicyBatch, **changes) -> rlzoo.PolicyBatch:
    fields = {name: getattr(batch, name) for name in ("logprobs", "advantages", "completion_mask", "old_logprobs",
                                                       "ref_logprobs", "rollout_logprobs", "versions",
                                                       "current_version")}
    return rlzoo.PolicyBatch(**{k: v.detach().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                                for k, v in {**fields, **changes}.items()})


def _whole(step: list[list]) -> rlzoo.PolicyBatch:
    """The optimizer step's micro-batches as one batch (same width: one generation batch per step here)."""
    def cat(name):
        values = [getattr(b, name) for b, _ in step]
        return None if values[0] is None else torch.cat([v.detach() for v in values])

    return _detached(step[0][0], **{name: cat(name) for name in ("logprobs", "advantages", "completion_mask",
                                                                 "old_logprobs", "ref_logprobs", "rollout_logprobs",
                                                                 "versions")})


def test_bypass_mode_trains_on_the_samplers_logprobs_without_old_logprobs(tmp_path):
    """--loss.bypass_mode true with num_iterations 2: the generation batch is not scored for old log-probs (the
    sampler's are the old policy, verl's bypass mode), so at the first pass the ratio is 1 up to the sampler's
    rounding; micro-batch losses sum to the whole step's loss."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 2, "num_iterations": 2,
                            "gradient_accumulation_steps": 2, "temperature": 0.7,
                            "loss": {"bypass_mode": True, "beta": 0.0}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    history, steps, loss_fn = _train(trainer)
    assert all(math.isfinite(row["loss"]) for row in history)
    first = steps[0]
    for batch, _ in first:
        assert batch.old_logprobs is None and batch.rollout_logprobs is not None
        mask = batch.completion_mask
        torch.testing.assert_close(batch.rollout_logprobs[mask], batch.logprobs.detach()[mask], **F32)
    for step in steps:
        got = sum(loss_fn(_detached(b), normalizer=n).loss for b, n in step)
        torch.testing.assert_close(got, loss_fn(_whole(step)).loss, **F64)


@pytest.mark.parametrize(("options", "per_token"), [
    ({"top_p": 0.5, "loss": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_1.99"}}, True),
    ({"top_p": 0.95, "algorithm": "m2po", "loss": {"m2_threshold": 0.0024}}, False)], ids=["rollout_rs", "m2po"])
def test_a_rollout_rejection_counts_only_the_tokens_it_keeps(tmp_path, options, per_token):
    """Top-p < 1 makes the sampler's log-probs exceed the trainer's (on the near-uniform random model the ratio
    pi_old / pi_sampler is the kept mass, about top_p; verl's k1 bounds its inverse), so a tight rejection drops some tokens: the
    step's Normalizer counts exactly the kept tokens (loss_fn.loss_mask over every micro-batch, verl's modified
    response mask), fewer than the completion tokens, and the micro-batch losses equal the same loss without its
    rejection on the kept tokens only. A per-token rejection does not depend on the batch: the micro-batch losses also
    sum to the loss of the whole step in one call (M2PO's mask judges the batch it is given, each micro-batch as the
    trainer calls it). Old log-probs are scored at generation (the counts are known before the step) although the
    data is on-policy."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 2,
                            "gradient_accumulation_steps": 2, **options})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    history, steps, loss_fn = _train(trainer)
    assert all(math.isfinite(row["loss"]) for row in history)
    dropped = counted = 0
    for step in steps:
        kept = [loss_fn.loss_mask(b.completion_mask, old_logprobs=b.old_logprobs,
                                          rollout_logprobs=b.rollout_logprobs) for b, _ in step]
        normalizer = step[0][1]
        assert all(b.old_logprobs is not None for b, _ in step)
        assert int(normalizer.num_tokens) == sum(int(k.sum()) for k in kept)
        assert int(normalizer.num_sequences) == sum(k.shape[0] for k in kept)  # every row, a rejected one too
        dropped += sum(int(b.completion_mask.sum()) for b, _ in step) - int(normalizer.num_tokens)
        counted += int(normalizer.num_tokens)
        got = sum(loss_fn(_detached(b), normalizer=n).loss for b, n in step)
        without_rejection = dataclasses.replace(loss_fn, rejections=())
        rows = {"num_sequences": normalizer.num_sequences}  # every row (a rejected one adds 0), as the trainer
        on_kept = sum(without_rejection(_detached(b, completion_mask=k), normalizer=dataclasses.replace(
                          rlzoo.Normalizer.from_masks(*kept), **rows)).loss for (b, _), k in zip(step, kept, strict=True))
        torch.testing.assert_close(got, on_kept, **F64)
        if per_token:
            whole = _whole(step)
            counts = dataclasses.replace(rlzoo.Normalizer.from_batch(whole, loss=loss_fn), **rows)
            torch.testing.assert_close(got, loss_fn(whole, normalizer=counts).loss, **F64)
    assert dropped > 0 and counted > 0


def test_a_step_whose_tokens_are_all_rejected_takes_no_update_and_says_so(tmp_path):
    """Every token out of bounds: the loss is 0 (not NaN), the weights do not move, and the logged rejection
    fraction is 1 (metric shares are taken of the tokens before the rejection)."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1, "top_p": 0.5,
                            "gradient_accumulation_steps": 2, "loss": {"beta": 0.0, "rollout_rs": "token_k1",
                                                                        "rollout_rs_threshold": "0.999_1.001"}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    before = [p.detach().clone() for p in trainer.model.parameters()]
    (row,) = trainer.train()
    assert row["loss"] == 0.0 and row["grad_norm"] == 0.0
    assert row["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_decoupled_ppo_trains_with_the_behaviour_policy_from_the_sampler(tmp_path):
    """decoupled_ppo needs rollout_logprobs (the behaviour policy): on the HF backend they come from the sampler;
    the proximal policy is the recomputed old log-probs. On-policy at the first pass: IS weights near 1."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 2,
                            "gradient_accumulation_steps": 2, "steps_per_generation": 4, "algorithm": "decoupled_ppo"})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    history, steps, _ = _train(trainer)
    assert all(math.isfinite(row["loss"]) for row in history)
    for batch, _ in steps[0]:
        mask = batch.completion_mask
        torch.testing.assert_close(batch.rollout_logprobs[mask], batch.old_logprobs[mask], **F32)


def test_loglinear_proximal_policy_gets_the_versions(tmp_path):
    """prox_logp_method='loglinear': no old log-probs; each micro-batch carries the version that generated it (the
    optimizer steps completed before its generation) and the current version (the newest batch version of the step,
    fixed while a batch is consumed, as AReaL's version over a ppo_update). One generation batch over 3 optimizer
    steps (steps_per_generation 3): version 0, current 0 three times (alpha = 0: the synchronous loop's proximal
    policy is the sampler's, as AReaL's synchronous mode); then the next batch, generated after 3 steps."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 4,
                            "gradient_accumulation_steps": 1, "steps_per_generation": 3, "num_generations": 2,
                            "algorithm": "decoupled_ppo", "loss": {"prox_logp_method": "loglinear"}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    _, steps, _ = _train(trainer)
    seen = [(batch.versions.unique().tolist(), batch.current_version) for step in steps for batch, _ in step]
    assert seen == [([0], 0), ([0], 0), ([0], 0), ([3], 3)]


def test_batches_sampled_with_the_same_weights_share_their_version(tmp_path):
    """Three generation batches in one optimizer step (gradient_accumulation_steps 3, one micro-step each): all
    sampled with the same weights, so all carry the step's current version and the log-linear proximal policy is the
    sampler's for every token (alpha = 0)."""
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 2, "top_p": 0.5,
                            "gradient_accumulation_steps": 3, "steps_per_generation": 1, "num_generations": 2,
                            "algorithm": "decoupled_ppo", "loss": {"prox_logp_method": "loglinear"}})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    _, steps, _ = _train(trainer)
    assert [[(b.versions.unique().tolist(), b.current_version) for b, _ in step] for step in steps] == [
        [([0], 0)] * 3, [([1], 1)] * 3]
    for step in steps:
        for batch, _ in step:
            mask = batch.completion_mask
            proximal = loglinear_proximal_logprobs(batch.rollout_logprobs, batch.logprobs, batch.versions,
                                                   batch.current_version)
            assert torch.equal(proximal[mask], batch.rollout_logprobs[mask].to(proximal.dtype))
    assert all(batch.old_logprobs is None for step in steps for batch, _ in step)


def _mid_cycle_checkpoint(tmp_path, **options):
    """A run of 1 step of a 2-step generation cycle (num_iterations 2), checkpointed with its unfinished batch."""
    base = {**TINY, "num_generations": 2, "num_iterations": 2, "save_steps": 1}
    Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "first"), "max_steps": 1, **options}),
            reward_funcs=[digit_fraction]).train()
    return base, tmp_path / "first" / "checkpoints" / "step-000001"


def test_resuming_a_batch_without_old_logprobs_into_a_loss_that_needs_them_is_refused(tmp_path):
    """bypass_mode stored no old log-probs; resumed without it, the stale micro-step would silently train with
    ratio 1: refused, naming the way out."""
    base, checkpoint = _mid_cycle_checkpoint(tmp_path, loss={"bypass_mode": True})
    resumed = Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "second"), "max_steps": 2,
                                     "resume": str(checkpoint)}), reward_funcs=[digit_fraction])
    with pytest.raises(ValueError, match="without old_logprobs.*generation boundary"):
        resumed.train()


def test_resuming_into_the_loglinear_proximal_policy_drops_the_stored_old_logprobs(tmp_path):
    """decoupled_ppo (recomputed proximal policy) stored old log-probs; resumed with prox_logp_method='loglinear'
    the loss must get none (it would raise), and the buffered batch keeps its version."""
    base, checkpoint = _mid_cycle_checkpoint(tmp_path, algorithm="decoupled_ppo")
    resumed = Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "second"), "max_steps": 2,
                                     "resume": str(checkpoint), "algorithm": "decoupled_ppo",
                                     "loss": {"prox_logp_method": "loglinear"}}), reward_funcs=[digit_fraction])
    _, steps, _ = _train(resumed)
    (batch, _), = steps[0]
    assert batch.old_logprobs is None and batch.versions.tolist() == [0, 0] and batch.current_version == 0


def test_a_resumed_batch_keeps_its_is_weight_sums(tmp_path):
    """rollout_is_batch_normalize divides by the mean IS weight of the whole generation batch (two micro-batches
    here, one per step): resumed after its first step, the second step gets the sums of the whole restored batch,
    bit for bit those of the uninterrupted run."""
    options = {"steps_per_generation": 2, "loss": {"rollout_is": "token", "rollout_is_batch_normalize": True,
                                                   "beta": 0.0}}
    base = {**TINY, "num_generations": 2, "save_steps": 1}
    Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "first"), "max_steps": 1, **options}),
            reward_funcs=[digit_fraction]).train()
    checkpoint = tmp_path / "first" / "checkpoints" / "step-000001"
    straight = Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "straight"), "max_steps": 2, **options}),
                       reward_funcs=[digit_fraction])
    _, want, _ = _train(straight)
    resumed = Trainer(TrainConfig(**{**base, "output_dir": str(tmp_path / "second"), "max_steps": 2,
                                     "resume": str(checkpoint), **options}), reward_funcs=[digit_fraction])
    _, got, _ = _train(resumed)
    (_, normalizer), = got[0]
    (first_batch, first), = want[0]
    (second_batch, second), = want[1]
    tokens = float(first_batch.completion_mask.sum() + second_batch.completion_mask.sum())
    assert normalizer.is_weight_sum is not None and float(second.num_is_weights) == tokens  # the whole batch's
    assert torch.equal(first.is_weight_sum, second.is_weight_sum)
    assert torch.equal(normalizer.is_weight_sum, second.is_weight_sum)
    assert torch.equal(normalizer.num_is_weights, second.num_is_weights)


def test_loglinear_with_a_rejection_is_refused_before_the_model_loads(tmp_path):
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1, "num_generations": 2,
                            "algorithm": "decoupled_ppo",
                            "loss": {"prox_logp_method": "loglinear", "rollout_rs": "token_k1",
                                     "rollout_rs_threshold": 2.0}})
    with pytest.raises(ValueError, match="prox_logp_method='recompute' or drop the rejection"):
        Trainer(config, reward_funcs=[digit_fraction])


class _CriticBonus(Penalty):
    """A penalty that reads a critic's values, which the trainer does not compute (for the refusal test)."""

    def required_fields(self) -> frozenset[str]:
        return frozenset({"values"})

    def __call__(self, x) -> PartOutput:
        raise AssertionError("never called: the trainer refuses the loss first")


def test_a_field_the_trainer_cannot_fill_is_refused_before_the_model_loads(tmp_path):
    loss = PolicyLoss(surrogate="ppo_clip", penalties=(_CriticBonus(),))
    config = TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), "max_steps": 1, "num_generations": 2})
    with pytest.raises(ValueError, match="PolicyBatch.values, which the trainer does not provide"):
        Trainer(config, loss=loss, reward_funcs=[digit_fraction])
