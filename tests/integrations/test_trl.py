"""``rlzoo.integrations.trl.GRPOTrainer`` against plain ``trl.GRPOTrainer`` (TRL 1.16, the oracle), end to end.

Both trainers train the same tiny random Llama (fp32, CPU) for 3 optimizer steps on the same prompts, rewards
and seed; the per-step losses TRL logs and the final weights must agree within tolerances.REFERENCE_ATOL.
The runs exercise what the normalisation is about: completions of different lengths (an eos bias in the
sampler), two iterations per generation batch (old log-probs differ from the current ones, so the clip,
CISPO cap and SAPO gates act), and gradient accumulation 1 and 2.

The optimizer is plain SGD: Adam divides by sqrt(v), so a rounding-level gradient difference (rlzoo sums in
another order than TRL) on a gradient component near zero becomes a difference of the size of the learning
rate; with SGD a weight difference is the learning rate times the gradient difference.
"""

import dataclasses
import math
import re
import types
import warnings

import pytest
import torch
from tolerances import REFERENCE_ATOL

import rlzoo

trl = pytest.importorskip("trl", reason="TRL (test oracle) is not installed: pip install trl==1.16.0")
datasets = pytest.importorskip("datasets")

from rlzoo.compat.trl import GRPO_LOSS_DEFAULTS, TRLGRPOLoss
from rlzoo.integrations.trl import GRPOTrainer, resolve_loss
from rlzoo.trainer.models import build_tiny_random

PROMPTS = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]


def vowels(completions, **kwargs):
    """A reward with spread: vowels in the completion plus a length term."""
    return [float(sum(c.count(v) for v in "aeiou")) + 0.1 * len(c) for c in completions]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the tiny model's ops are too small to share, and on a loaded 2-core machine two
    threads make HF generation 5-50x slower (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model directory, tokenizer): the tiny random Llama saved once for the module (TRL loads a path, and a
    reference model from it when beta > 0)."""
    model, tokenizer = build_tiny_random()
    path = tmp_path_factory.mktemp("tiny-random")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), tokenizer


def config(tmp_path, **overrides) -> "trl.GRPOConfig":
    fields = {
        "output_dir": str(tmp_path / "out"), "use_cpu": True, "report_to": "none", "disable_tqdm": True, "save_strategy": "no",
        "seed": 0, "bf16": False, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 8,
        "max_steps": 3, "logging_steps": 1, "optim": "sgd", "learning_rate": 1.0, "num_iterations": 2,
        "max_grad_norm": 0.0,  # no clipping: the final weights compare the gradients' size, not only their direction
        "generation_kwargs": {"sequence_bias": {(2,): 2.5}},  # eos (id 2) more likely: completion lengths vary
    }
    fields.update(overrides)
    return trl.GRPOConfig(**fields)


def train(cls, tiny, args, **kwargs):
    """(per-step logs, final parameters) of a 3-step run."""
    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS * 4})
    trainer = cls(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, processing_class=tokenizer,
                  **kwargs)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    return logs, torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), trainer


LOSS_TYPES = {
    "dapo": {"loss_type": "dapo"},
    "grpo_beta": {"loss_type": "grpo", "beta": 0.04},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "cispo": {"loss_type": "cispo", "epsilon_high": 1.1},
    "sapo": {"loss_type": "sapo"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
}


@pytest.mark.parametrize("gradient_accumulation_steps", [1, 2])
@pytest.mark.parametrize("case", sorted(LOSS_TYPES))
def test_default_loss_trains_exactly_like_trl(tiny, tmp_path, case, gradient_accumulation_steps):
    """With the default loss (loss_from_grpo_config(args)), 3 steps give TRL's per-step losses and final weights."""
    args = config(tmp_path, gradient_accumulation_steps=gradient_accumulation_steps, **LOSS_TYPES[case])
    want_logs, want_weights, _ = train(trl.GRPOTrainer, tiny, args)
    got_logs, got_weights, trainer = train(GRPOTrainer, tiny, args)

    assert isinstance(trainer.loss_fn, TRLGRPOLoss)
    assert len(got_logs) == len(want_logs) == 3
    for got, want in zip(got_logs, want_logs, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=REFERENCE_ATOL, rel=0)
        assert got["entropy"] == pytest.approx(want["entropy"], abs=REFERENCE_ATOL, rel=0)
        # TRL's names and reductions: token-weighted, and per sequence at importance_sampling_level="sequence"
        names = ["kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
                 "clip_ratio/high_max", "cispo_clip_ratio"]
        for name in names:
            if name in want:
                assert got[name] == pytest.approx(want[name], abs=REFERENCE_ATOL, rel=0), name
    torch.testing.assert_close(got_weights, want_weights, atol=REFERENCE_ATOL, rtol=0)
    # the comparison has power: the weights moved, lengths differ, and the clip / ratio is active off-policy
    assert (got_weights - build_flat_initial(tiny)).abs().max() > 1e-3
    assert any(row["completions/min_length"] < row["completions/max_length"] for row in want_logs if
               "completions/min_length" in row)
    assert max(row["ratio/max"] for row in got_logs) > 1.0 + 1e-3
    if case == "gspo":  # some sequences clipped, not all: a per-token count would give other fractions
        assert any(0.0 < row[f"clip_ratio/{side}_mean"] < 1.0 for row in got_logs for side in ("low", "high"))


def test_an_explicit_loss_divides_by_every_row_as_trl_under_mask_truncated_completions(tiny, tmp_path):
    """mask_truncated_completions masks whole rows; TRL's grpo still divides by every row, and so does an explicit
    rlzoo loss (rlzoo.get_loss("grpo") with TRL's default bias-corrected KL is TRL's grpo at beta 0.04): the same
    per-step losses and final weights. It divided by the rows with a counted token, a larger loss whenever a
    completion was truncated."""
    args = config(tmp_path, loss_type="grpo", beta=0.04, mask_truncated_completions=True,
                  gradient_accumulation_steps=2)
    want_logs, want_weights, _ = train(trl.GRPOTrainer, tiny, args)
    loss = rlzoo.get_loss("grpo", use_bias_correction_kl=True)
    got_logs, got_weights, trainer = train(GRPOTrainer, tiny, args, loss=loss)
    assert not isinstance(trainer.loss_fn, TRLGRPOLoss)
    assert any(0.0 < row["completions/clipped_ratio"] < 1.0 for row in want_logs)  # some rows masked, not all
    for got, want in zip(got_logs, want_logs, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=REFERENCE_ATOL, rel=0)
    torch.testing.assert_close(got_weights, want_weights, atol=REFERENCE_ATOL, rtol=0)


