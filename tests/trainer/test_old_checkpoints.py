"""Checkpoints written by older versions of rlzoo resume with their fallbacks. Each test builds the old format by
removing from a fresh checkpoint's saved state what older versions did not write (the 2-rank cases are in
tests/trainer/test_distributed.py)."""

import torch

from rlzoo.trainer import TrainConfig, Trainer

TINY = {"model": "tiny-random", "num_generations": 4, "max_completion_length": 6, "eval_size": 0, "progress": False,
        "learning_rate": 1e-3, "reward_funcs": ()}


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _untimed(rows: list[dict]) -> list[dict]:
    timing = ("step_time", "generation_time", "train_time", "tokens_per_second")
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


def test_a_mid_cycle_checkpoint_without_global_prompt_ids_or_the_all_ranks_token_count_resumes_exactly(tmp_path):
    """Older versions wrote each rank's own prompt ids into the unfinished generation batch, without the
    ``global_prompt_ids`` flag, and no ``num_tokens_all_ranks``. On load rank r's ids are shifted by
    r * prompts_per_generation (rank 0's are unchanged) and the token count is the rank's own. prompt-mean's group
    ids are these prompt ids (a wrong shift would put a group out of the step's range), and the checkpoint after step
    1 of 2-pass batches holds an unfinished batch (step 2 trains on it): the resumed run is the uninterrupted one,
    bit for bit."""
    common = {**TINY, "max_steps": 2, "save_steps": 1, "save_total_limit": 5, "num_iterations": 2,
              "gradient_accumulation_steps": 2, "per_device_train_batch_size": 4,
              "loss": {"aggregation": "prompt-mean"}}
    full = Trainer(TrainConfig(**common, output_dir=str(tmp_path / "full")), reward_funcs=[digit_fraction])
    history = full.train()
    checkpoint = tmp_path / "full" / "checkpoints" / "step-000001"
    file = checkpoint / "rollouts-rank0.pt"
    state = torch.load(file, weights_only=True)
    assert state["buffer"] and state.pop("global_prompt_ids") is True
    assert state.pop("num_tokens_all_ranks") == state["num_tokens"] > 0
    assert {int(i) for r in state["buffer"] for i in r["prompt_id"]} == {0, 1}  # two prompts per generation batch
    torch.save(state, file)
    resumed = Trainer(TrainConfig(**common, output_dir=str(tmp_path / "resumed"), resume=str(checkpoint)),
                      reward_funcs=[digit_fraction])
    assert _untimed(resumed.train()) == _untimed(history)
    assert history[1]["ratio/mean"] != 1.0  # step 2 is the batch's second pass: the restored batch was trained on
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
