"""Rollouts: a generation batch of completions and everything computed from them (rewards, advantages,
old / reference / sampler log-probs), and how it is split into micro-batches.

Notation: ``Np`` unique prompts, ``P`` padded prompt length (left padded), ``N = Np * G`` completions,
``C`` padded completion length (right padded), ``K`` reward functions.
"""

import dataclasses

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["Rollout", "check_restored_batch", "position_ids_for"]


@dataclasses.dataclass(kw_only=True)
class Rollout:
    """A generation batch (or a slice of one): prompts, completions, rewards, advantages, log-probs.

    Attributes:
        prompt_ids: ``Int[Np, P]`` left-padded prompt tokens (unique prompts).
        prompt_mask: ``Bool[Np, P]`` True on real prompt tokens.
        group_index: ``Int[N]`` the prompt row of each completion.
        completion_ids: ``Int[N, C]`` right-padded completion tokens.
        completion_mask: ``Bool[N, C]`` tokens that count in the loss (up to and including EOS; all False
            for a truncated completion when ``mask_truncated_completions``).
        is_truncated: ``Bool[N]`` no EOS within ``max_completion_length``.
        rewards: ``Float[N, K]`` each reward function's value (NaN = not applicable).
        reward: ``Float[N]`` the combined reward the advantage is computed from.
        advantages: ``Float[N]`` (or ``Float[N, C]`` for token-level estimators).
        old_logprobs, ref_logprobs, rollout_logprobs, teacher_logprobs: ``Float[N, C]`` or None.
        texts: decoded completions; questions: the prompt of each completion (for logging).
        prompt_id: ``Int[N]`` the prompt of each completion in the generation batch it came from, indexed over
            every rank's share (rank ``r``'s prompts from ``r * prompts_per_generation``; kept by :meth:`select`,
            which re-indexes ``group_index``); None: ``group_index`` (a whole generation batch of one process).
        version: the policy version that generated the batch, AReaL's ``versions`` (for the log-linear proximal
            policy): the optimizer steps completed before its generation, i.e. the weights the sampler had (batches
            sampled with the same weights share it).
    """

    prompt_ids: Int[Tensor, "Np P"]
    prompt_mask: Bool[Tensor, "Np P"]
    group_index: Int[Tensor, " N"]
    completion_ids: Int[Tensor, "N C"]
    completion_mask: Bool[Tensor, "N C"]
    is_truncated: Bool[Tensor, " N"]
    rewards: Float[Tensor, "N K"]
    reward: Float[Tensor, " N"]
    advantages: Float[Tensor, " N"] | Float[Tensor, "N C"]
    old_logprobs: Float[Tensor, "N C"] | None = None
    ref_logprobs: Float[Tensor, "N C"] | None = None
    rollout_logprobs: Float[Tensor, "N C"] | None = None
    teacher_logprobs: Float[Tensor, "N C"] | None = None
    texts: list[str] = dataclasses.field(default_factory=list)
    prompt_id: Int[Tensor, " N"] | None = None
    version: int = 0

    @property
    def num_completions(self) -> int:
        """N."""
        return int(self.completion_ids.shape[0])

    def select(self, index: Int[Tensor, " M"]) -> "Rollout":
        """The completions at ``index`` (with only the prompts they use, re-indexed)."""
        index = index.to(self.group_index.device)
        groups = self.group_index[index]
        used, new_group_index = torch.unique(groups, sorted=True, return_inverse=True)

        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[index]

        return Rollout(
            prompt_ids=self.prompt_ids[used],
            prompt_mask=self.prompt_mask[used],
            group_index=new_group_index,
            completion_ids=self.completion_ids[index],
            completion_mask=self.completion_mask[index],
            is_truncated=self.is_truncated[index],
            rewards=self.rewards[index],
            reward=self.reward[index],
            advantages=self.advantages[index],
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
            rollout_logprobs=pick(self.rollout_logprobs),
            teacher_logprobs=pick(self.teacher_logprobs),
            texts=[self.texts[i] for i in index.tolist()] if self.texts else [],
            prompt_id=(self.group_index if self.prompt_id is None else self.prompt_id)[index],
            version=self.version,
        )

    def split(self, parts: int, generator: torch.Generator | None = None, group_size: int = 1) -> list["Rollout"]:
        """Shuffle whole groups (with ``generator``) and split into ``parts`` equal micro-batches.

        Shuffling groups rather than completions keeps a prompt's completions together, so prefix sharing
        still runs each prompt once per micro-batch.

        Raises:
            ValueError: if N is not divisible by ``parts``.
        """
        n = self.num_completions
        if n % parts != 0:
            raise ValueError(f"{n} completions cannot be split into {parts} equal micro-batches")
        if group_size > 1 and n % group_size == 0:
            order = torch.randperm(n // group_size, generator=generator)
            perm = (order[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1)
        else:
            perm = torch.randperm(n, generator=generator)
        size = n // parts
        return [self.select(perm[i * size:(i + 1) * size]) for i in range(parts)]

    def state_dict(self) -> dict[str, object]:
        """Tensors and texts, for checkpoints (mid-cycle resume)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def position_ids_for(prompt_mask: Bool[Tensor, "Np P"]) -> Int[Tensor, "Np P"]:
    """Position ids of left-padded prompts, as ``generate`` assigns them: real tokens count from 0."""
    return (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)


_RESTORED_NEEDS = {  # field -> why this run needs it, and the other way out than a generation boundary
    "old_logprobs": (("this run needs (the data is stale, the loss rejects tokens or normalises its IS weights over the "
                     "batch, and bypass_mode / prox_logp_method='loglinear' are off)"),
                     "keep the loss options until then"),
    "ref_logprobs": ("the loss now needs (beta > 0)", "keep --loss.beta 0 for now"),
    "teacher_logprobs": ("the loss now needs", "add --teacher later"),
    "rollout_logprobs": ("the loss now needs", "add the option later"),
}


def check_restored_batch(buffer: list[Rollout], *, old: bool, ref: bool, teacher: bool, rollout: bool) -> None:
    """Check that an unfinished generation batch restored from a checkpoint holds the log-probs this run needs:
    ``old`` / ``ref`` / ``teacher`` / ``rollout`` say whether it needs old, reference, teacher or sampler log-probs.

    Raises:
        ValueError: a needed field is missing from some rollout (names it, why it is needed and what to do).
    """
    needed = {"old_logprobs": old, "ref_logprobs": ref, "teacher_logprobs": teacher, "rollout_logprobs": rollout}
    for field, (why, instead) in _RESTORED_NEEDS.items():
        if needed[field] and any(getattr(r, field) is None for r in buffer):
            raise ValueError(f"the checkpoint holds an unfinished generation batch without {field}, which {why}: "
                             f"resume from a checkpoint at a generation boundary, or {instead}")