def test_entropy_bonus_with_an_entropy_mask_trains_like_trl(tiny, tmp_path):
    """With one micro-batch per step (the case docs/integrations.md calls equal) the entropy bonus under
    top_entropy_quantile < 1 is TRL's mean over the kept tokens: it was divided by all tokens (step 0's loss
    -0.34 against TRL's -0.61 in a helper's trial)."""
    args = config(tmp_path, gradient_accumulation_steps=1, loss_type="dapo", entropy_coef=0.1, top_entropy_quantile=0.5)
    want_logs, want_weights, _ = train(trl.GRPOTrainer, tiny, args)
    got_logs, got_weights, _ = train(GRPOTrainer, tiny, args)
    for got, want in zip(got_logs, want_logs, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=REFERENCE_ATOL, rel=0)
    torch.testing.assert_close(got_weights, want_weights, atol=REFERENCE_ATOL, rtol=0)


def build_flat_initial(tiny) -> torch.Tensor:
    model, _ = build_tiny_random()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("gradient_accumulation_steps", [1, 2])
def test_bnpo_normalises_by_the_optimizer_step_not_each_micro_batch(tiny, tmp_path, gradient_accumulation_steps):
    """TRL's bnpo divides each micro-batch by its own tokens (then by the accumulation steps); rlzoo divides by
    the optimizer step's tokens (docs/integrations.md). Equal without accumulation, different with it."""
    args = config(tmp_path, gradient_accumulation_steps=gradient_accumulation_steps, loss_type="bnpo")
    want_logs, want_weights, _ = train(trl.GRPOTrainer, tiny, args)
    got_logs, got_weights, _ = train(GRPOTrainer, tiny, args)
    differences = [abs(g["loss"] - w["loss"]) for g, w in zip(got_logs, want_logs, strict=True)]
    if gradient_accumulation_steps == 1:
        assert max(differences) <= REFERENCE_ATOL
        torch.testing.assert_close(got_weights, want_weights, atol=REFERENCE_ATOL, rtol=0)
    else:
        assert max(differences) > 1e-4


class Recorder:
    """Wraps a loss and records every call: (batch, normalizer, loss value); anything else is the loss's."""

    def __init__(self, loss_fn):
        self.loss_fn, self.calls = loss_fn, []

    def __getattr__(self, name):
        return getattr(self.__dict__["loss_fn"], name)

    def loss_mask(self, *args, **kwargs):  # defined, not looked up: Python 3.12's isinstance of a Protocol
        return self.loss_fn.loss_mask(*args, **kwargs)  # (rlzoo.batch.LossMasker) skips __getattr__

    def __call__(self, batch, normalizer):
        out = self.loss_fn(batch, normalizer)
        self.calls.append((batch, normalizer, out.loss.detach()))
        return out


def _concat(batches: list[rlzoo.PolicyBatch]) -> rlzoo.PolicyBatch:
    """One batch from micro-batches of different widths (right padding, masked)."""
    t = max(b.shape[1] for b in batches)

    def pad(x, value=0.0):
        return torch.nn.functional.pad(x, (0, t - x.shape[1]), value=value)

    def cat(field):
        values = [getattr(b, field) for b in batches]
        if all(v is None for v in values):
            return None
        return torch.cat([pad(v.detach()) if v.ndim == 2 else v for v in values])

    return rlzoo.PolicyBatch(
        logprobs=torch.cat([pad(b.logprobs.detach()) for b in batches]),
        old_logprobs=cat("old_logprobs"),  # None: on-policy (or bypass mode) in every micro-batch
        advantages=torch.cat([b.advantages for b in batches]),
        completion_mask=torch.cat([pad(b.completion_mask, False) for b in batches]),
        rollout_logprobs=cat("rollout_logprobs"),
        group_index=cat("group_index"),
        rewards=cat("rewards"),
    )


@pytest.mark.parametrize("steps_per_generation", [2, 4])
def test_gmpo_trains_and_micro_batches_sum_to_the_optimizer_step(tiny, tmp_path, steps_per_generation):
    """loss="gmpo" (not in TRL) trains; each micro-batch gets the counts of its optimizer step (also when a
    generation batch spans two optimizer steps), so the micro-batch losses of a step sum to the loss of the
    step's whole batch."""
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=steps_per_generation,
                  num_iterations=1)
    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS * 4})
    trainer = GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset,
                          processing_class=tokenizer, loss="gmpo")
    assert trainer.loss_fn.name == "gmpo" and trainer.loss_fn.max_completion_length == 8
    recorder = Recorder(trainer.loss_fn)
    trainer.loss_fn = recorder
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 3 and all(math.isfinite(row["loss"]) for row in logs)
    assert all("clip_ratio/region_mean" in row and "entropy" in row for row in logs)
    assert len(recorder.calls) == 3 * 2
    for step in range(3):
        calls = recorder.calls[2 * step : 2 * step + 2]
        full = _concat([batch for batch, _, _ in calls])
        mask = full.completion_mask
        for _, normalizer, _ in calls:
            assert normalizer.num_tokens == mask.sum().item()
            assert normalizer.num_sequences == mask.shape[0]
        total = sum(loss for _, _, loss in calls)
        want = recorder.loss_fn(*_with_every_row(full, recorder.loss_fn)).loss
        assert float(total) == pytest.approx(float(want), abs=REFERENCE_ATOL, rel=0)
        assert float(total) == pytest.approx(logs[step]["loss"], abs=REFERENCE_ATOL, rel=0)
    model, _ = build_tiny_random()
    moved = max((p.detach() - q).abs().max().item() for p, q in zip(trainer.model.parameters(), model.parameters(),
                                                                    strict=True))
    assert moved > 1e-3


def test_evaluation_loss_equals_trl(tiny, tmp_path):
    """prediction_step goes through the rlzoo loss too: evaluate() gives TRL's eval_loss (dapo)."""
    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS})
    args = config(tmp_path, per_device_eval_batch_size=4, max_steps=1)
    results = []
    for cls in (trl.GRPOTrainer, GRPOTrainer):
        torch.manual_seed(0)
        trainer = cls(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, eval_dataset=dataset,
                      processing_class=tokenizer)
        torch.manual_seed(0)
        results.append(trainer.evaluate())
    assert math.isfinite(results[1]["eval_loss"])
    assert results[1]["eval_loss"] == pytest.approx(results[0]["eval_loss"], abs=REFERENCE_ATOL, rel=0)
    assert results[1]["eval_entropy"] == pytest.approx(results[0]["eval_entropy"], abs=REFERENCE_ATOL, rel=0)


