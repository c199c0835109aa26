"""Side-by-side run: TRL 1.16's GRPOTrainer and ``rlzoo train`` on the same model, task, batch and rewards.

Both runs train SmolLM2-135M-Instruct (rlzoo's converted checkpoint) with GRPO (loss_type="grpo"), 4 prompts x 8
generations per step, max_completion_length 32, learning rate 2e-5 (constant), fp32 on the CPU, on the
reasoning-gym chain_sum task (2 one-digit terms), rewarded by the same accuracy function (the data set's
scorer on the last number of the completion). The same held-out greedy evaluation (200 problems) is applied
to both trained models. Per-step wall times are measured in the same process, one run after the other.

Usage (a quiet machine; about 25 minutes on 2 cores)::

    python benchmarks/compare_trl.py --steps 20 --out benchmarks/results/trl_vs_rlzoo_cpu.json

The JSON holds the machine, the versions, each step's time and reward for both trainers, and the
accuracies; docs/trainer.md quotes it.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from rlzoo.trainer.io import atomic_write_text


def machine_info() -> dict:
    """CPU model, cores, threads and package versions."""
    import transformers
    import trl

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run_trl(args, task, reward_fn, model_dir: str) -> dict:
    """Train with TRL's GRPOTrainer; returns per-step times and rewards and the trained model."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    items = task.next_train(args.steps * args.prompts_per_step)
    dataset = Dataset.from_list([
        {"prompt": [{"role": "user", "content": task.question(item)}], "item_index": i}
        for i, item in enumerate(items)
    ])

    def accuracy(prompts, completions, item_index, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        values = reward_fn(prompts=prompts, completions=texts, items=[items[i] for i in item_index])
        return values[:, 0].tolist()

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.start)

    timer = Timer()
    config = GRPOConfig(
        output_dir=str(Path(args.workdir) / "trl"),
        per_device_train_batch_size=args.prompts_per_step * 8,
        num_generations=8,
        max_completion_length=32,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        max_steps=args.steps,
        loss_type="grpo",
        beta=args.beta,
        use_bias_correction_kl=False,  # plain k3 as GRPO (TRL 1.16 defaults to the DeepSeek-V3.2 correction)
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        shuffle_dataset=False,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    return {"step_times": timer.times, "rewards": rewards, "train_wall_time": total, "model": trainer.model,
            "tokenizer": tokenizer}


def run_rlzoo(args) -> dict:
    """Train with rlzoo's Trainer (the default job's settings); returns per-step times and rewards."""
    from rlzoo.trainer import TrainConfig, Trainer

    config = TrainConfig(max_steps=args.steps, eval_size=0, save_steps=0, progress=False, seed=args.seed,
                         output_dir=str(Path(args.workdir) / "rlzoo"), loss={"beta": args.beta},
                         per_device_train_batch_size=args.prompts_per_step * 8)
    trainer = Trainer(config)
    start = time.perf_counter()
    history = trainer.train()
    total = time.perf_counter() - start
    return {"step_times": [r["step_time"] for r in history if "step_time" in r],
            "generation_times": [r["generation_time"] for r in history if "generation_time" in r],
            "rewards": [r["reward"] for r in history if "reward" in r], "train_wall_time": total,
            "model": trainer.model, "tokenizer": trainer.tokenizer}


def held_out_accuracy(model, tokenizer, task) -> dict:
    """rlzoo's greedy evaluation (200 problems, batch 200) of a trained model."""
    from rlzoo.trainer.evaluation import greedy_accuracy
    from rlzoo.trainer.generation import HFGenerator

    model.eval()
    result = greedy_accuracy(model, tokenizer, task, HFGenerator(tokenizer, max_completion_length=32,
                                                                share_prefix=False), batch_size=200)
    return {"accuracy": result.accuracy, "ci_low": result.ci_low, "ci_high": result.ci_high, "n": result.n}


def summary(times: list[float]) -> dict:
    steady = times[1:] if len(times) > 1 else times
    return {"mean_s": statistics.mean(steady), "median_s": statistics.median(steady), "first_s": times[0],
            "total_s": sum(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--beta", type=float, default=0.04,
                        help="KL coefficient for both (0.04: GRPO's, rlzoo's default job)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--workdir", default="/tmp/rlzoo-compare")
    parser.add_argument("--out", default="benchmarks/results/trl_vs_rlzoo_cpu.json")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from rlzoo.trainer.models import smollm2_checkpoint
    from rlzoo.trainer.rewards import RewardSet
    from rlzoo.trainer.tasks import make_task

    model_dir = str(smollm2_checkpoint())
    kwargs = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    result = {"machine": machine_info(), "settings": vars(args)}

    rlzoo_run = run_rlzoo(args)
    result["rlzoo"] = {k: v for k, v in rlzoo_run.items() if k not in ("model", "tokenizer")}
    result["rlzoo"]["summary"] = summary(rlzoo_run["step_times"])
    eval_task = make_task("chain_sum", kwargs)
    if not args.no_eval:
        result["rlzoo"]["held_out"] = held_out_accuracy(rlzoo_run["model"], rlzoo_run["tokenizer"], eval_task)
    del rlzoo_run

    if not args.skip_trl:
        task = make_task("chain_sum", kwargs)
        rewards = RewardSet(["accuracy"], task=task)
        trl_run = run_trl(args, task, rewards.compute, model_dir)
        result["trl"] = {k: v for k, v in trl_run.items() if k not in ("model", "tokenizer")}
        result["trl"]["summary"] = summary(trl_run["step_times"])
        if not args.no_eval:
            result["trl"]["held_out"] = held_out_accuracy(trl_run["model"], trl_run["tokenizer"], eval_task)
        result["ratio_mean_step_time"] = result["rlzoo"]["summary"]["mean_s"] / result["trl"]["summary"]["mean_s"]
        result["ratio_train_wall_time"] = result["rlzoo"]["train_wall_time"] / result["trl"]["train_wall_time"]

    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k in ("ratio_mean_step_time", "ratio_train_wall_time")}))
    for name in ("rlzoo", "trl"):
        if name in result:
            s = result[name]["summary"]
            print(f"{name}: mean step {s['mean_s']:.1f}s, train wall {result[name]['train_wall_time']:.0f}s, "
                  f"held-out {result[name].get('held_out', {}).get('accuracy')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
