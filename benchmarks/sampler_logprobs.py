"""The sampler's log-probs from Hugging Face generation: what recording them costs, and how close they are to the
trainer's log-probs of the same tokens, on SmolLM2-135M-Instruct with the main job's generation batch.

The generation batch is the main job's: 4 chain_sum prompts x 8 completions, max_completion_length 32,
temperature 1, seeded per group as ``rlzoo train`` samples, fp32 on the CPU. Timing: for each of ``--repeats``
rounds the batch is generated with and without recording, in alternating order (the same seeds, so the same
tokens); the ratio of the medians is what recording adds (a log-softmax of the warped logits per decoding step).
Agreement: the recorded log-probs against the scorer's (``rlzoo.trainer.scorer.completion_logprobs``: the fused
kernel, the training forward) at top_p 1, where the two distributions are the same and only the KV-cache forward's
rounding separates them, and at top_p 0.9, where the sampler's log-prob is the trainer's minus the log of the mass
top-p kept (>= the trainer's).

    python benchmarks/sampler_logprobs.py --out benchmarks/results/sampler_logprobs_cpu.json

docs/trainer.md quotes the result.
"""

import argparse
import json
import os
import platform
import statistics
import time

import torch


def _generate(model, tokenizer, prompts, seeds, *, record: bool, top_p: float = 1.0):
    from rlzoo.trainer.generation import HFGenerator

    generator = HFGenerator(tokenizer, max_completion_length=32, temperature=1.0, top_p=top_p,
                            rollout_logprobs=record)
    start = time.perf_counter()
    out = generator.generate(model, prompts, 8, seeds=seeds)
    return out, time.perf_counter() - start


def _scored(model, gen):
    from rlzoo.trainer.scorer import completion_logprobs

    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask,
                                          group_index=gen.group_index, completion_ids=gen.completion_ids,
                                          completion_mask=gen.completion_mask)
    return logprobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/sampler_logprobs_cpu.json")
    args = parser.parse_args(argv)

    from rlzoo.trainer.io import atomic_write_text
    from rlzoo.trainer.models import load_model
    from rlzoo.trainer.tasks import make_task

    model, tokenizer = load_model("smollm2-135m", dtype=torch.float32)
    model.eval()
    task = make_task("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    prompts = [task.prompt(tokenizer, item) for item in task.next_train(4)]
    seeds = [11, 12, 13, 14]
    times: dict[str, list[float]] = {"recording": [], "plain": []}
    for i in range(args.repeats):
        for record in ((True, False) if i % 2 == 0 else (False, True)):
            gen, seconds = _generate(model, tokenizer, prompts, seeds, record=record)
            times["recording" if record else "plain"].append(seconds)
    same_tokens = torch.equal(_generate(model, tokenizer, prompts, seeds, record=True)[0].completion_ids,
                              _generate(model, tokenizer, prompts, seeds, record=False)[0].completion_ids)
    agreement = {}
    for top_p in (1.0, 0.9):
        gen, _ = _generate(model, tokenizer, prompts, seeds, record=True, top_p=top_p)
        mask = gen.completion_mask
        diff = (gen.rollout_logprobs - _scored(model, gen))[mask]
        agreement[f"top_p_{top_p:g}"] = {
            "tokens": int(mask.sum()),
            "max_abs_diff": float(diff.abs().max()),
            "mean_diff": float(diff.mean()),
            "fraction_sampler_ge_trainer": float((diff >= -1e-5).float().mean()),
        }
    plain, recording = statistics.median(times["plain"]), statistics.median(times["recording"])
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S")},
        "batch": "4 chain_sum prompts x 8 completions, max_completion_length 32, temperature 1, fp32, CPU",
        "seconds": times, "median_plain_s": plain, "median_recording_s": recording,
        "recording_over_plain": recording / plain, "same_tokens": same_tokens, "agreement": agreement,
    }
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_plain_s", "median_recording_s", "recording_over_plain",
                                             "same_tokens", "agreement")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
