"""Generation backends: Hugging Face ``generate`` (default, CPU/GPU) and vLLM (GPU, optional extra).

Both turn prompt strings into :class:`Generated`: left-padded prompts once per unique prompt, right-padded
completions with a mask that counts every token up to and including the first EOS, and a truncation flag
for completions that hit ``max_completion_length`` without EOS.
"""

import dataclasses
import logging
import os
import shutil
import tempfile
import weakref
from typing import Any, Protocol

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.trainer.adapters import causal_lm
from rlzoo.trainer.config import RolloutConfig
from rlzoo.trainer.distributed import RANK_LOCAL
from rlzoo.trainer.models import kv_cache_keyword, kv_cache_of
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.rollout import position_ids_for
from rlzoo.trainer.sampling import GroupSeededSampling

__all__ = [
    "Generated",
    "Generator",
    "HFGenerator",
    "VLLMGenerator",
    "build_generator",
    "completion_mask_from_eos",
]

log = logging.getLogger("rlzoo.train")
_WARNED_LENGTH: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
"""Models whose prompt-length warning was given: a run's sampling and evaluation generators share one model, and
the warning is given once for both."""


@dataclasses.dataclass(kw_only=True)
class Generated:
    """Completions of a batch of prompts.

    Attributes:
        prompt_ids: ``Int[Np, P]`` left-padded, one row per unique prompt.
        prompt_mask: ``Bool[Np, P]``.
        group_index: ``Int[N]`` prompt row of each completion (``G`` consecutive completions per prompt).
        completion_ids: ``Int[N, C]`` right-padded.
        completion_mask: ``Bool[N, C]`` up to and including the first EOS (all generated tokens if none).
        is_truncated: ``Bool[N]`` no EOS among the generated tokens.
        texts: decoded completions (special tokens skipped).
        rollout_logprobs: ``Float[N, C]`` the sampler's log-probs of its tokens (vLLM; Hugging Face ``generate``
            when asked), 0 at masked positions, else None.
    """

    prompt_ids: Int[Tensor, "Np P"]
    prompt_mask: Bool[Tensor, "Np P"]
    group_index: Int[Tensor, " N"]
    completion_ids: Int[Tensor, "N C"]
    completion_mask: Bool[Tensor, "N C"]
    is_truncated: Bool[Tensor, " N"]
    texts: list[str]
    rollout_logprobs: Float[Tensor, "N C"] | None = None


class Generator(Protocol):
    """What the trainer needs from a generation backend."""

    rollout_logprobs: bool
    """Whether :meth:`generate` returns the sampler's log-probs (``Generated.rollout_logprobs``)."""

    def generate(self, model: torch.nn.Module, prompts: list[str], num_generations: int, *,
                 greedy: bool = False, seeds: list[int] | None = None) -> Generated:
        """Sample ``num_generations`` completions per prompt (greedy: one argmax completion each), each prompt's
        from its own seed when ``seeds`` is given."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the sampler's weights the model's (after an optimizer step)."""
        ...


