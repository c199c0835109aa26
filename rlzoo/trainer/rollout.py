"""Rollouts (a generation batch of completions and everything computed from them) and their log-probs.

Notation: ``Np`` unique prompts, ``P`` padded prompt length (left padded), ``N = Np * G`` completions,
``C`` padded completion length (right padded), ``H`` hidden size, ``V`` vocabulary.

The log-probs of a completion are computed from the model body's hidden states at the positions that
predict each completion token, then ``rlzoo.kernels.fused_linear_logprobs`` with the lm_head weight (no
``[N, C, V]`` logits). With ``share_prefix``, each prompt is run once and its KV cache is indexed out to
its ``G`` completions: the same computation as running every (prompt, completion) pair, with the prompt's
forward and backward done once per group.
"""

import dataclasses

import torch
from einops import rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["Rollout", "completion_logprobs", "model_logits", "position_ids_for"]


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
        old_logprobs, ref_logprobs, rollout_logprobs: ``Float[N, C]`` or None.
        texts: decoded completions; questions: the prompt of each completion (for logging).
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
    texts: list[str] = dataclasses.field(default_factory=list)

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
            texts=[self.texts[i] for i in index.tolist()] if self.texts else [],
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


def _hidden_states(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    group_index: Tensor,
    completion_ids: Tensor,
    share_prefix: bool,
) -> Tensor:
    """``[N, C, H]`` final hidden states at the positions that predict each completion token."""
    body = model.base_model
    p = prompt_ids.shape[1]
    full = _full_sequence_inputs(prompt_ids, prompt_mask, group_index, completion_ids)
    if not share_prefix:
        return body(**full, use_cache=False).last_hidden_state[:, p - 1:]
    out = body(input_ids=prompt_ids, attention_mask=prompt_mask.long(), position_ids=position_ids_for(prompt_mask),
               use_cache=True)
    cache = out.past_key_values
    cache.batch_select_indices(group_index)
    last = out.last_hidden_state[:, -1][group_index]
    if completion_ids.shape[1] == 1:
        return last[:, None]
    cont = body(input_ids=full["input_ids"][:, p:], attention_mask=full["attention_mask"],
                position_ids=full["position_ids"][:, p:], past_key_values=cache, use_cache=True)
    return torch.cat([last[:, None], cont.last_hidden_state], dim=1)


