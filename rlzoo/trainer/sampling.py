"""Per-group seeded sampling for Hugging Face ``generate`` (each prompt group its own random stream), which can
record the sampler's log-probs of the tokens it picks."""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["GroupSeededSampling"]


class GroupSeededSampling:
    """Sampling with one random stream per prompt group: a Hugging Face ``logits_processor`` that makes greedy
    decoding sample.

    At each step the logits are warped as ``generate`` warps them for sampling (temperature, then top-k, then
    top-p, with transformers' own warpers), and Gumbel noise ``-log(-log(U))``, ``U`` uniform from the group's
    own ``torch.Generator``, is added: the argmax of logits plus Gumbel noise is a sample from the softmax of the
    logits (the Gumbel-max trick; Gumbel 1954, as used by Kool et al. 2019, arXiv:1903.06059). Each group draws
    ``[G, V]`` uniforms per step from its own stream, so a group's completions depend only on its seed, not on
    which other prompts share the batch, the rank or the batch size.

    With ``record_logprobs`` it also keeps, per step, the log-probability of the token it picks under the warped
    distribution (the sampler's log-prob, as vLLM's ``logprobs_mode="processed_logprobs"`` reports it):
    :meth:`sampled_logprobs` returns them.

    Args:
        seeds: one seed per prompt group, in batch order.
        group_size: completions per prompt (``G`` consecutive rows per seed).
        temperature: > 0; top_k: 0 = off; top_p: in (0, 1].
        record_logprobs: keep the sampled tokens' log-probs (one ``[N]`` float32 vector per step).
    """

    def __init__(self, seeds: list[int], group_size: int, *, temperature: float, top_k: int, top_p: float,
                 record_logprobs: bool = False) -> None:
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.seeds = list(seeds)
        self.group_size = group_size
        warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
        warpers += [TopKLogitsWarper(top_k)] if top_k > 0 else []
        warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
        self.warpers = LogitsProcessorList(warpers)
        self._generators: list[torch.Generator] | None = None
        self.record_logprobs = record_logprobs
        self._tokens: list[Tensor] = []
        self._logprobs: list[Tensor] = []

    def __call__(self, input_ids: Int[Tensor, "N L"], scores: Float[Tensor, "N V"]) -> Float[Tensor, "N V"]:
        """Warped ``scores`` plus this step's Gumbel noise (rows = groups x ``group_size``, in seed order)."""
        if self._generators is None:
            self._generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        scores = self.warpers(input_ids, scores.float())
        shape = (self.group_size, scores.shape[-1])
        uniform = torch.cat([torch.rand(shape, generator=g, device=scores.device) for g in self._generators])
        tiny = torch.finfo(uniform.dtype).tiny
        noisy = scores - torch.log(-torch.log(uniform.clamp(min=tiny, max=1.0 - 1e-7)))
        if self.record_logprobs:
            token = noisy.argmax(dim=-1, keepdim=True)  # what generate's greedy step picks from these scores
            self._tokens.append(token.squeeze(-1))
            self._logprobs.append(scores.log_softmax(dim=-1).gather(-1, token).squeeze(-1))
        return noisy

    def sampled_logprobs(self, completion_ids: Int[Tensor, "N C"],
                         completion_mask: Bool[Tensor, "N C"]) -> Float[Tensor, "N C"]:
        """The recorded log-probs of ``completion_ids`` under the warped sampling distribution, 0 where the mask is
        False.

        Raises:
            RuntimeError: nothing was recorded, or the recorded picks differ from ``completion_ids`` at a counted
                position (a logits processor that ``generate`` ran after this one changed the choice).
        """
        if not self._tokens:
            raise RuntimeError("GroupSeededSampling recorded no log-probs: build it with record_logprobs=True")
        tokens, logprobs = torch.stack(self._tokens, dim=1), torch.stack(self._logprobs, dim=1)
        c = completion_ids.shape[1]
        if tokens.shape != completion_ids.shape or bool((tokens[:, :c] != completion_ids)[completion_mask].any()):
            raise RuntimeError("the sampled tokens differ from the tokens rlzoo's sampler picked: a logits processor "
                               "ran after it (check the model's generation_config); sampler log-probs would be wrong")
        return torch.where(completion_mask, logprobs, torch.zeros_like(logprobs))