def completion_mask_from_eos(
    completion_ids: Int[Tensor, "N C"], eos_token_ids: list[int]
) -> tuple[Bool[Tensor, "N C"], Bool[Tensor, " N"]]:
    """Mask every token up to and including the first EOS; flag rows without EOS as truncated.

    Returns:
        ``(completion_mask, is_truncated)``.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))
    has_eos = is_eos.any(dim=1)
    c = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, c, dtype=torch.long))
    positions = torch.arange(c, device=completion_ids.device)[None, :]
    return positions <= first[:, None], ~has_eos


def _eos_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model's generation_config and the tokenizer define no EOS token")
    return ids


class HFGenerator:
    """Batched sampling with Hugging Face ``generate`` (left padding, KV cache).

    With ``share_prefix`` each unique prompt is prefilled once and its KV cache is copied to its
    ``num_generations`` rows, so ``generate`` only runs the last prompt token per row before decoding (the
    same tokens as prefilling every row; the prefill cost drops by the group size).

    Args:
        tokenizer: the model's tokenizer (its chat template was already applied to the prompts).
        max_completion_length: maximum new tokens.
        temperature, top_p, top_k: sampling parameters (top_k 0 = off); ignored for greedy decoding.
        max_prompt_length: keep only the last this-many prompt tokens (None: no limit).
        share_prefix: prefill each unique prompt once.
        rollout_logprobs: return the sampler's log-probs of its tokens (``Generated.rollout_logprobs``) when
            sampling: the log-softmax of the logits after temperature, top-k and top-p, in float32, as vLLM's
            ``processed_logprobs``. They differ from the trainer's log-probs by the top-k / top-p truncation and by
            numerics (the KV-cache forward under autocast), which is what rollout correction corrects.
    """

    def __init__(self, tokenizer, *, max_completion_length: int, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, max_prompt_length: int | None = None, share_prefix: bool = True,
                 rollout_logprobs: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_prompt_length = max_prompt_length
        self.share_prefix = share_prefix
        self.rollout_logprobs = rollout_logprobs

    def encode_prompts(self, prompts: list[str], device: torch.device | str) -> tuple[Tensor, Tensor]:
        """Left-padded ``(ids [Np, P], mask [Np, P])``; no special tokens added (the template has them, as TRL)."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                             add_special_tokens=False)
        ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        if self.max_prompt_length is not None and ids.shape[1] > self.max_prompt_length:
            ids, mask = ids[:, -self.max_prompt_length:], mask[:, -self.max_prompt_length:]
        return ids.to(device), mask.to(device)

    def _check_length(self, model: torch.nn.Module, prompt_length: int) -> None:
        """Warn once per model when ``prompt_length`` + ``max_completion_length`` exceeds its positions
        (``max_position_embeddings``): the model then runs past what it was trained on, silently."""
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if model in _WARNED_LENGTH or not isinstance(limit, int) or prompt_length + self.max_completion_length <= limit:
            return
        _WARNED_LENGTH.add(model)
        log.warning("a prompt of %d tokens + max_completion_length %d exceeds the model's %d positions "
                    "(max_position_embeddings): set --max-prompt-length (prompts are cut from the left) or shorten "
                    "the prompts", prompt_length, self.max_completion_length, limit, extra=RANK_LOCAL)

    @torch.no_grad()
    def generate(self, model: torch.nn.Module, prompts: list[str], num_generations: int, *,
                 greedy: bool = False, seeds: list[int] | None = None) -> Generated:
        """See :class:`Generator`; with ``seeds`` (one per prompt), each prompt's completions are sampled from its
        own random stream (:class:`GroupSeededSampling`) instead of the global RNG. With ``rollout_logprobs`` and
        no ``seeds``, the seeds are drawn from the global RNG (the sampler records its log-probs)."""
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(model.parameters()).device
        prompt_ids, prompt_mask = self.encode_prompts(prompts, device)
        self._check_length(model, prompt_ids.shape[1])
        g = 1 if greedy else num_generations
        group_index = torch.arange(len(prompts), device=device).repeat_interleave(g)
        eos = _eos_ids(model, self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        if self.rollout_logprobs and seeds is None and not greedy:
            seeds = torch.randint(0, 2**62, (len(prompts),)).tolist()
        seeded = seeds is not None and not greedy
        sample = not greedy and not seeded  # seeded sampling is greedy decoding of Gumbel-perturbed logits
        config = GenerationConfig(
            max_new_tokens=self.max_completion_length,
            do_sample=sample,
            temperature=self.temperature if sample else None,
            top_p=self.top_p if sample else None,
            top_k=None if not sample or self.top_k == 0 else self.top_k,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        if seeded:
            if len(seeds) != len(prompts):
                raise ValueError(f"seeds: {len(seeds)} seeds for {len(prompts)} prompts; give one per prompt")
            processor = GroupSeededSampling(seeds, g, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                            record_logprobs=self.rollout_logprobs)
            kwargs_processor = {"logits_processor": LogitsProcessorList([processor])}
        else:
            processor, kwargs_processor = None, {}
        ids = prompt_ids[group_index]
        mask = prompt_mask[group_index]
        kwargs = {}
        if self.share_prefix and g > 1 and prompt_ids.shape[1] > 1:
            prefix = causal_lm(model).base_model(
                input_ids=prompt_ids[:, :-1],
                attention_mask=prompt_mask[:, :-1].long(),
                position_ids=position_ids_for(prompt_mask[:, :-1]),
                use_cache=True,
            )
            cache = kv_cache_of(prefix)
            cache.batch_select_indices(group_index)
            kwargs[kv_cache_keyword(causal_lm(model))] = cache
        out = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config, **kwargs,
                             **kwargs_processor)
        completion_ids = out[:, prompt_ids.shape[1]:]
        if completion_ids.shape[1] == 0:  # max_new_tokens reached immediately (cannot happen for >= 1)
            raise RuntimeError("generate returned no new tokens")
        completion_mask, truncated = completion_mask_from_eos(completion_ids, eos)
        texts = self.tokenizer.batch_decode(
            torch.where(completion_mask, completion_ids, pad), skip_special_tokens=True
        )
        sampled = processor.sampled_logprobs(completion_ids, completion_mask) if processor and self.rollout_logprobs \
            else None
        return Generated(prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
                         completion_ids=completion_ids, completion_mask=completion_mask, is_truncated=truncated,
                         texts=texts, rollout_logprobs=sampled)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: ``generate`` samples from the training model itself."""


class VLLMGenerator:
    """Colocated vLLM engine (GPU only; ``pip install rlzoo[vllm]``).

    The engine loads a snapshot of the training model; after each optimizer step :meth:`sync_weights` copies
    the current weights into it. Its per-token log-probs of the sampled tokens are returned as
    ``rollout_logprobs`` so the loss can correct the sampler/trainer mismatch (``is_correction``).

    Not exercised by rlzoo's CI or the sessions that built it (no GPU was available): treat it as a
    starting point and check it on your hardware; the Hugging Face backend is the tested path.

    Raises:
        ImportError: vLLM is not installed (says what to install). ValueError: no CUDA device is present.
    """

    rollout_logprobs = True  # vLLM always reports the sampled tokens' log-probs

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_completion_length: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 max_prompt_length: int | None = None, dtype: torch.dtype | None = None) -> None:
        try:
            import vllm
        except ImportError as err:
            if isinstance(err, ModuleNotFoundError) and err.name == "vllm":
                raise ImportError("--backend vllm needs vllm: pip install 'rlzoo[vllm]' (GPU only), or --backend hf") \
                    from None
            # installed, broken (a CUDA / torch mismatch: an undefined symbol, a dependency missing)
            raise ImportError(f"--backend vllm: vllm is installed but does not import: {err}") from err
        if not torch.cuda.is_available():
            raise ValueError("--backend vllm needs a CUDA device; use --backend hf on CPU")
        from rlzoo.trainer.io import save_pretrained_atomic

        self.tokenizer = tokenizer
        # The prompts are tokenised exactly as the HF path does (left padding, truncation to max_prompt_length,
        # no special tokens added) and given to vLLM as token ids, so sampler and trainer see the same context.
        self.encoder = HFGenerator(tokenizer, max_completion_length=1, max_prompt_length=max_prompt_length)
        snapshot = tempfile.mkdtemp(prefix="rlzoo-vllm-")
        try:
            save_pretrained_atomic(model, tokenizer, os.path.join(snapshot, "model"))
            self.llm = vllm.LLM(
                model=os.path.join(snapshot, "model"),
                gpu_memory_utilization=gpu_memory_utilization,
                dtype=str(dtype or next(model.parameters()).dtype).removeprefix("torch."),
                seed=seed,
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",  # after temperature / top-k / top-p, as the HF path and TRL
            )
        finally:  # the engine holds the weights in memory once built
            shutil.rmtree(snapshot, ignore_errors=True)
        self.max_completion_length = max_completion_length
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def generate(self, model: torch.nn.Module, prompts: list[str], num_generations: int, *,
                 greedy: bool = False, seeds: list[int] | None = None) -> Generated:
        """See :class:`Generator`; also returns ``rollout_logprobs``. ``seeds`` become vLLM's per-request seeds."""
        import vllm

        g = 1 if greedy else num_generations
        params = [vllm.SamplingParams(
            n=g,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=-1 if greedy or self.top_k == 0 else self.top_k,
            max_tokens=self.max_completion_length,
            logprobs=0,
            seed=None if seeds is None or greedy else seeds[i],
        ) for i in range(len(prompts))]
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = self.encoder.encode_prompts(prompts, device)
        requests = [{"prompt_token_ids": ids[mask].tolist()} for ids, mask in zip(prompt_ids, prompt_mask, strict=True)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        eos = _eos_ids(model, self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        seqs, logps = [], []
        for request in outputs:
            for completion in request.outputs:
                seqs.append(list(completion.token_ids))
                logps.append([next(iter(d.values())).logprob for d in (completion.logprobs or [])])
        c = max(1, max(len(s) for s in seqs))
        completion_ids = torch.full((len(seqs), c), pad, dtype=torch.long)
        rollout = torch.zeros((len(seqs), c), dtype=torch.float32)
        for i, (s, lp) in enumerate(zip(seqs, logps, strict=True)):
            completion_ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            rollout[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
        completion_ids = completion_ids.to(device)
        completion_mask, truncated = completion_mask_from_eos(completion_ids, eos)
        lengths = torch.tensor([len(s) for s in seqs], device=device)
        completion_mask &= torch.arange(c, device=device)[None, :] < lengths[:, None]
        group_index = torch.arange(len(prompts), device=device).repeat_interleave(g)
        texts = self.tokenizer.batch_decode(torch.where(completion_mask, completion_ids, pad),
                                            skip_special_tokens=True)
        return Generated(prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
                         completion_ids=completion_ids, completion_mask=completion_mask, is_truncated=truncated,
                         texts=texts, rollout_logprobs=rollout.to(device))

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the training model's current weights into the engine (vLLM's ``load_weights``)."""
        weights = list(model.state_dict().items())

        def load(worker_model: torch.nn.Module) -> None:
            worker_model.load_weights(weights)

        self.llm.apply_model(load)
        self.llm.reset_prefix_cache()


def build_generator(config: RolloutConfig, model: torch.nn.Module, tokenizer: Any, *, share_prefix: bool,
                    seed: int, precision: Precision, rollout_logprobs: bool = False) -> HFGenerator | VLLMGenerator:
    """The sampling backend of the rollout section (``hf``: Hugging Face ``generate``; ``vllm``: a colocated
    vLLM engine, which always returns the sampler's log-probs; ``rollout_logprobs``: the Hugging Face backend
    records them too).

    Raises:
        ImportError, ValueError: the vLLM backend without vLLM or CUDA.
    """
    if config.backend == "vllm":
        return VLLMGenerator(
            model, tokenizer, max_completion_length=config.max_completion_length, temperature=config.temperature,
            top_p=config.top_p, top_k=config.top_k, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            seed=seed, max_prompt_length=config.max_prompt_length, dtype=precision.inference_dtype,
        )
    return HFGenerator(
        tokenizer, max_completion_length=config.max_completion_length, temperature=config.temperature,
        top_p=config.top_p, top_k=config.top_k, max_prompt_length=config.max_prompt_length,
        share_prefix=share_prefix, rollout_logprobs=rollout_logprobs,
    )
