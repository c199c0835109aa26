"""Run under torchrun (2 CPU processes, gloo) by tests/trainer/test_distributed.py; writes what it measured
as JSON into OUT_DIR, which the test compares with one-process runs.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/trainer/distributed_worker.py OUT_DIR MODE

MODE ``train``: the trainer cases of :data:`CASES` under ddp and fsdp (per-step losses, final weights), a
DCP checkpoint resumed at 2 ranks, a one-process checkpoint (``OUT_DIR/one/dapo``, written by the test before the
launch) resumed at 2 ranks, and, for every preset and aggregation, each rank's loss with the all-reduced
Normalizer summed over the ranks against the one-process loss. MODE ``kill``: rank 1 dies (SIGKILL) in step 2.
"""

import json
import os
import signal
import sys
from pathlib import Path

TINY = {"model": "tiny-random", "num_generations": 4, "max_completion_length": 6, "eval_size": 0,
        "progress": False, "learning_rate": 1e-3, "reward_funcs": (), "gradient_accumulation_steps": 2,
        "num_iterations": 2, "max_steps": 3, "save_steps": 100}
"""The shared settings; one process uses per_device_train_batch_size 8, two ranks 4 each (the same global batch)."""

CASES = {
    "dapo": {"algorithm": "dapo"},
    "grpo_beta": {"algorithm": "grpo", "loss": {"beta": 0.04}},
    "dr_grpo": {"algorithm": "dr_grpo"},
    "gspo": {"algorithm": "gspo"},
    "prompt_mean": {"algorithm": "grpo", "loss": {"aggregation": "prompt-mean"}},  # group counts over ranks
    "decoupled_ppo": {"algorithm": "decoupled_ppo", "top_p": 0.8},  # the sampler's log-probs (HF generate)
    "rollout_rs": {"top_p": 0.5, "loss": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_1.99"}},  # counts
    "rollout_is_norm": {"top_p": 0.8, "loss": {"rollout_is": "token", "rollout_is_batch_normalize": True}},  # IS sums
    "vapo": {"algorithm": "vapo"},  # the positive-example NLL term: positive-reward token counts summed over ranks
    "dynamic_sampling": {"algorithm": "dapo", "dynamic_sampling": True,  # kept groups chosen in global order
                         "log_completions": True},  # every rank's rows in the table
    "spg_4": {"algorithm": "grpo", "steps_per_generation": 4},  # a batch spans 2 steps: shuffled as one process
}


def digit_fraction(prompts, completions, log_extra=None, trainer_state=None, **columns):
    """Reward: the fraction of a completion's characters that are digits (varies on the random model); logs each
    completion's digits as the completions table's column ``digits`` (TRL's ``log_extra``). Checks that its
    ``trainer_state`` says which process is rank 0 (it said True on every rank)."""
    if trainer_state is not None:
        rank = int(os.environ.get("RANK", "0"))
        assert (trainer_state.is_world_process_zero, trainer_state.is_local_process_zero) == (rank == 0, rank == 0)
    if log_extra is not None:
        log_extra("digits", ["".join(ch for ch in c if ch.isdigit()) for c in completions])
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def weights(trainer) -> dict[str, list[float]]:
    """The full float32 weights (gathered on rank 0), flattened per tensor."""
    return {name: tensor.float().flatten().tolist() for name, tensor in trainer.policy.full_state_dict().items()}


def run_case(out: Path, name: str, parallelism: str, per_device: int, **extra) -> dict:
    from rlzoo.trainer import TrainConfig, Trainer

    config = TrainConfig(**{**TINY, **CASES[name], "per_device_train_batch_size": per_device,
                            "parallelism": parallelism, "output_dir": str(out / f"{name}-{parallelism}"), **extra})
    trainer = Trainer(config, reward_funcs=[digit_fraction])
    reductions = count_gradient_all_reduces(trainer) if parallelism == "ddp" else None
    history = trainer.train()
    return {"losses": [row["loss"] for row in history], "rewards": [row["reward"] for row in history],
            "grad_norms": [row["grad_norm"] for row in history], "num_tokens": [row["num_tokens"] for row in history],
            "reward_std": [row["reward_std"] for row in history],
            "frac_reward_zero_std": [row["frac_reward_zero_std"] for row in history],
            "sharded": trainer.policy.sharded,
            "weights": weights(trainer), "world_size": trainer.dist.world_size,
            "gradient_all_reduces": reductions and reductions[0]}


EVAL = {"algorithm": "dapo", "eval_size": 5, "eval_batch_size": 2, "max_steps": 1}
"""The held-out evaluation case: 5 problems, an uneven split over 2 ranks (3 and 2), batches of 2."""


def eval_rows(out: Path, parallelism: str, per_device: int) -> list[dict]:
    """The evaluation rows (step 0 and the last step) of a 1-step run with :data:`EVAL`: accuracy and its Wilson
    interval, which depends on the number of problems scored (a rank's share alone would widen it)."""
    from rlzoo.trainer import TrainConfig, Trainer

    config = TrainConfig(**{**TINY, **EVAL, "per_device_train_batch_size": per_device, "parallelism": parallelism,
                            "output_dir": str(out / f"eval-{parallelism}")})
    history = Trainer(config, reward_funcs=[digit_fraction]).train()
    return [{k: row[k] for k in ("step", "eval/accuracy", "eval/ci_low", "eval/ci_high")}
            for row in history if row.get("eval/accuracy") is not None]


def count_gradient_all_reduces(trainer) -> list[int]:
    """A DDP communication hook that all-reduces as DDP does and counts the backward passes that reduced (its
    first bucket's reductions): one per optimizer step under ``no_sync`` accumulation."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    count = [0]

    def hook(state, bucket):
        count[0] += bucket.index() == 0
        return allreduce_hook(state, bucket)

    trainer.policy.module.register_comm_hook(None, hook)
    return count


def loss_sums(rank: int, world: int) -> dict:
    """For every preset and aggregation: ranks' losses on their halves (global Normalizer, times the world size
    as DDP expects) summed by all-reduce, against the one-process loss and gradient on the whole batch."""
    import torch
    import torch.distributed as dist

    import rlzoo
    from rlzoo.losses import aggregations
    from rlzoo.trainer.distributed import Distributed

    group = Distributed(rank=rank, world_size=world, initialized=True)
    worst: dict = {"value": 0.0, "grad": 0.0, "cases": 0}
    for preset in rlzoo.list_losses():
        for aggregation in aggregations.names():
            loss_fn = rlzoo.get_loss(preset, aggregation=aggregation, max_completion_length=7)
            needs = loss_fn.required_fields()
            gen = torch.Generator().manual_seed(7)
            b, t = 8, 7
            lp = -torch.rand(b, t, generator=gen, dtype=torch.float64) - 0.05
            fields = {"old_logprobs": (lp + 0.1 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3),
                      "advantages": torch.randn(b, generator=gen, dtype=torch.float64),
                      "completion_mask": torch.rand(b, t, generator=gen) > 0.3}
            if "ref_logprobs" in needs:
                fields["ref_logprobs"] = lp - 0.2 * torch.rand(b, t, generator=gen, dtype=torch.float64)
            if "rollout_logprobs" in needs:
                fields["rollout_logprobs"] = (lp + 0.05 * torch.randn(b, t, generator=gen, dtype=torch.float64)
                                              ).clamp(max=-1e-3)
            if "entropies" in needs:
                fields["entropies"] = torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
            if "rewards" in needs:  # VAPO's positive-example NLL term
                fields["rewards"] = (torch.rand(b, generator=gen) > 0.5).to(torch.float64)
            if "group_index" in needs:  # prompt-mean: groups of 3, so the rank split cuts one
                fields["group_index"] = torch.arange(b) // 3
            if "teacher_logprobs" in needs:
                fields["teacher_logprobs"] = lp - 0.3 * torch.rand(b, t, generator=gen, dtype=torch.float64)
            fields["completion_mask"][:, 0] = True
            if loss_fn.batch_coupled:  # statistics over the batch it is given: per rank, documented
                worst.setdefault("per_rank", []).append(f"{preset}/{aggregation}")
                continue
            full_lp = lp.clone().requires_grad_(True)
            full = loss_fn(rlzoo.PolicyBatch(logprobs=full_lp, **fields))
            full.loss.backward()
            rows = slice(rank * b // world, (rank + 1) * b // world)
            mine_lp = lp.clone().requires_grad_(True)
            mine_fields = {k: v[rows] for k, v in fields.items()}
            groups, rewards = mine_fields.get("group_index"), mine_fields.get("rewards")
            local = rlzoo.Normalizer.from_masks(
                mine_fields["completion_mask"], group_index=None if groups is None else [groups],
                num_groups=None if groups is None else int(fields["group_index"].max()) + 1,
                rewards=None if rewards is None else [rewards])
            normalizer = group.normalizer(local)  # the trainer's one all-reduce of the counts
            out = loss_fn(rlzoo.PolicyBatch(logprobs=mine_lp[rows], **mine_fields), normalizer=normalizer)
            (out.loss * world).backward()  # what DDP's averaging is compensated with
            value = out.loss.detach().clone()
            grad = mine_lp.grad.clone() / world  # DDP averages the per-rank gradients
            dist.all_reduce(value)
            dist.all_reduce(grad)
            worst["value"] = max(worst["value"], float((value - full.loss.detach()).abs()))
            worst["grad"] = max(worst["grad"], float((grad - full_lp.grad).abs().max()))
            worst["cases"] += 1
            if float((value - full.loss.detach()).abs()) > 1e-9 or float((grad - full_lp.grad).abs().max()) > 1e-9:
                worst.setdefault("failures", []).append(f"{preset}/{aggregation}")
    return worst


def older_checkpoint(out: Path, rank: int) -> dict:
    """A checkpoint in the middle of a generation cycle (prompt-mean: the buffer's prompt ids are the loss's group
    ids) rewritten as versions before global prompt ids wrote it: each rank's own prompt ids in its buffer, no
    ``global_prompt_ids`` flag, no ``num_tokens_all_ranks``; resumed on 2 ranks, and the uninterrupted run."""
    import torch
    import torch.distributed as dist

    full = run_case(out / "older", "prompt_mean", "ddp", per_device=4, save_steps=1, save_total_limit=5)
    checkpoint = out / "older" / "prompt_mean-ddp" / "checkpoints" / "step-000001"
    file = checkpoint / f"rollouts-rank{rank}.pt"
    state = torch.load(file, weights_only=True)
    prompts = 4 * 2 // 4  # prompts_per_generation: per_device_train_batch_size x steps_per_generation / G
    assert state["buffer"] and state.pop("global_prompt_ids") and "num_tokens_all_ranks" in state
    del state["num_tokens_all_ranks"]
    for micro_batch in state["buffer"]:
        assert bool((micro_batch["prompt_id"] // prompts == rank).all())  # this rank's share, ids global
        micro_batch["prompt_id"] = micro_batch["prompt_id"] - rank * prompts
    torch.save(state, file)
    dist.barrier()
    resumed = run_case(out / "older-resumed", "prompt_mean", "ddp", per_device=4, resume=str(checkpoint))
    return {"full": full, "resumed": resumed}


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results: dict = {}
    if mode == "alone":  # torchrun --nproc_per_node 1: FSDP2 over a group of one rank (CPU offload on one GPU)
        results["dapo-fsdp"] = run_case(out, "dapo", "fsdp", per_device=8)
        (out / "results.json").write_text(json.dumps(results))
        return
    if mode == "kill":
        from rlzoo.trainer import TrainConfig, Trainer

        calls = []

        def dies(prompts, completions, **columns):
            calls.append(1)
            if rank == 1 and len(calls) == 3:  # the dry check, step 1, then step 2's generation
                os.kill(os.getpid(), signal.SIGKILL)
            return digit_fraction(prompts, completions)

        dies.__name__ = "digit_fraction"
        config = TrainConfig(**{**TINY, "num_iterations": 1, "max_steps": 4, "save_steps": 1,
                                "per_device_train_batch_size": 4, "output_dir": str(out / "killed")})
        Trainer(config, reward_funcs=[dies]).train()
        return
    for parallelism in ("ddp", "fsdp"):
        for name in CASES:
            results[f"{name}-{parallelism}"] = run_case(out, name, parallelism, per_device=4)
    results["dapo-fsdp-checkpointing"] = run_case(out / "checkpointing", "dapo", "fsdp", per_device=4,
                                                  gradient_checkpointing=True)
    # a DCP checkpoint at 2 ranks resumed at 2 ranks: the same as the uninterrupted run, bit for bit
    full = run_case(out / "resume", "dapo", "fsdp", per_device=4, save_steps=1, save_total_limit=5)
    checkpoint = out / "resume" / "dapo-fsdp" / "checkpoints" / "step-000002"
    resumed = run_case(out / "resumed", "dapo", "fsdp", per_device=4, resume=str(checkpoint))
    results["resume"] = {"full": full, "resumed": resumed, "checkpoint": str(checkpoint)}
    # a one-process checkpoint (the test wrote it before the launch, 8 completions per device) resumed on 2 ranks
    one_process = out / "one" / "dapo" / "checkpoints" / "step-000002"
    results["grown"] = run_case(out / "grown", "dapo", "fsdp", per_device=4, resume=str(one_process))
    results["older_checkpoint"] = older_checkpoint(out, rank)
    results["loss_sums"] = loss_sums(rank, world)
    results["eval"] = {parallelism: eval_rows(out, parallelism, per_device=4) for parallelism in ("ddp", "fsdp")}
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
