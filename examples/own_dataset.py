"""Train on your own data set: a parquet file in TRL's conversational format, rewarded by one of TRL's own reward
functions and by the data set's answers.

The data: "What is a + b?" as chat messages (a system turn asking for <think> tags, a user turn), with the sum in a
``solution`` column, as TRL's math data sets hold it. The rewards: ``trl.rewards.think_format_reward`` (TRL's
spelling, the function unchanged: it gets conversational completions, ``completions[i][0]["content"]``) and rlzoo's
``accuracy`` (the last number of the completion against ``--task.answer_column solution``). The same run from the
command line::

    rlzoo train --task additions.parquet --task.answer_column solution \\
        --reward-funcs trl.rewards.think_format_reward accuracy --algorithm dapo

TRL's reward functions need trl (and math-verify for ``accuracy_reward``): ``pip install "rlzoo[trl]"``.

Run (seconds with the tiny random model; minutes with ``--model smollm2-135m``)::

    python examples/own_dataset.py --model tiny-random --max-steps 2
"""

import argparse
import random
from pathlib import Path

from datasets import Dataset

from rlzoo.trainer import TrainConfig, Trainer


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--max-completion-length", type=int, default=48)
    parser.add_argument("--eval-size", type=int, default=20)
    parser.add_argument("--output-dir", default="runs/own-dataset")
    args = parser.parse_args(argv)

    # 1. The data set: TRL's conversational format (a list of messages in "prompt") plus a "solution" column.
    rng = random.Random(0)
    rows = []
    for _ in range(200):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"prompt": [{"role": "system", "content": "Think in <think></think> tags, then answer."},
                                {"role": "user", "content": f"What is {a} + {b}?"}],
                     "solution": str(a + b)})
    path = Path(args.output_dir) / "additions.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))

    # 2. The run: the file as --task, its answer column, TRL's reward next to rlzoo's accuracy, any loss.
    config = TrainConfig(
        model=args.model, algorithm="dapo", max_steps=args.max_steps, output_dir=str(Path(args.output_dir) / "run"),
        overwrite=True, task=str(path), task_kwargs={"answer_column": "solution"},
        reward_funcs=("trl.rewards.think_format_reward", "accuracy"), num_generations=4,
        per_device_train_batch_size=16, max_completion_length=args.max_completion_length, eval_size=args.eval_size,
        eval_steps=0, progress=False,
        log_completions=True,
    )
    history = Trainer(config).train()

    # 3. What it did: rewards per function, held-out accuracy, the completions table of the last step.
    last = history[-1]
    print(f"step {last['step']}: think format {last['rewards/think_format_reward/mean']:.2f}, "
          f"accuracy reward {last['rewards/accuracy/mean']:.2f}, held-out accuracy {last.get('eval/accuracy')}")
    print(f"completions: {max((Path(config.output_dir) / 'completions').glob('*.parquet'))}")
    return history


if __name__ == "__main__":
    main()