# ------------------------------------------------------------------------------------------- construction
def test_kl_penalty_without_reference_model_names_beta(tiny, tmp_path):
    """rlzoo's grpo preset has beta 0.04; TRL's default beta 0 loads no reference model: say to set beta."""
    path, tokenizer = tiny
    with pytest.raises(ValueError, match=r"GRPOConfig\(beta=0.04\)"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), train_dataset=None,
                    processing_class=tokenizer, loss="grpo")


def test_unused_reference_model_warns(tiny, tmp_path):
    """beta != 0 loads a reference model; a loss without a KL term would never read its log-probs."""
    path, tokenizer = tiny
    with pytest.warns(UserWarning, match=r"GRPOConfig\(beta=0.0\)"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path, beta=0.04), processing_class=tokenizer,
                    train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}), loss="gmpo")


def test_is_correction_without_vllm_names_use_vllm(tiny, tmp_path):
    path, tokenizer = tiny
    loss = rlzoo.get_loss("dapo", is_correction="token_truncate", is_max=2.0)
    with pytest.raises(ValueError, match=r"GRPOConfig\(use_vllm=True\)"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer, loss=loss)


def test_an_explicit_loss_without_the_vllm_correction_trl_would_apply_warns():
    """TRL 1.16 corrects the vLLM sampler's drift by default; an explicit loss without a correction drops it, and
    says so (and how to keep it). The default loss (None) maps TRL's correction and gives no warning."""
    args = types.SimpleNamespace(**{**GRPO_LOSS_DEFAULTS, "use_vllm": True, "steps_per_generation": 1,
                                    "gradient_accumulation_steps": 1, "max_completion_length": 8})
    with pytest.warns(UserWarning, match=r"loss 'gmpo' has none.*rlzoo.get_loss\('gmpo', is_correction="
                                         r"'sequence_mask', is_max=3.0\)"):
        resolve_loss("gmpo", args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_loss(rlzoo.get_loss("gmpo", is_correction="sequence_mask", is_max=3.0), args)
        resolve_loss(None, args)
        resolve_loss("gmpo", types.SimpleNamespace(**{**vars(args), "vllm_importance_sampling_correction": False}))


def test_an_explicit_loss_names_the_trl_loss_settings_it_replaces():
    """GRPOConfig's loss fields are TRL's loss's: with loss=... they are not used, and a non-default one is named (an
    entropy bonus or entropy mask was dropped without a word); the fields TRL still reads (beta, vLLM) are not."""
    args = types.SimpleNamespace(**{**GRPO_LOSS_DEFAULTS, "steps_per_generation": 1, "gradient_accumulation_steps": 1,
                                    "max_completion_length": 8, "entropy_coef": 0.1, "top_entropy_quantile": 0.2,
                                    "importance_sampling_level": "sequence", "epsilon": 0.3})
    with pytest.warns(UserWarning, match=r"loss='gmpo'\) replaces TRL's loss, so these GRPOConfig loss settings are "
                                         r"not used: importance_sampling_level='sequence', epsilon=0.3, "
                                         r"top_entropy_quantile=0.2, entropy_coef=0.1 \(give them to the rlzoo loss"):
        resolve_loss("gmpo", args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_loss(None, args)  # TRL's own loss takes them
        resolve_loss("gmpo", types.SimpleNamespace(**{**GRPO_LOSS_DEFAULTS, "steps_per_generation": 1,
                                                      "gradient_accumulation_steps": 1, "max_completion_length": 64}))


def test_a_grpo_config_beta_other_than_the_losss_warns_and_adaptive_entropy_is_refused():
    """GRPOConfig(beta=0.5) with loss="grpo" (beta 0.04) trained with 0.04 without a word; now a warning says that the
    loss's beta weighs the KL and how to give it 0.5 (the same beta, or none needed: no warning). use_adaptive_entropy
    =True with an explicit loss only warned, advising to pass no loss, which raised: it is refused now, as TRL's own
    loss path refuses it."""
    args = types.SimpleNamespace(**{**GRPO_LOSS_DEFAULTS, "steps_per_generation": 1, "gradient_accumulation_steps": 1,
                                    "max_completion_length": 8})
    with pytest.warns(UserWarning, match=r"^GRPOConfig.beta=0.5 only makes TRL compute reference log-probs: the KL "
                                         r"penalty is weighted by the loss's own beta=0.04 \(loss 'grpo'\); give it "
                                         r"yours: rlzoo.get_loss\('grpo', beta=0.5\)$"):
        resolve_loss("grpo", types.SimpleNamespace(**{**vars(args), "beta": 0.5}))
    class ReferenceDrift(rlzoo.losses.Penalty):  # reads the reference, with no KL penalty (beta 0)
        def required_fields(self) -> frozenset[str]:
            return frozenset({"ref_logprobs"})

        def __call__(self, x):
            raise AssertionError("not called")

    dapo = rlzoo.get_loss("dapo")
    drift = dataclasses.replace(dapo, penalties=(*dapo.penalties, ReferenceDrift()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_loss("grpo", types.SimpleNamespace(**{**vars(args), "beta": 0.04}))
        resolve_loss(rlzoo.get_loss("grpo", beta=0.5), types.SimpleNamespace(**{**vars(args), "beta": 0.5}))
        resolve_loss(drift, types.SimpleNamespace(**{**vars(args), "beta": 0.04}))  # no KL beta to set: no advice
    with pytest.raises(ValueError, match=r"^loss 'dapo' needs reference log-probs \(for .*ReferenceDrift.*\), but "
                                         r"GRPOConfig.beta=0.0, .*set GRPOConfig\(beta=...\) to any non-zero value"):
        resolve_loss(drift, args)  # it advised "set GRPOConfig(beta=0.0)"
    adaptive = types.SimpleNamespace(**{**vars(args), "use_adaptive_entropy": True})
    with pytest.raises(ValueError, match=r"^GRPOConfig.use_adaptive_entropy=True is not supported: .* loss 'dapo' "
                                         r"does not run it; set use_adaptive_entropy=False and give the loss a fixed "
                                         r"entropy_coef: rlzoo.get_loss\('dapo', entropy_coef=...\)$"):
        resolve_loss("dapo", adaptive)
    with pytest.raises(ValueError, match=r"^GRPOConfig.use_adaptive_entropy=True is not supported"):
        resolve_loss(None, adaptive)


def test_advice_for_a_loss_object_keeps_its_options_and_fields_trl_never_provides_come_first():
    """The call a message advises keeps the user's other options: loss.with_options(...) for a loss object
    (rlzoo.get_loss('dapo', beta=0.5) dropped kl_estimator='k1'; a composed loss was called 'the loss' in a
    get_loss call that raised). A loss needing fields no GRPOConfig setting gives (loglinear's versions) says so
    first, instead of advising use_vllm=True, after which it still failed."""
    args = types.SimpleNamespace(**{**GRPO_LOSS_DEFAULTS, "steps_per_generation": 1, "gradient_accumulation_steps": 1,
                                    "max_completion_length": 8, "use_vllm": False})
    with pytest.warns(UserWarning, match=r"\(loss 'dapo'\); give it yours: loss.with_options\(beta=0.5\)$"):
        resolve_loss(rlzoo.get_loss("dapo", beta=0.1, kl_estimator="k1"), types.SimpleNamespace(**{**vars(args),
                                                                                                  "beta": 0.5}))
    composed = rlzoo.losses.PolicyLoss(surrogate="ppo_clip", penalties=(rlzoo.losses.KLPenalty(beta=0.04),))
    with pytest.raises(ValueError, match=r"^the loss has a KL penalty \(beta=0.04\).*drop the penalty: "
                                         r"loss.with_options\(beta=0.0\)$"):
        resolve_loss(composed, args)
    with pytest.warns(UserWarning, match=r"^GRPOTrainer\(loss=...\) replaces TRL's loss.*epsilon=0.3 \(give them "
                                         r"to the rlzoo loss, e.g. loss.with_options\(...\); loss.options\(\) lists"):
        resolve_loss(dataclasses.replace(composed, penalties=()), types.SimpleNamespace(**{**vars(args),
                                                                                           "epsilon": 0.3}))
    with pytest.raises(ValueError, match=r"^loss 'dapo' needs PolicyBatch.current_version, PolicyBatch.versions "
                                         r"\(for prox_logp_method='loglinear'\), which TRL's GRPOTrainer does not "
                                         r"provide"):
        resolve_loss(rlzoo.get_loss("dapo", prox_logp_method="loglinear"), args)


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_policy_loss_is_logged_as_trl_logs_it(tiny, tmp_path, loss_type):
    """With an entropy bonus TRL logs policy_loss: for dapo a micro-batch's share of the step's loss, for dr_grpo
    (as grpo) the micro-batch's own loss (twice the share at 2 accumulation steps). The first step's value (before any update;
    later steps differ where the entropy bonus does, docs/integrations.md) is TRL's."""
    args = config(tmp_path, gradient_accumulation_steps=2, loss_type=loss_type, entropy_coef=0.01, max_steps=1)
    want_logs, _, _ = train(trl.GRPOTrainer, tiny, args)
    got_logs, _, _ = train(GRPOTrainer, tiny, args)
    assert abs(want_logs[0]["policy_loss"]) > 1e-3
    assert got_logs[0]["policy_loss"] == pytest.approx(want_logs[0]["policy_loss"], abs=REFERENCE_ATOL, rel=0)


def test_where_the_default_loss_departs_from_trl_it_warns(tiny, tmp_path):
    """dapo with a generation batch of 2 optimizer steps: TRL divides by the generation batch's average step, rlzoo
    by each step's tokens (docs/integrations.md), said at construction; TRL's default steps_per_generation is
    silent."""
    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS})
    args = config(tmp_path, gradient_accumulation_steps=1, steps_per_generation=2)
    with pytest.warns(UserWarning, match=r"steps_per_generation=2 spans 2 optimizer steps: TRL's loss_type='dapo' "
                                         r"divides .* Set steps_per_generation=1"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, processing_class=tokenizer)
    # bnpo and the entropy bonus under accumulation: TRL divides each micro-batch by its own tokens
    for options, named in (({"loss_type": "bnpo"}, "loss_type='bnpo'"),
                           ({"entropy_coef": 0.01}, r"entropy_coef=0\.01 \(its entropy bonus\)")):
        with pytest.warns(UserWarning, match=rf"^TRL's {named} divides each micro-batch by its own token count, .* "
                                             r"gradient_accumulation_steps=2 on 1 process\(es\) .* Set "
                                             r"gradient_accumulation_steps=1 on one process to train as TRL$"):
            GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path, gradient_accumulation_steps=2, **options),
                        train_dataset=dataset, processing_class=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), train_dataset=dataset,
                    processing_class=tokenizer)
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path, loss_type="grpo", steps_per_generation=4),
                    train_dataset=dataset, processing_class=tokenizer)  # TRL's grpo is per micro-batch: the same


