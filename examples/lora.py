"""Train a LoRA adapter instead of the whole model, with a KL penalty to the base model, then merge it.

``--peft.*`` options are the fields of ``peft.LoraConfig``; only the adapter's weights train (3.5 % of
SmolLM2-135M's here), the reference policy of the KL term is the base model with the adapter disabled (no second
copy, as TRL does it), checkpoints hold the adapter (``adapter_model.safetensors``) and resume exactly, and the
adapter merges into a plain Hugging Face model at the end. From the command line::

    rlzoo train --peft.r 16 --peft.lora_alpha 32 --peft.target_modules all-linear --loss.beta 0.04 \\
        --learning-rate 2e-4 --output-dir runs/lora
    rlzoo export runs/lora/checkpoints/step-000020 runs/lora/merged

Run (seconds with the tiny random model; a few minutes with ``--model smollm2-135m``)::

    python examples/lora.py --model tiny-random --max-steps 2
"""

import argparse
from pathlib import Path

from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.adapters import export_model
from rlzoo.trainer.models import load_model


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--eval-size", type=int, default=20)
    parser.add_argument("--output-dir", default="runs/lora")
    args = parser.parse_args(argv)

    # 1. The run: GRPO with a KL penalty on chain_sum, a rank-16 LoRA on every linear layer, a LoRA-sized rate.
    config = TrainConfig(
        model=args.model, max_steps=args.max_steps, output_dir=str(Path(args.output_dir) / "run"), overwrite=True,
        peft={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}, loss={"beta": 0.04}, learning_rate=2e-4,
        num_generations=4, per_device_train_batch_size=16, max_completion_length=args.max_completion_length,
        eval_size=args.eval_size, eval_steps=0, progress=False,
    )
    trainer = Trainer(config)
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    print(f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f} %)")
    history = trainer.train()

    # 2. The checkpoint holds the adapter; it loads back onto its base, or merges into a plain model.
    checkpoint = trainer.checkpointer.find("latest")
    print(f"adapter: {sorted(p.name for p in (checkpoint / 'model').iterdir())}")
    merged = export_model(checkpoint, Path(args.output_dir) / "merged", overwrite=True)  # this script's own
    model, _ = load_model(str(merged))
    print(f"merged into {merged} ({type(model).__name__}); final KL {history[-1]['kl']:.4f}, "
          f"held-out accuracy {history[-1].get('eval/accuracy')}")
    return history


if __name__ == "__main__":
    main()
