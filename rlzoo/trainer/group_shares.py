"""Which rank holds which completions of a generation batch, chosen so that a run's batches do not depend on the
number of ranks.

Every rank samples its consecutive share of the round's global list of prompt groups (seeded per group), so the
completions themselves are rank-invariant. Two choices made afterwards depend on the whole batch, and one process
makes them over the whole batch:

- DAPO's dynamic sampling keeps the first ``prompts_per_generation x ranks`` groups with non-constant rewards in
  the global order (round, then group index), filling with dropped groups after ``max_sampling_rounds``
  (:func:`select_groups`). A kept group sampled on one rank may belong to another rank's share: it is sent there.
- When a pass over a generation batch does not fit in whole optimizer steps (``gradient_accumulation_steps`` not a
  multiple of ``steps_per_generation``), which completions share an optimizer step is the one-process shuffle of
  the whole batch into micro-batches; rank ``r`` takes the ``r``-th slice of each (:func:`split_globally`).

A group travels with everything computed from it before the choice: its tensors, texts and rewards, and the values
reward functions logged for its completions with ``log_extra`` (the completions table's extra columns).

Both are the identity in one process (no communication, the one-process code path unchanged).
"""

from typing import Any

import torch
from torch import Tensor

from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.generation import Generated
from rlzoo.trainer.rollout import Rollout

__all__ = ["Group", "GroupKey", "assemble", "select_groups", "split_generation_batch", "split_globally"]

Group = tuple[Generated, int, Tensor, Tensor, dict[str, list[Any]]]
"""A prompt group: ``(generation, its prompt row, rewards Float[G, K], combined reward Float[G], extra)``; ``extra``:
the ``log_extra`` columns of its ``G`` completions (column -> ``G`` values, None where a function logged fewer)."""

GroupKey = tuple[int, int]
"""``(generation round, global group index)``: the order one process samples groups in."""


def _left(x: Tensor, width: int, value: int | bool) -> Tensor:
    """Left-pad the last dim to ``width`` (prompts)."""
    return torch.nn.functional.pad(x, (width - x.shape[-1], 0), value=value)


def _right(x: Tensor, width: int, value: float | bool) -> Tensor:
    """Right-pad the last dim of a 2-D tensor to ``width`` (completions); 1-D tensors as they are."""
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value) if x.ndim == 2 else x


def assemble(groups: list[Group], *, pad_token_id: int, device: torch.device) -> Rollout:
    """One rollout of ``groups`` (possibly from several generation rounds and ranks), in order: prompts
    left-padded, completions right-padded to the widest; advantages zero (computed later)."""
    g = groups[0][3].shape[0]
    width_p = max(gen.prompt_ids.shape[1] for gen, *_ in groups)
    width_c = max(gen.completion_ids.shape[1] for gen, *_ in groups)
    prompt_ids, prompt_mask, comp_ids, comp_mask, trunc, texts, values, rewards, rollout_lp = ([] for _ in range(9))
    for gen, i, vals, rew, _ in groups:
        prompt_ids.append(_left(gen.prompt_ids[i], width_p, pad_token_id))
        prompt_mask.append(_left(gen.prompt_mask[i], width_p, False))
        sl = slice(i * g, (i + 1) * g)
        comp_ids.append(_right(gen.completion_ids[sl], width_c, pad_token_id))
        comp_mask.append(_right(gen.completion_mask[sl], width_c, False))
        trunc.append(gen.is_truncated[sl])
        texts += gen.texts[sl]
        values.append(vals)
        rewards.append(rew)
        if gen.rollout_logprobs is not None:
            rollout_lp.append(_right(gen.rollout_logprobs[sl], width_c, 0.0))
    n_prompts = len(groups)
    return Rollout(
        prompt_ids=torch.stack(prompt_ids), prompt_mask=torch.stack(prompt_mask),
        group_index=torch.arange(n_prompts, device=device).repeat_interleave(g),
        completion_ids=torch.cat(comp_ids), completion_mask=torch.cat(comp_mask),
        is_truncated=torch.cat(trunc), rewards=torch.cat(values), reward=torch.cat(rewards),
        advantages=torch.zeros(n_prompts * g, device=device), texts=texts,
        rollout_logprobs=torch.cat(rollout_lp) if rollout_lp else None,
    )