def test_bad_loss_argument(tiny, tmp_path):
    path, tokenizer = tiny
    with pytest.raises(TypeError, match="PolicyLoss"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer, loss=3)
    with pytest.raises(KeyError, match="gmpo"):  # UnknownNameError lists the presets
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer,
                    loss="no-such-loss")


def test_unsupported_trl_option_names_the_field(tiny, tmp_path):
    path, tokenizer = tiny
    with pytest.raises(ValueError, match="use_adaptive_entropy"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path, use_adaptive_entropy=True),
                    processing_class=tokenizer)


def test_misaligned_generation_batch_warns(tiny, tmp_path):
    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS})
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=3)
    with pytest.warns(UserWarning, match="not a multiple of gradient_accumulation_steps"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, processing_class=tokenizer)


def _hand_fed(tiny, tmp_path, loss) -> GRPOTrainer:
    """An integration trainer with ``loss`` for hand-built inputs to ``compute_loss`` (eval mode: the counts come
    from the batch itself; its rollout_func is never called)."""
    path, tokenizer = tiny
    trainer = GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}), loss=loss,
                          rollout_func=lambda prompts, trainer: None)
    trainer.model.eval()
    return trainer


def test_sampler_logprobs_feed_the_is_correction_and_nan_tokens_are_not_corrected(tiny, tmp_path):
    """With sampler log-probs (vLLM's, or a rollout_func's) the rlzoo IS correction uses them; a NaN sampler
    log-prob (a token vLLM could not score) gets ratio 1 (no correction), as TRL: the loss equals the loss with
    the old log-prob written there."""
    trainer = _hand_fed(tiny, tmp_path, rlzoo.get_loss("dapo", is_correction="token_truncate", is_max=2.0))
    g = torch.Generator().manual_seed(0)
    b, p, t = 4, 3, 5
    mask = (torch.arange(t) < torch.tensor([5, 3, 4, 1])[:, None]).long()
    with torch.no_grad():
        completion_ids = torch.randint(3, 200, (b, t), generator=g)
        prompt_ids = torch.randint(3, 200, (b, p), generator=g)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones(b, p, dtype=torch.long), mask], 1), t)
    old = (logps + 0.1 * torch.randn(b, t, generator=g)).clamp(max=0)
    sampling = (old + 0.5 * torch.randn(b, t, generator=g)).clamp(max=0)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(b, p, dtype=torch.long),
              "completion_ids": completion_ids, "completion_mask": mask, "advantages": torch.randn(b, generator=g),
              "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    nan = sampling.clone()
    nan[0, 2] = float("nan")
    filled = sampling.clone()
    filled[0, 2] = old[0, 2]
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model, {**inputs, "sampling_per_token_logps": nan})
        want = trainer.compute_loss(trainer.model, {**inputs, "sampling_per_token_logps": filled})
        without = trainer.compute_loss(trainer.model, {**inputs, "sampling_per_token_logps": old})
    assert math.isfinite(float(got))
    assert float(got) == pytest.approx(float(want), abs=REFERENCE_ATOL, rel=0)
    assert abs(float(got) - float(without)) > 1e-4  # the correction acts on the other tokens


