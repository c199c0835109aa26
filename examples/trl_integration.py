"""Train with TRL 1.16's GRPOTrainer and an rlzoo loss TRL does not have (GMPO by default; any preset or PolicyLoss
that TRL can feed without vLLM).

Everything is TRL's (generation, rewards, group advantages, logging); one line changes: the trainer class,
``rlzoo.integrations.trl.GRPOTrainer``, with ``loss=``. The task: two-digit additions, reward 1 when the
completion contains the sum.

Run::

    python examples/trl_integration.py --model smollm2-135m --loss gmpo --max-steps 50   # SmolLM2-135M-Instruct
    python examples/trl_integration.py --model tiny-random --max-steps 2                 # smoke test, seconds
    python examples/trl_integration.py --model Qwen/Qwen2.5-0.5B-Instruct --loss dapo     # any HF id or directory
"""

import argparse
import random
import tempfile

import torch
from datasets import Dataset
from trl import GRPOConfig

import rlzoo
from rlzoo.integrations.trl import GRPOTrainer


def additions(n: int, seed: int = 0) -> Dataset:
    """``n`` prompts "What is a + b?" (conversational, TRL's format) with the answer in a column."""
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(n)]
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}] for a, b in pairs],
        "answer": [str(a + b) for a, b in pairs],
    })


def contains_answer(completions, answer, **kwargs) -> list[float]:
    """TRL reward function: 1.0 when the completion's text contains the right sum."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(a in text) for text, a in zip(texts, answer, strict=True)]


def resolve_model(name: str, scratch: str) -> str:
    """A path TRL can load: rlzoo's built-in names are written to a local directory (no download); the tiny
    random model goes into ``scratch`` (a directory the caller removes)."""
    if name == "smollm2-135m":
        from rlzoo.trainer.models import smollm2_checkpoint

        return str(smollm2_checkpoint())
    if name == "tiny-random":
        from rlzoo.trainer.models import build_tiny_random

        model, tokenizer = build_tiny_random()
        path = f"{scratch}/tiny-random"
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return path
    return name


# The presets TRL can feed without vLLM: not those needing the sampler's log-probs (m2po, decoupled_ppo) or a
# teacher's (opd), which TRL has only from vLLM / not at all.
WITHOUT_VLLM = [name for name in rlzoo.list_losses()
                if not {"rollout_logprobs", "teacher_logprobs"} & rlzoo.get_loss(name).required_fields()]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--loss", default="gmpo", choices=WITHOUT_VLLM)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--output-dir", default="runs/trl-integration")
    args = parser.parse_args(argv)

    # The rlzoo loss: a preset with the paper's defaults (rlzoo explain gmpo), or any rlzoo.PolicyLoss.
    loss = rlzoo.get_loss(args.loss)
    config = GRPOConfig(
        # TRL loads the reference model only when beta != 0: a preset with a KL term (grpo, two_sided) needs its
        # log-probs, and the loss's own beta weighs the KL
        beta=loss.options().get("beta", 0.0),
        output_dir=args.output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=32,
        learning_rate=1e-5,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
    )
    with tempfile.TemporaryDirectory(prefix="trl-integration-") as scratch:  # the tiny model's files, removed after
        trainer = GRPOTrainer(model=resolve_model(args.model, scratch), reward_funcs=contains_answer, args=config,
                              train_dataset=additions(8 * args.max_steps), loss=loss)
        trainer.train()
    history = [row for row in trainer.state.log_history if "loss" in row]
    print(f"{args.loss}: {len(history)} steps, last loss {history[-1]['loss']:.4f}, last reward "
          f"{history[-1]['reward']:.3f}")
    return history


if __name__ == "__main__":
    main()