def select_groups(kept: list[tuple[GroupKey, Group]], dropped: list[tuple[GroupKey, Group]], *, need: int,
                  dist: Distributed) -> list[tuple[GroupKey, Group, bool]]:
    """This rank's share of the generation batch after DAPO's dynamic sampling: positions
    ``[rank * need, (rank + 1) * need)`` of the global order (kept groups by key, then dropped ones by key to fill
    when sampling gave up), as one process with ``need x ranks`` prompts selects them.

    Args:
        kept: this rank's groups with non-constant rewards (all groups without dynamic sampling), by key.
        dropped: this rank's groups with constant rewards, by key.
        need: groups per rank (``prompts_per_generation``).
        dist: the process group (one all-gather of the keys and one of the groups that change rank).

    Returns:
        ``(key, group, sampled here)`` per group of the share, in global order (a group sampled on another rank
        has a one-prompt :class:`Generated` of its own).
    """
    if not dist.enabled:
        return [(key, group, True) for key, group in (kept + dropped[: max(0, need - len(kept))])[:need]]
    keys = dist.all_gather_object(([key for key, _ in kept], [key for key, _ in dropped]))
    order = [(key, owner) for part in (0, 1) for key, owner in sorted(
        (key, owner) for owner, lists in enumerate(keys) for key in lists[part])][: need * dist.world_size]
    mine = order[dist.rank * need:(dist.rank + 1) * need]
    local = dict(kept + dropped)
    leaving = {key for position, (key, owner) in enumerate(order)
               if owner == dist.rank and position // need != dist.rank}
    arriving: dict[GroupKey, dict[str, Any]] = {}
    for sent in dist.all_gather_object({key: _pack(local[key]) for key in leaving}):
        arriving.update(sent)
    device = next(iter(local.values()))[0].completion_ids.device if local else torch.device("cpu")
    return [(key, local[key], True) if owner == dist.rank else (key, _unpack(arriving[key], device), False)
            for key, owner in mine]


def _pack(group: Group) -> dict[str, Any]:
    """One group's tensors on the CPU and its ``log_extra`` values (to send to another rank)."""
    gen, i, values, reward, extra = group
    g = reward.shape[0]
    rows = slice(i * g, (i + 1) * g)
    lp = gen.rollout_logprobs
    return {"prompt_ids": gen.prompt_ids[i:i + 1].cpu(), "prompt_mask": gen.prompt_mask[i:i + 1].cpu(),
            "completion_ids": gen.completion_ids[rows].cpu(), "completion_mask": gen.completion_mask[rows].cpu(),
            "is_truncated": gen.is_truncated[rows].cpu(), "texts": gen.texts[rows],
            "rollout_logprobs": None if lp is None else lp[rows].cpu(), "values": values.cpu(),
            "reward": reward.cpu(), "extra": extra}


def _unpack(packed: dict[str, Any], device: torch.device) -> Group:
    """The group :func:`_pack` sent, as a one-prompt generation on ``device``."""
    t = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in packed.items()}
    g = t["reward"].shape[0]
    gen = Generated(prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"],
                    group_index=torch.zeros(g, dtype=torch.long, device=device), completion_ids=t["completion_ids"],
                    completion_mask=t["completion_mask"], is_truncated=t["is_truncated"], texts=t["texts"],
                    rollout_logprobs=t["rollout_logprobs"])
    return gen, 0, t["values"], t["reward"], t["extra"]