def test_nan_sampler_logprobs_carry_no_drift_into_the_off_policy_sequence_mask(tiny, tmp_path):
    """As TRL's get_off_policy_mask (NaN -> no KL evidence): with only the off-policy sequence mask reading the
    sampler's log-probs, a NaN one counts no drift, i.e. reads as the current log-prob, not the old one (here the
    old-minus-current drift there would drop the sequence)."""
    trainer = _hand_fed(tiny, tmp_path, rlzoo.get_loss("dapo", off_policy_mask_threshold=0.1))
    g = torch.Generator().manual_seed(1)
    b, p, t = 2, 3, 2
    mask = torch.ones(b, t, dtype=torch.long)
    with torch.no_grad():
        completion_ids = torch.randint(3, 200, (b, t), generator=g)
        prompt_ids = torch.randint(3, 200, (b, p), generator=g)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.ones(b, p + t, dtype=torch.long), t)
    old = logps + 0.25  # the policy moved since generation: old - current = 0.25 per token
    nan = logps.clone()  # the sampler agrees with the current policy at the first token ...
    nan[:, 1] = float("nan")  # ... and could not score the second
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(b, p, dtype=torch.long),
              "completion_ids": completion_ids, "completion_mask": mask, "advantages": torch.tensor([-1.0, -1.0]),
              "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    current = torch.where(torch.isnan(nan), logps, nan)
    threshold = 0.1  # the drift 0.25 / 2 at the NaN token read as old would exceed it
    adv = inputs["advantages"][:, None]
    trl_mask = trl.GRPOTrainer.get_off_policy_mask(adv, logps, nan, mask, threshold)
    assert torch.equal(trl_mask, trl.GRPOTrainer.get_off_policy_mask(adv, logps, current, mask, threshold))
    assert not torch.equal(trl_mask, trl.GRPOTrainer.get_off_policy_mask(
        adv, logps, torch.where(torch.isnan(nan), old, nan), mask, threshold))  # the old ones would drop it
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model, {**inputs, "sampling_per_token_logps": nan})
        want = trainer.compute_loss(trainer.model, {**inputs, "sampling_per_token_logps": current})
    assert float(got) == pytest.approx(float(want), abs=REFERENCE_ATOL, rel=0) and float(got) != 0.0


