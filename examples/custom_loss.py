"""Compose a custom loss in Python and train a model with it.

The loss: GSPO's sequence-level ratio with DAPO's asymmetric clip, dual clipping for negative advantages,
a k3 KL penalty with the DeepSeek-V3.2 bias correction, and Dr. GRPO's length-unbiased aggregation.
It is registered as a preset, so in this process ``rlzoo.get_loss("my_gspo")``, its card and
``TrainConfig(algorithm="my_gspo")`` know it too (the ``rlzoo`` command is another process, which has not
imported this file: from a script, ``rlzoo.cli.main(["train", "--algorithm", "my_gspo", ...])`` after the import).

Run (about a minute with the tiny random model; use ``--model smollm2-135m`` for the real one)::

    python examples/custom_loss.py --model tiny-random --max-steps 5
"""

import argparse

import rlzoo
from rlzoo.losses import KLPenalty, PolicyLoss, PPOClip, SequenceRatio, preset
from rlzoo.trainer import TrainConfig, Trainer


@preset(
    "my_gspo",
    title="GSPO ratio + clip-higher + dual clip + bias-corrected KL, length-unbiased",
    paper="a composition of GSPO (arXiv:2507.18071), DAPO (2503.14476), dual-clip PPO (1912.09729), "
    "DeepSeek-V3.2 (2512.02556) and Dr. GRPO (2503.20783)",
    arxiv=None,
    matches="-",
    advantage="dr_grpo",
)
def my_gspo() -> PolicyLoss:
    """loss = sum_i sum_t [-min(s_i A, clip(s_i, 1-3e-4, 1+4e-4) A) bounded by 3|A| + 0.01 w k3] / (S * L_max)."""
    return PolicyLoss(
        ratio=SequenceRatio(),
        surrogate=PPOClip(epsilon_low=3e-4, epsilon_high=4e-4, dual_clip=3.0),
        penalties=(KLPenalty(beta=0.01, kl_estimator="k3", use_bias_correction_kl=True),),
        aggregation="seq-mean-token-sum-norm",
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--output-dir", default="runs/custom-loss")
    args = parser.parse_args(argv)

    loss = rlzoo.get_loss("my_gspo")  # or PolicyLoss(...) directly, without registering it
    print(rlzoo.losses.presets.get("my_gspo").card())
    config = TrainConfig(model=args.model, algorithm="my_gspo", max_steps=args.max_steps,
                         output_dir=args.output_dir, overwrite=True, eval_size=20, eval_steps=0, progress=False)
    # The trainer builds the preset by name; a loss that is not registered is passed as Trainer(config, loss=...).
    history = Trainer(config).train()
    print(f"loss {loss.name}: final reward {history[-1]['reward']:.3f}, "
          f"held-out accuracy {history[-1].get('eval/accuracy')}")
    return history


if __name__ == "__main__":
    main()