def split_globally(rollout: Rollout, parts: int, *, generator: torch.Generator, group_size: int, pad_token_id: int,
                   dist: Distributed) -> list[Rollout]:
    """This rank's ``parts`` micro-batches of the generation batch: the whole batch (every rank's share, gathered)
    shuffled and split as one process does (:meth:`Rollout.split` with the same ``generator``, in the same state
    on every rank), and of each micro-batch the ``rank``-th of ``world_size`` equal slices.

    Args:
        rollout: this rank's share (scored, with advantages); its ``prompt_id`` is the global prompt index.
        parts: micro-batches per generation batch (``steps_per_generation``).
        generator: the shuffling RNG.
        group_size: completions per prompt (whole groups are shuffled).
        pad_token_id: pads completion ids to the widest rank's.
        dist: the process group (one all-gather of the rollouts).

    Raises:
        ValueError: a micro-batch does not split into ``world_size`` equal slices.
    """
    if not dist.enabled:
        return rollout.split(parts, generator=generator, group_size=group_size)
    whole = _concat(dist.all_gather_object(_cpu(rollout)), pad_token_id=pad_token_id,
                    device=rollout.completion_ids.device)
    micro_batches = whole.split(parts, generator=generator, group_size=group_size)
    size, world = micro_batches[0].num_completions, dist.world_size
    if size % world:
        raise ValueError(f"a micro-batch of {size} completions cannot be split over {world} ranks")
    mine = torch.arange(dist.rank * size // world, (dist.rank + 1) * size // world)
    return [mb.select(mine) for mb in micro_batches]


def split_generation_batch(rollout: Rollout, parts: int, *, gradient_accumulation_steps: int,
                           generator: torch.Generator, group_size: int, pad_token_id: int,
                           dist: Distributed) -> list[Rollout]:
    """This rank's ``parts`` micro-batches of a generation batch. When a pass over them does not fit in whole
    optimizer steps (``gradient_accumulation_steps`` not a multiple of ``parts``: it spans several steps, or a step
    ends inside it), the whole batch is shuffled as one process does (:func:`split_globally`), so that which
    completions share a step does not depend on the number of ranks; otherwise each pass lies in one step and each
    rank shuffles its own share (:meth:`Rollout.split`: no communication).

    Args: as :func:`split_globally`'s, plus ``gradient_accumulation_steps`` (micro-batches per optimizer step).

    Raises:
        ValueError: the batch's completions do not split into ``parts`` equal micro-batches
            (:meth:`Rollout.split`), or a micro-batch into ``world_size`` equal slices (:func:`split_globally`).
    """
    if gradient_accumulation_steps % parts:
        return split_globally(rollout, parts, generator=generator, group_size=group_size, pad_token_id=pad_token_id,
                              dist=dist)
    return rollout.split(parts, generator=generator, group_size=group_size)


def _cpu(rollout: Rollout) -> dict[str, Any]:
    return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in rollout.state_dict().items()}


def _concat(shares: list[dict[str, Any]], *, pad_token_id: int, device: torch.device) -> Rollout:
    """The generation batch from every rank's share (prompts left-padded, completions right-padded to the widest)."""
    width_p = max(s["prompt_ids"].shape[1] for s in shares)
    width_c = max(s["completion_ids"].shape[1] for s in shares)

    def cat(name: str, pad: Any = None) -> Tensor | None:
        values = [s[name] for s in shares]
        if values[0] is None:
            return None
        return torch.cat([_right(v, width_c, pad) if pad is not None else v for v in values]).to(device)

    offsets = torch.tensor([0] + [s["prompt_ids"].shape[0] for s in shares[:-1]]).cumsum(0).tolist()
    return Rollout(
        prompt_ids=torch.cat([_left(s["prompt_ids"], width_p, pad_token_id) for s in shares]).to(device),
        prompt_mask=torch.cat([_left(s["prompt_mask"], width_p, False) for s in shares]).to(device),
        group_index=torch.cat([s["group_index"] + o for s, o in zip(shares, offsets, strict=True)]).to(device),
        completion_ids=cat("completion_ids", pad_token_id), completion_mask=cat("completion_mask", False),
        is_truncated=cat("is_truncated"), rewards=cat("rewards"), reward=cat("reward"),
        advantages=cat("advantages", 0.0), old_logprobs=cat("old_logprobs", 0.0),
        ref_logprobs=cat("ref_logprobs", 0.0), rollout_logprobs=cat("rollout_logprobs", 0.0),
        teacher_logprobs=cat("teacher_logprobs", 0.0), texts=[t for s in shares for t in s["texts"]],
        prompt_id=cat("prompt_id"), version=shares[0]["version"],
    )