def test_a_process_whose_tokens_are_all_rejected_leaves_the_metric_extremes_to_the_others(tiny, tmp_path):
    """A micro-batch whose every token a rollout rejection drops reports placeholder policy extremes (0) over no
    token (LossOutput.metric_tokens): over processes (a second one faked in the gather, with 10 completion tokens, all counted, and
    every metric 0.9) its ratio/min is skipped, so it is the other process's (not 0); its rollout_corr/* metrics,
    judged before the rejection (all 8 of its tokens rejected), keep their weight."""
    trainer = _hand_fed(tiny, tmp_path, rlzoo.get_loss("dapo", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"))
    g = torch.Generator().manual_seed(0)
    b, p, t = 2, 3, 4
    mask = torch.ones(b, t, dtype=torch.long)
    old = -torch.rand(b, t, generator=g) - 0.1
    inputs = {"prompt_ids": torch.randint(3, 200, (b, p), generator=g), "prompt_mask": torch.ones(b, p, dtype=torch.long),
              "completion_ids": torch.randint(3, 200, (b, t), generator=g), "completion_mask": mask,
              "advantages": torch.tensor([1.0, -1.0]), "old_per_token_logps": old,
              "sampling_per_token_logps": old - 2.0, "num_items_in_batch": mask.sum()}  # ratio e^2: all rejected
    other = []

    def gather(local):
        fake = torch.full_like(local, 0.9)
        fake[..., local.shape[-1] // 2 :] = 10.0  # the second half: each metric's tokens
        other.append(fake)
        return torch.cat([local, fake])

    trainer.accelerator.gather = gather
    with torch.no_grad():
        trainer.compute_loss(trainer.model, inputs)
    assert other  # the metrics went through the gather
    logged = trainer._metrics["eval"]
    assert logged["ratio/min"][-1] == pytest.approx(0.9)
    rejected = [k for k in logged if k.startswith("rollout_corr/") and k.endswith("masked_fraction")]
    assert rejected and all(logged[k][-1] == pytest.approx((8 * 1.0 + 10 * 0.9) / 18) for k in rejected), {
        k: logged[k] for k in rejected}


def test_an_extreme_without_a_token_on_any_process_is_nan_which_trl_leaves_out_of_its_average(tiny, tmp_path):
    """A micro-batch without a completion token (mask_truncated_completions masked every row) appends NaN for the
    clip extremes, as TRL's nanmin / nanmax do, so TRL's log averages the other micro-batches' (0 dragged the
    step's clip_ratio/low_min down, and logged 0 where TRL logs None)."""
    trainer = _hand_fed(tiny, tmp_path, "dapo")
    g = torch.Generator().manual_seed(0)
    b, p, t = 2, 3, 4
    inputs = {"prompt_ids": torch.randint(3, 200, (b, p), generator=g), "prompt_mask": torch.ones(b, p, dtype=torch.long),
              "completion_ids": torch.randint(3, 200, (b, t), generator=g),
              "completion_mask": torch.zeros(b, t, dtype=torch.long), "advantages": torch.tensor([1.0, -1.0]),
              "old_per_token_logps": None, "num_items_in_batch": torch.tensor(0)}
    with torch.no_grad():
        trainer.compute_loss(trainer.model, inputs)
    logged = trainer._metrics["eval"]
    assert math.isnan(logged["clip_ratio/low_min"][-1]) and math.isnan(logged["clip_ratio/high_max"][-1])
    assert logged["clip_ratio/low_mean"][-1] == 0.0  # a mean over no token is 0, as TRL's global_masked_mean
    logged["clip_ratio/low_min"].append(0.5)  # another micro-batch's
    trainer.log({})
    assert trainer.state.log_history[-1]["eval_clip_ratio/low_min"] == 0.5


# ------------------------------------------------------------- fields TRL does not return, and the counted tokens
def _steps(calls, per_step):
    """The recorded calls, ``per_step`` (the accumulation steps) per optimizer step."""
    return [calls[i : i + per_step] for i in range(0, len(calls), per_step)]


def _with_every_row(batch, loss_fn):
    """``(batch, its Normalizer)`` counting every row in num_sequences, as the trainer does (and TRL's grpo, and
    verl's trainer): a row whose every token a rejection dropped adds 0 to the seq-mean and 1 to its divisor."""
    policy = loss_fn.loss if isinstance(loss_fn, TRLGRPOLoss) else loss_fn
    counts = rlzoo.Normalizer.from_batch(batch, loss=policy)
    return batch, dataclasses.replace(counts, num_sequences=batch.completion_mask.shape[0])


def _assert_micro_batches_sum_to_the_step(calls, loss_fn, logs):
    """Each step's micro-batch losses (with the trainer's Normalizer) sum to the loss of the step's whole batch
    (its own counts, every row in num_sequences), which TRL logged."""
    for calls_of_step, row in zip(_steps(calls, len(calls) // len(logs)), logs, strict=True):
        total = sum(loss for _, _, loss in calls_of_step)
        want = loss_fn(*_with_every_row(_concat([batch for batch, _, _ in calls_of_step]), loss_fn)).loss
        assert float(total) == pytest.approx(float(want), abs=REFERENCE_ATOL, rel=0)
        assert float(total) == pytest.approx(row["loss"], abs=REFERENCE_ATOL, rel=0)


def test_prompt_mean_gets_trls_prompt_groups_and_the_steps_group_counts(tiny, tmp_path):
    """aggregation="prompt-mean": each completion's group_index is the prompt TRL normalised its advantage over
    (every id holds num_generations completions of one generation batch whose GRPO advantages sum to 0), it
    survives TRL's shuffling into micro-batches, and the Normalizer's group_num_tokens are the optimizer step's:
    micro-batch losses sum to the loss of the step's batch, also when a prompt's completions are split over the
    step's micro-batches. Evaluation counts its one batch."""
    path, tokenizer = tiny
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=1, max_steps=4,
                  per_device_eval_batch_size=4)
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS * 4})
    trainer = GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, eval_dataset=dataset,
                          processing_class=tokenizer, loss=rlzoo.get_loss("dapo", aggregation="prompt-mean"))
    recorder = trainer.loss_fn = Recorder(trainer.loss_fn)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(recorder.calls) == 8
    for generation in (recorder.calls[:4], recorder.calls[4:]):  # 2 optimizer steps of 2 micro-batches each
        ids = torch.cat([batch.group_index for batch, _, _ in generation])
        advantages = torch.cat([batch.advantages for batch, _, _ in generation])
        assert sorted(ids.tolist()) == sorted(list(range(8)) * 2)  # 8 prompts x num_generations=2
        sums = torch.zeros(8).index_add(0, ids, advantages)
        assert sums.abs().max() < 1e-3 and advantages.abs().max() > 0.1  # GRPO: zero mean within TRL's group
    split = [set(a.group_index.tolist()) & set(b.group_index.tolist()) for (a, _, _), (b, _, _) in
             _steps(recorder.calls, 2)]
    assert any(split)  # some prompt has completions in both micro-batches of a step
    for calls_of_step in _steps(recorder.calls, 2):
        full = _concat([batch for batch, _, _ in calls_of_step])
        want = rlzoo.Normalizer.from_masks(full.completion_mask, group_index=[full.group_index], num_groups=8)
        for _, normalizer, _ in calls_of_step:
            assert normalizer.group_num_tokens.tolist() == want.group_num_tokens.tolist()
    _assert_micro_batches_sum_to_the_step(recorder.calls, recorder.loss_fn, logs)

    recorder.calls.clear()
    result = trainer.evaluate()
    assert recorder.calls and math.isfinite(result["eval_loss"])
    for batch, _, loss in recorder.calls:
        assert float(loss) == pytest.approx(float(recorder.loss_fn(batch).loss), abs=REFERENCE_ATOL, rel=0)


def offset(completions, **kwargs):
    """A constant second reward function (weighted 0.5): the combined reward is vowels - 0.35, of both signs."""
    return [-0.7] * len(completions)


def test_vapo_gets_trls_combined_rewards_and_the_steps_positive_token_count(tiny, tmp_path):
    """loss="vapo": the rewards of each completion are TRL's weighted sum of its reward functions (recomputed
    here from the decoded completion), and the Normalizer's num_positive_tokens is the step's, so micro-batch
    losses sum to the loss of the step's batch (positive-example NLL included)."""
    path, tokenizer = tiny
    args = config(tmp_path, gradient_accumulation_steps=2, reward_weights=[1.0, 0.5])
    seen = []

    class Inspecting(GRPOTrainer):
        def compute_loss(self, model, inputs, *rest, **kwargs):
            seen.append(inputs)
            return super().compute_loss(model, inputs, *rest, **kwargs)

    trainer = Inspecting(model=path, reward_funcs=[vowels, offset], args=args, processing_class=tokenizer,
                         train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}), loss="vapo")
    recorder = trainer.loss_fn = Recorder(trainer.loss_fn)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    rewards = torch.cat([batch.rewards for batch, _, _ in recorder.calls])
    assert (rewards > 0).any() and (rewards <= 0).any()
    for inputs, (batch, normalizer, _) in zip(seen, recorder.calls, strict=True):
        texts = tokenizer.batch_decode([ids[mask.bool()] for ids, mask in
                                        zip(inputs["completion_ids"], inputs["completion_mask"], strict=True)],
                                       skip_special_tokens=True)
        want = torch.tensor(vowels(texts)) + 0.5 * torch.tensor(offset(texts))
        torch.testing.assert_close(batch.rewards, want)
    for calls_of_step in _steps(recorder.calls, 2):
        full = _concat([batch for batch, _, _ in calls_of_step])
        positive = (full.completion_mask & (full.rewards > 0)[:, None]).sum().item()
        assert all(normalizer.num_positive_tokens == positive for _, normalizer, _ in calls_of_step)
    assert any(0 < row["positive_nll/fraction"] < 1 for row in logs)
    _assert_micro_batches_sum_to_the_step(recorder.calls, recorder.loss_fn, logs)


