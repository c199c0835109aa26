"""The trainer on a CUDA device (skipped without one; run on a GPU machine with ``python -m pytest -m cuda``): every
tensor of a generation batch on the device (rewards included), the Triton log-prob path, bf16 autocast and bf16
parameters, dynamic sampling, the completions table, a checkpoint and its resume."""

import dataclasses
import json
import math

import pytest
import torch

from rlzoo.trainer import TrainConfig, Trainer


def digit_fraction(prompts, completions, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _config(tmp_path, name, **extra) -> TrainConfig:
    return TrainConfig(**{"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8,
                          "max_completion_length": 8, "eval_size": 8, "progress": False, "learning_rate": 1e-3,
                          "reward_funcs": (), "max_steps": 2, "num_iterations": 2, "save_steps": 1,
                          "output_dir": str(tmp_path / name), **extra})


@pytest.mark.cuda
@pytest.mark.parametrize(("dtype", "extra"), [
    ("float32", {"algorithm": "dapo", "dynamic_sampling": True, "log_completions": True}),
    ("bf16-mixed", {"algorithm": "grpo", "loss": {"beta": 0.04}, "overlong_buffer": 2}),
    ("bfloat16", {"algorithm": "gspo", "steps_per_generation": 2, "gradient_accumulation_steps": 1}),
])
def test_trains_on_cuda_and_resumes(tmp_path, dtype, extra):
    trainer = Trainer(_config(tmp_path, "run", dtype=dtype, **extra), reward_funcs=[digit_fraction])
    history = trainer.train()
    assert trainer.precision.device.type == "cuda"
    history = [row for row in history if "loss" in row]  # not the step-0 evaluation
    assert [row["step"] for row in history] == [1, 2]
    for row in history:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
    assert next(trainer.model.parameters()).device.type == "cuda"
    if extra.get("log_completions"):
        assert sorted(p.name for p in (tmp_path / "run" / "completions").glob("*.parquet"))
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    resumed = [row for row in Trainer(_config(tmp_path, "resumed", dtype=dtype, resume=str(checkpoint), **extra),
                                      reward_funcs=[digit_fraction]).train() if "loss" in row]
    assert resumed[-1]["step"] == 2
    # the same completions (sampling is seeded per group) and the same update up to CUDA's non-deterministic
    # reductions (atomics in the embedding backward)
    assert resumed[-1]["reward"] == history[-1]["reward"]
    assert resumed[-1]["grad_norm"] == pytest.approx(history[-1]["grad_norm"], rel=1e-3)
    assert json.loads((tmp_path / "run" / "config.json").read_text())


@pytest.mark.cuda
def test_fused_triton_log_probs_in_the_trainer_match_the_plain_path(tmp_path):
    """The trainer's log-probs through the fused Triton kernels equal the plain logits path on the same batch."""
    trainer = Trainer(_config(tmp_path, "run", dtype="float32", max_steps=1), reward_funcs=[digit_fraction])
    rollout, _ = trainer.rollouts.generate()
    fused = trainer.scorer.generation_logprobs(trainer.policy.module, rollout)
    trainer.scorer.config = dataclasses.replace(trainer.scorer.config, logprobs_backend="plain")
    plain = trainer.scorer.generation_logprobs(trainer.policy.module, rollout)
    mask = rollout.completion_mask
    torch.testing.assert_close(fused[mask], plain[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
def test_lora_with_its_reference_and_a_teacher_train_on_cuda(tmp_path):
    """Under bf16 autocast on the GPU: a LoRA run whose reference is the base with the adapter disabled (KL exactly 0
    at step 1, then the policy moves), with truncated completions masked, resumes and exports a merged model with the
    adapter's outputs; an on-policy distillation run scores its teacher on the GPU."""
    from rlzoo.trainer.adapters import export_model
    from rlzoo.trainer.models import TinyRandomSpec, build_tiny_random, load_model

    lora = {"algorithm": "grpo", "loss": {"beta": 0.04}, "mask_truncated_completions": True, "max_completion_length": 16,
            "peft": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}, "dtype": "bf16-mixed"}
    trainer = Trainer(_config(tmp_path, "lora", **lora), reward_funcs=[digit_fraction])
    rows = [row for row in trainer.train() if "loss" in row]
    assert rows[0]["kl"] == 0.0 and all(math.isfinite(row["loss"]) for row in rows)
    assert {p.device.type for p in trainer.model.parameters()} == {"cuda"}
    checkpoint = tmp_path / "lora" / "checkpoints" / "step-000001"
    resumed = [row for row in Trainer(_config(tmp_path, "resumed", resume=str(checkpoint), **lora),
                                      reward_funcs=[digit_fraction]).train() if "loss" in row]
    assert resumed[-1]["step"] == 2 and resumed[-1]["reward"] == rows[-1]["reward"]
    export_model(tmp_path / "lora" / "checkpoints" / "step-000002", tmp_path / "merged")
    adapter, tokenizer = load_model(str(tmp_path / "lora" / "checkpoints" / "step-000002" / "model"))
    merged, _ = load_model(str(tmp_path / "merged"))
    ids = tokenizer(["3 + 4 = 7"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapter(ids).logits, atol=1e-5, rtol=1e-5)

    teacher, teacher_tokenizer = build_tiny_random(TinyRandomSpec(seed=1))  # other weights than the policy's
    teacher.save_pretrained(tmp_path / "teacher")
    teacher_tokenizer.save_pretrained(tmp_path / "teacher")
    trainer = Trainer(_config(tmp_path, "opd", algorithm="opd", teacher=str(tmp_path / "teacher"), dtype="bf16-mixed"),
                      reward_funcs=[digit_fraction])
    rows = [row for row in trainer.train() if "loss" in row]
    assert next(trainer.teacher.module.parameters()).device.type == "cuda"
    assert all(math.isfinite(row["loss"]) and row["distillation/kl"] != 0.0 for row in rows)