def _full_sequence_inputs(prompt_ids: Tensor, prompt_mask: Tensor, group_index: Tensor,
                          completion_ids: Tensor) -> dict[str, Tensor]:
    """Model inputs of every row's prompt + completion (all but its last token), with generate's positions."""
    prompt_pos = position_ids_for(prompt_mask)
    c = completion_ids.shape[1]
    completion_pos = prompt_mask.sum(-1)[group_index, None] + torch.arange(c, device=completion_ids.device)[None, :]
    ids = torch.cat([prompt_ids[group_index], completion_ids[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask[group_index], torch.ones_like(completion_ids[:, :-1], dtype=torch.bool)], dim=1)
    pos = torch.cat([prompt_pos[group_index], completion_pos[:, :-1]], dim=1)
    return {"input_ids": ids, "attention_mask": mask.long(), "position_ids": pos}


def model_logits(
    model: torch.nn.Module,
    prompt_ids: Int[Tensor, "Np P"],
    prompt_mask: Bool[Tensor, "Np P"],
    group_index: Int[Tensor, " N"],
    completion_ids: Int[Tensor, "N C"],
) -> Float[Tensor, "N C V"]:
    """The model's own ``logits`` (its full forward, whatever its head does) at the positions that predict
    each completion token: the path for heads ``rlzoo.kernels.lm_head_spec`` does not know, and the
    independent reference of the tests. Holds ``[N, C, V]`` logits (unnormalised, the model's dtype).

    Args: as :func:`completion_logprobs` (positions follow ``generate``: left-padded prompts count from 0).

    Raises:
        whatever the model's forward raises (e.g. a sequence longer than its maximum positions).

    Source: ``model(input_ids, attention_mask, position_ids).logits`` sliced as TRL 1.16's
    ``_get_per_token_logps_and_entropies`` slices it (the logit at position t predicts token t + 1).
    """
    inputs = _full_sequence_inputs(prompt_ids, prompt_mask, group_index, completion_ids)
    return model(**inputs, use_cache=False, logits_to_keep=completion_ids.shape[1]).logits


def completion_logprobs(
    model: torch.nn.Module,
    *,
    prompt_ids: Int[Tensor, "Np P"],
    prompt_mask: Bool[Tensor, "Np P"],
    group_index: Int[Tensor, " N"],
    completion_ids: Int[Tensor, "N C"],
    completion_mask: Bool[Tensor, "N C"],
    temperature: float = 1.0,
    share_prefix: bool = True,
    fused: bool = True,
    with_entropy: bool = False,
) -> tuple[Float[Tensor, "N C"], Float[Tensor, "N C"] | None]:
    """Per-token log-probs (and entropies) of the completion tokens under ``model``, temperature-scaled.

    Only positions where ``completion_mask`` is True are scored; the others hold 0. Gradients flow to the
    model when grad mode is on.

    Args:
        model: a Hugging Face causal LM (``model.base_model`` gives final hidden states; the lm_head is read
            by ``rlzoo.kernels.lm_head_spec``).
        prompt_ids, prompt_mask: ``[Np, P]`` left-padded unique prompts and their attention mask.
        group_index: ``[N]`` the prompt row (in ``[0, Np)``) of each completion.
        completion_ids, completion_mask: ``[N, C]`` right-padded completion tokens and the counted ones.
        temperature: > 0; logits are divided by it (the sampling distribution's log-probs, as TRL).
        share_prefix: run each prompt once and reuse its KV cache for its completions (exact).
        fused: log-probs through ``fused_linear_logprobs`` (chunked, no [M, V] logits); False: plain logits
            from the final hidden states and the lm_head. A model whose logit transform
            ``rlzoo.kernels.lm_head_spec`` does not know is scored through its own forward
            (:func:`model_logits`, no prefix sharing) either way.
        with_entropy: also return the per-token entropy (nats) of the temperature-scaled distribution.

    Returns:
        ``(logprobs, entropies)``, each ``Float[N, C]`` in nats (entropies None unless asked).

    Source: the per-token log-probs of TRL 1.16's ``GRPOTrainer._get_per_token_logps_and_entropies``
    (logits divided by the temperature, then ``log_softmax`` and gather), computed without the ``[N, C, V]``
    logits.
    """
    from rlzoo.kernels import (
        fused_linear_logprobs,
        lm_head_spec,
        logprobs_and_entropy_from_logits,
        logprobs_from_logits,
    )

    flat_index = rearrange(completion_mask, "n c -> (n c)").nonzero().squeeze(-1)
    targets = rearrange(completion_ids, "n c -> (n c)").index_select(0, flat_index)
    try:
        spec = lm_head_spec(model)
    except NotImplementedError:  # a logit transform rlzoo's kernels do not know: the model's own forward
        spec = None
    if spec is None:
        logits = model_logits(model, prompt_ids, prompt_mask, group_index, completion_ids)
        logits = rearrange(logits, "n c v -> (n c) v").index_select(0, flat_index)
    else:
        hidden = _hidden_states(model, prompt_ids, prompt_mask, group_index, completion_ids, share_prefix)
        h = rearrange(hidden, "n c h -> (n c) h").index_select(0, flat_index)  # counted positions only
        if fused:
            lp, ent = fused_linear_logprobs(h, **spec, token_ids=targets, temperature=temperature,
                                            return_entropy=with_entropy)
        else:
            logits = spec.logits(h)
    if spec is None or not fused:
        if with_entropy:
            lp, ent = logprobs_and_entropy_from_logits(logits, targets, temperature=temperature)
        else:
            lp, ent = logprobs_from_logits(logits, targets, temperature=temperature), None
    shape = completion_ids.shape

    def scatter(x: Tensor) -> Tensor:
        full = torch.zeros(shape[0] * shape[1], dtype=torch.float32 if x.dtype != torch.float64 else x.dtype,
                           device=x.device)
        return full.index_copy(0, flat_index, x.to(full.dtype)).view(shape)

    return scatter(lp), (scatter(ent) if ent is not None else None)