def sampler(tokenizer):
    """A ``rollout_func`` standing in for vLLM (not runnable here): random completions of 2-8 tokens (every third
    eos-terminated) with "sampler" log-probs = the policy's own plus N(0, 0.3) noise, so a rollout rejection drops
    some tokens; one token vLLM could not score (None, i.e. NaN); the first token of every fourth completion is an
    environment token (``env_mask`` 0, TRL's ``tool_mask``)."""
    generator = torch.Generator().manual_seed(0)

    def rollout(prompts, trainer):
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids, logprobs, env_mask = [], [], []
        for i, ids in enumerate(prompt_ids):
            n = int(torch.randint(2, 9, (), generator=generator))
            completion = torch.randint(3, 200, (n,), generator=generator).tolist()
            if i % 3 == 0:
                completion[-1] = tokenizer.eos_token_id
            with torch.no_grad():
                own, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, torch.tensor([ids + completion]), torch.ones(1, len(ids) + n, dtype=torch.long), n)
            noisy = (own[0] + 0.3 * torch.randn(n, generator=generator)).clamp(max=0).tolist()
            if i == 1:
                noisy[0] = None
            completion_ids.append(completion)
            logprobs.append(noisy)
            env_mask.append([0 if i % 4 == 0 and t == 0 else 1 for t in range(n)])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask}

    return rollout


REJECTING_LOSSES = {
    "rollout_rs": rlzoo.get_loss("dapo", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"),
    "m2po": rlzoo.get_loss("m2po"),
    "bypass": rlzoo.get_loss("dapo", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25", bypass_mode=True),
}


def test_a_rollout_func_without_logprobs_is_named_when_the_loss_needs_them(tiny, tmp_path):
    """Construction accepts a loss needing sampler log-probs when a rollout_func may return them; one that returns
    "logprobs": None (which TRL accepts) is named at the first batch (it was a BatchError on rollout_logprobs)."""
    path, tokenizer = tiny
    inner = sampler(tokenizer)
    trainer = GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path, max_steps=1), processing_class=tokenizer,
                          loss=rlzoo.get_loss("dapo", is_correction="token_truncate", is_max=2.0),
                          train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
                          rollout_func=lambda prompts, trainer: {**inner(prompts, trainer), "logprobs": None})
    with pytest.raises(ValueError, match=r"^loss 'dapo' needs the sampler's log-probs \(for its sampler/trainer IS "
                                         r"correction .*\), but TRL's batch has none: the rollout_func returned no "
                                         r"'logprobs'"):
        trainer.train()


def _train_sampled(tiny, tmp_path, loss, **settings):
    """(recorder of the loss's calls, per-step logs) of a run with sampler log-probs (:func:`sampler`), 2 micro-batches
    per optimizer step, 4 per generation batch, 2 passes over it (num_iterations 2: TRL computes old log-probs)."""
    path, tokenizer = tiny
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4, **settings)
    trainer = GRPOTrainer(model=path, reward_funcs=vowels, args=args, processing_class=tokenizer, loss=loss,
                          train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
                          rollout_func=sampler(tokenizer))
    recorder = trainer.loss_fn = Recorder(trainer.loss_fn)
    trainer.train()
    return recorder, [row for row in trainer.state.log_history if "loss" in row]


@pytest.mark.parametrize("case", sorted(REJECTING_LOSSES))
def test_rejected_tokens_leave_the_step_counts(tiny, tmp_path, case):
    """With sampler log-probs (a rollout_func standing in for vLLM) and a loss that rejects tokens, the step's
    num_tokens / num_sequences count the tokens the loss counts (loss_fn.loss_mask of each micro-batch, judged
    from TRL's old and sampler log-probs), not every completion token: the micro-batch losses sum to the loss of
    the step's batch. m2po's mask is batch-coupled (judged per micro-batch, so only the counts compare); in
    bypass mode TRL's old log-probs are not passed and the counts keep the rejected tokens (verl's bypass)."""
    loss = REJECTING_LOSSES[case]
    recorder, logs = _train_sampled(tiny, tmp_path, loss)
    assert len(recorder.calls) == 6 and all(math.isfinite(row["loss"]) for row in logs)
    rejected = 0
    for calls_of_step in _steps(recorder.calls, 2):
        batches = [batch for batch, _, _ in calls_of_step]
        assert all((batch.old_logprobs is None) == (case == "bypass") for batch in batches)
        assert all(batch.rollout_logprobs is not None for batch in batches)
        counted = [loss.loss_mask(b.completion_mask, old_logprobs=b.old_logprobs, rollout_logprobs=b.rollout_logprobs)
                   for b in batches]
        tokens = sum(m.sum().item() for m in counted)
        rejected += sum(b.completion_mask.sum().item() for b in batches) - tokens
        for _, normalizer, _ in calls_of_step:
            assert normalizer.num_tokens == tokens
            assert normalizer.num_sequences == sum(m.shape[0] for m in counted)
    if case == "bypass":
        assert rejected == 0
    else:
        assert rejected > 0  # the old count (every completion token) would fail the comparisons above
    if case != "m2po":
        _assert_micro_batches_sum_to_the_step(recorder.calls, recorder.loss_fn, logs)


