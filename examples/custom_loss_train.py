"""Compose a loss in Python and train a model with it: no registration, no preset, just parts.

The loss: GSPO's sequence-level ratio and asymmetric clip (epsilon 3e-4 / 4e-4, GSPO's defaults), an entropy
bonus, and Dr. GRPO's length-unbiased aggregation (``seq-mean-token-sum-norm``); the advantage estimator is RLOO.
``Trainer(config, loss=...)`` takes any :class:`rlzoo.losses.PolicyLoss`; ``config.json`` records it as built
(``resolved_loss``).
To give it a name for ``--algorithm`` and ``rlzoo explain``, register it as a preset (examples/custom_loss.py).

Run (seconds with the tiny random model; use ``--model smollm2-135m`` for the real one)::

    python examples/custom_loss_train.py --model tiny-random --max-steps 2
"""

import argparse

from rlzoo.losses import EntropyBonus, PolicyLoss, PPOClip, SequenceRatio
from rlzoo.trainer import TrainConfig, Trainer


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--eval-size", type=int, default=20)
    parser.add_argument("--output-dir", default="runs/custom-loss-train")
    args = parser.parse_args(argv)

    # 1. The loss, from parts.
    loss = PolicyLoss(
        ratio=SequenceRatio(),
        surrogate=PPOClip(epsilon_low=3e-4, epsilon_high=4e-4),
        penalties=(EntropyBonus(entropy_coef=1e-3),),
        aggregation="seq-mean-token-sum-norm",
    )
    print(loss.describe())

    # 2. Train with it (the estimator by name; everything else as rlzoo train's flags).
    config = TrainConfig(model=args.model, advantage="rloo", max_steps=args.max_steps, output_dir=args.output_dir,
                         overwrite=True, num_generations=4, per_device_train_batch_size=16,
                         max_completion_length=args.max_completion_length, eval_size=args.eval_size, eval_steps=0,
                         progress=False)
    history = Trainer(config, loss=loss).train()
    print(f"final reward {history[-1]['reward']:.3f}, entropy {history[-1]['entropy']:.3f}, "
          f"held-out accuracy {history[-1].get('eval/accuracy')}")
    return history


if __name__ == "__main__":
    main()