def test_batch_normalized_is_weights_divide_by_the_generation_batchs_mean(tiny, tmp_path):
    """rollout_is_batch_normalize with TRL's old and sampler log-probs: every micro-batch of a generation batch
    (4 slices, 2 passes of 2 optimizer steps) gets the IS weight sums of the whole generation batch (verl's
    training batch), not its own, so a step's micro-batch losses sum to the loss of the step's batch with the
    generation batch's mean weight (fails when each micro-batch divides by its own mean)."""
    loss = rlzoo.get_loss("dapo", rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    recorder, logs = _train_sampled(tiny, tmp_path, loss, max_steps=4)
    assert len(recorder.calls) == 8 and all(math.isfinite(row["loss"]) for row in logs)
    first_pass = [batch for batch, _, _ in recorder.calls[:4]]  # the generation batch's 4 slices, once each
    sums = sum(loss.is_weight_sums(b.completion_mask, old_logprobs=b.old_logprobs, rollout_logprobs=b.rollout_logprobs)
               for b in first_pass)  # TRL's NaN sampler log-probs reach the loss as the old ones
    assert sums[1] == sum(b.completion_mask.sum() for b in first_pass)
    own = [loss.is_weight_sums(b.completion_mask, old_logprobs=b.old_logprobs, rollout_logprobs=b.rollout_logprobs)
           for b in first_pass]
    assert max(abs(float(s[0] / s[1] - sums[0] / sums[1])) for s in own) > 1e-3  # the micro-batch means differ
    for batch, normalizer, _ in recorder.calls:
        assert float(normalizer.is_weight_sum) == pytest.approx(float(sums[0]), rel=1e-6)
        assert float(normalizer.num_is_weights) == float(sums[1])
    for calls_of_step, row in zip(_steps(recorder.calls, 2), logs, strict=True):
        total = sum(value for _, _, value in calls_of_step)
        full = _concat([batch for batch, _, _ in calls_of_step])
        step = dataclasses.replace(rlzoo.Normalizer.from_masks(full.completion_mask), is_weight_sum=sums[0],
                                   num_is_weights=sums[1])
        want = recorder.loss_fn(full, step).loss
        assert float(total) == pytest.approx(float(want), abs=REFERENCE_ATOL, rel=0)
        assert float(total) == pytest.approx(row["loss"], abs=REFERENCE_ATOL, rel=0)


def test_batch_normalized_is_weights_without_old_logprobs_warn(tiny, tmp_path):
    """On-policy TRL (num_iterations 1, no vLLM correction) computes no old log-probs: the IS weights exist only in
    the forward pass, so with accumulation each micro-batch divides by its own mean weight, and construction says
    so; with old log-probs (num_iterations 2) it is silent."""
    path, tokenizer = tiny
    loss = rlzoo.get_loss("dapo", rollout_is="token", rollout_is_batch_normalize=True)
    kwargs = {"reward_funcs": vowels, "processing_class": tokenizer, "loss": loss, "rollout_func": sampler(tokenizer),
              "train_dataset": datasets.Dataset.from_dict({"prompt": PROMPTS})}
    with pytest.warns(UserWarning, match=r"rollout_is_batch_normalize.*each micro-batch divides by its own mean"):
        GRPOTrainer(model=path, args=config(tmp_path, num_iterations=1, gradient_accumulation_steps=2), **kwargs)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        GRPOTrainer(model=path, args=config(tmp_path, gradient_accumulation_steps=2), **kwargs)
    assert not [w for w in seen if "rollout_is_batch_normalize" in str(w.message)]


def test_loss_needing_a_teacher_is_refused(tiny, tmp_path):
    path, tokenizer = tiny
    with pytest.raises(ValueError, match=r"'opd' needs a teacher's log-probs.*rlzoo train --algorithm opd --teacher"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer, loss="opd")


def test_loss_needing_fields_trl_lacks_names_them(tiny, tmp_path):
    """prox_logp_method="loglinear" needs policy versions, which TRL does not record."""
    path, tokenizer = tiny
    loss = rlzoo.get_loss("decoupled_ppo", prox_logp_method="loglinear")
    with pytest.raises(ValueError, match=r"PolicyBatch\.current_version, PolicyBatch\.versions .*loglinear"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer, loss=loss,
                    rollout_func=sampler(tokenizer))


def test_prompt_mean_across_generation_batches_is_refused(tiny, tmp_path):
    path, tokenizer = tiny
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=3)
    with pytest.raises(ValueError, match=r"group_index.*prompt-mean.*steps_per_generation=3"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, processing_class=tokenizer,
                    loss=rlzoo.get_loss("dapo", aggregation="prompt-mean"))


@pytest.mark.parametrize(("loss", "says"), [
    (rlzoo.get_loss("m2po"), r"rollout rejection m2po\(m2_threshold=0.04\)"),
    (rlzoo.get_loss("dapo", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"), r"rollout rejection rollout_rs"),
    (rlzoo.get_loss("dapo", bypass_mode=True), r"bypass_mode=True"),
])
def test_sampler_logprobs_without_vllm_say_what_needs_them(tiny, tmp_path, loss, says):
    """The refusal names what needs the sampler's log-probs: a rejection or bypass mode is no IS correction."""
    path, tokenizer = tiny
    with pytest.raises(ValueError, match=r"GRPOConfig\(use_vllm=True\)") as raised:
        GRPOTrainer(model=path, reward_funcs=vowels, args=config(tmp_path), processing_class=tokenizer, loss=loss)
    message = str(raised.value)
    assert re.search(says, message), message
    assert ("IS correction" in message) == (loss.is_correction is not None and loss.is_correction.active)


def test_rejection_without_old_logprobs_is_refused(tiny, tmp_path):
    """On-policy TRL computes no old log-probs, which the step's counts of a rejecting loss need up front."""
    path, tokenizer = tiny
    args = config(tmp_path, num_iterations=1)
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_correction=True"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, processing_class=tokenizer,
                    loss=REJECTING_LOSSES["rollout_rs"], rollout_func=sampler(tokenizer))


def test_a_batch_coupled_loss_on_several_processes_warns(tiny, tmp_path, monkeypatch):
    """top_entropy_quantile (TRL gathers the processes' entropies, rlzoo takes each process's micro-batch) is
    exact with one process only: with several, construction says so; with one it is silent."""
    import accelerate

    path, tokenizer = tiny
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS})
    args = config(tmp_path, top_entropy_quantile=0.5, per_device_train_batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, processing_class=tokenizer)
    monkeypatch.setattr(accelerate.Accelerator, "num_processes", property(lambda self: 2))
    with pytest.warns(UserWarning, match=r"loss 'dapo' has batch-coupled parts \(entropy_mask\(top_entropy_quantile=0.5\)\) whose statistics are taken "
                                         r"over each process's micro-batch, not over the 2 processes'"):
        GRPOTrainer(model=path, reward_funcs=vowels, args=args, train_dataset=dataset, processing_class=tokenizer)
