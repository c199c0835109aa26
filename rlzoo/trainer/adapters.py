"""The policy and its reference, with or without a PEFT adapter (LoRA): building them, checkpointing the adapter,
merging it into a plain model.

With LoRA (``--peft.r 16 ...`` or ``Trainer(config, peft_config=LoraConfig(...))``), ``peft.get_peft_model`` wraps
the model: its weights are frozen and only the adapter's train. The reference policy is the same model with its
adapter disabled (``PeftModel.disable_adapter()``), so ``beta > 0`` costs no second copy of the model, as in TRL
1.16 (``GRPOTrainer``: "If PEFT is used, the reference model is not needed since the adapter can be disabled").
A checkpoint's ``model/`` then holds the adapter (``adapter_model.safetensors``, ``adapter_config.json`` naming the
base model) and the tokenizer; :func:`rlzoo.trainer.models.load_model` loads such a directory onto its base, and
:func:`export_model` writes it merged into a plain Hugging Face checkpoint.
"""

import contextlib
import dataclasses
import math
import re
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rlzoo.trainer.config import AdapterConfig, ModelConfig
from rlzoo.trainer.io import save_pretrained_atomic

__all__ = ["AdapterDisabled", "adapter_save_options", "build_policy", "built_adapter", "causal_lm",
           "checkpoint_state_dict", "export_model", "is_peft_model", "load_checkpoint_weights", "lora_config",
           "peft_options", "recorded_peft", "scoring_model"]


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (False when peft is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def causal_lm(model: Any) -> Any:
    """The Hugging Face ``*ForCausalLM`` under a PEFT wrapper (its adapter layers are in place, so calling it
    applies the adapter), or ``model`` itself. The scorer and the sampler take the body and the head from it."""
    return model.get_base_model() if is_peft_model(model) else model


def lora_config(options: Mapping[str, Any]) -> Any:
    """A ``peft.LoraConfig`` (task ``CAUSAL_LM``) from the ``--peft.NAME VALUE`` options.

    Each value is checked against the type ``LoraConfig`` declares for its field (:func:`_fits`: every item of a
    list, an int accepted for a float, a bool never for a number), so a typo fails here, before the model loads,
    instead of deep inside peft or, worse, silently (``--peft.use_dora yes`` would otherwise be stored and read
    as true).

    Raises:
        ImportError: peft is not installed (names the extra to install).
        ValueError: an option that is not a field of ``LoraConfig`` (lists the fields), a value of the wrong type
            (names the option, the type it takes and the value), or peft's own check (as one line naming --peft).
    """
    import typing

    try:
        from peft import LoraConfig
    except ImportError as err:
        raise ImportError("--peft needs peft: pip install 'rlzoo[train]' (or pip install peft)") from err
    if options.get("peft_type") not in (None, "LORA"):  # recorded for a peft_config object of another method
        raise ValueError(f"peft: the run's adapter is a {options['peft_type']} adapter (a peft_config object), which "
                         "--peft options cannot rebuild: resume from Python with the same object "
                         "(Trainer(resume_config(RUN), peft_config=...))")
    fields = sorted(f.name for f in dataclasses.fields(LoraConfig) if f.init)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"unknown --peft option(s) {unknown}; the fields of peft.LoraConfig: {', '.join(fields)}")
    hints = typing.get_type_hints(LoraConfig)
    hints["lora_alpha"] = float  # declared int, used only as the scale lora_alpha / r: 16.0 and 0.5 work in peft
    for name, value in options.items():
        hint = hints.get(name, Any)
        if not (_fits(value, hint) or _is_pattern_choice(value, hint)):
            raise ValueError(f"--peft.{name} takes {_type_name(hint)}, got {value!r}")
    if options.get("r", 1) <= 0:
        raise ValueError(f"--peft.r must be a positive integer (the adapter's rank), got {options['r']}")
    alpha = options.get("lora_alpha", 1)
    if not (math.isfinite(alpha) and alpha > 0):  # 0 scales the adapter away: training would change nothing
        raise ValueError(f"--peft.lora_alpha must be a finite number > 0 (the adapter's scale is lora_alpha / r), "
                         f"got {alpha}")
    options = {k: _module_names(v) if k in ("target_modules", "exclude_modules") else v for k, v in options.items()}
    try:
        return LoraConfig(**{"task_type": "CAUSAL_LM", **options})
    except (TypeError, ValueError) as err:  # peft's own checks of option combinations
        raise ValueError(f"--peft: peft.LoraConfig refused {dict(options)}: {err}".splitlines()[0]) from err


def peft_options(peft_config: Any, *, defaults: bool = False) -> dict[str, Any]:
    """The options of a PEFT config object (``Trainer(config, peft_config=LoraConfig(...))``) as ``--peft``
    options: its fields that differ from the class's defaults, as JSON values (a set as a sorted list; a value
    JSON cannot hold as its ``repr``), without ``task_type="CAUSAL_LM"`` (what :func:`lora_config` adds) and with
    ``peft_type`` for another method than LoRA. What ``config.json`` records for the run, so that a resume compares
    the adapter's options (``peft.lora_alpha 8 -> 64`` is refused) and rebuilds a LoRA adapter from them.

    Args:
        defaults: every field, those at their default too (:func:`built_adapter` compares two adapters so)."""
    import enum

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return plain(value.value)
        if isinstance(value, (set, frozenset)):
            return sorted((plain(v) for v in value), key=repr)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return plain(dataclasses.asdict(value))
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    out: dict[str, Any] = {}
    for field in dataclasses.fields(peft_config):
        if not field.init or field.name in ("base_model_name_or_path", "revision", "inference_mode", "peft_type",
                                            "peft_version"):  # where it is saved, and peft's own bookkeeping
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        value = plain(getattr(peft_config, field.name))
        if defaults or default is dataclasses.MISSING or value != plain(default):
            out[field.name] = value
    if out.get("task_type") == "CAUSAL_LM":
        del out["task_type"]
    peft_type = plain(getattr(peft_config, "peft_type", None))
    if peft_type not in (None, "LORA"):
        out["peft_type"] = peft_type
    return out


def built_adapter(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The adapter that ``--peft`` options (as recorded) build, for comparing two runs' options: every field of the
    ``peft.LoraConfig`` of :func:`lora_config`, defaults filled in and ``target_modules`` as a sorted list (peft
    holds it as a set). ``{"lora_dropout": 0.0}`` and ``{}`` build the same adapter, so do
    ``["v_proj", "q_proj"]`` and ``["q_proj", "v_proj"]``. Options that build no LoRA config (another method's,
    or options :func:`lora_config` refuses) are returned as they are, name lists sorted."""
    try:
        return peft_options(lora_config(options), defaults=True)
    except (ImportError, ValueError, TypeError):
        return _sorted_names(options)


def _sorted_names(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``target_modules`` and ``exclude_modules`` lists (name sets to peft) in sorted order."""
    return {k: sorted(v, key=repr) if k in ("target_modules", "exclude_modules") and isinstance(v, (list, tuple))
            else v for k, v in options.items()}


def recorded_peft(peft: Mapping[str, Any] | None, peft_config: Any, *, resuming: bool) -> Mapping[str, Any] | None:
    """What a run records as its ``peft`` setting: ``peft`` (the ``--peft`` options, a ``target_modules`` list in
    sorted order, as peft's set of names), or with a PEFT config object its :func:`peft_options` (a resume then
    compares them with the checkpoint's, as :func:`built_adapter`).

    Raises:
        ValueError: a fresh run given both ``peft_config`` and other ``--peft`` options (on a resume ``peft``
            holds the checkpoint's options, and the object given now is the change the resume judges).
    """
    if peft_config is None:
        return None if peft is None else _sorted_names(peft)
    options = peft_options(peft_config)
    if peft is not None and built_adapter(peft) != built_adapter(options) and not resuming:
        raise ValueError("give the adapter either as peft_config or as --peft options, not both")
    return options


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (parsed from a flag or a config file: None, bool, int, float, str, list, dict) has type
    ``hint``, checking every item of a container. A bool is no int or float (Python's subclassing aside: never a
    rank or a scale to a user); an int is a float. A class hint other than these takes an instance of it."""
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin is typing.Literal:
        return any(type(value) is type(choice) and value == choice for choice in args)  # True is no 1 here
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if origin in (list, tuple):  # a JSON or YAML list stands for a tuple too
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(args) == len(value) and all(map(_fits, value, args))
        return not args or all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(_fits(k, args[0]) and _fits(v, args[1])
                                                            for k, v in value.items()))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    try:
        return isinstance(value, origin or hint)
    except TypeError:  # a hint isinstance cannot take (a NewType, a TypeVar...): peft checks the value itself
        return True


def _module_names(value: Any) -> Any:
    """``--peft.target_modules q_proj`` or ``q_proj,v_proj`` as the list of names it means. peft takes a string as
    a regular expression that must match a module's whole name (``model.layers.0.self_attn.q_proj``), which a bare
    name never does ("Target modules q_proj not found"); a string of names, dots and commas only is split into a
    list (peft matches each as the name's last components). ``all-linear`` and real patterns (``.*q_proj``) stay."""
    if isinstance(value, str) and value != "all-linear" and re.fullmatch(r"[\w.-]+(\s*,\s*[\w.-]+)*", value):
        return [name.strip() for name in value.split(",")]
    return value


def _is_pattern_choice(value: Any, hint: Any) -> bool:
    """Whether ``value`` fills a placeholder choice of a ``Literal`` in ``hint`` (peft's init_lora_weights offers
    ``'pissa_niter_[number of iters]'``: "pissa_niter_16" is valid); peft checks the rest of the string."""
    import typing

    literals = [hint] if typing.get_origin(hint) is typing.Literal else [
        arg for arg in typing.get_args(hint) if typing.get_origin(arg) is typing.Literal]
    prefixes = [str(c).split("[")[0] for lit in literals for c in typing.get_args(lit) if "[" in str(c)]
    return isinstance(value, str) and any(value.startswith(p) for p in prefixes)


def _type_name(hint: Any) -> str:
    """``int`` -> "int"; ``Literal['none', 'all']`` -> "one of 'none', 'all'"; unions sorted and joined with " or "
    (typing caches unions, so their order of arguments is not the declared one)."""
    import typing

    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(sorted(_type_name(arg) for arg in typing.get_args(hint) if arg is not type(None)))
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


@dataclasses.dataclass(frozen=True)
class AdapterDisabled:
    """The reference policy of an adapter run: the policy with its adapter disabled (no second copy).

    Attributes:
        policy: the ``PeftModel`` being trained.
        module: what the policy is scored through (its :class:`~rlzoo.trainer.scorer.LogProbModule`, possibly
            wrapped by DDP / FSDP2), or None for the ``PeftModel`` itself.
    """

    policy: Any
    module: Any = None

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """What to score with, the adapter disabled for the duration of the block (``PeftModel.disable_adapter``)."""
        with self.policy.disable_adapter():
            yield self.policy if self.module is None else self.module


@contextlib.contextmanager
def scoring_model(model: Any) -> Iterator[Any]:
    """The module to score with: an :class:`AdapterDisabled` reference's base model while the block runs, or
    ``model`` itself."""
    if isinstance(model, AdapterDisabled):
        with model.active() as base:
            yield base
    else:
        yield model


def build_policy(model_config: ModelConfig, adapter_config: AdapterConfig, *, dtype: torch.dtype,
                 device: torch.device, needs_reference: bool, model: Any = None, tokenizer: Any = None,
                 peft_config: Any = None) -> tuple[Any, Any, Any]:
    """The run's ``(policy, tokenizer, reference or None)``.

    The policy is ``model`` (the Python API's model object, with ``tokenizer``) or ``load_model(model_config.model)``,
    wrapped with ``peft_config`` or the ``--peft`` options when given (a model that is already a ``PeftModel``, or
    a loaded adapter directory, trains its own adapter). It is in eval mode (dropout off: the ratio is exactly 1
    on the first iteration). The reference, when ``needs_reference``: :class:`AdapterDisabled` for an adapter
    model, else a frozen copy of the policy.

    Raises:
        ValueError: a model object without a tokenizer, both ``peft_config`` and other ``--peft`` options than its
            own (:func:`peft_options`), a ``lora_dropout``
            above 0 (:func:`_check_no_dropout`; checked before the model loads), an adapter on the output layer
            (the fused log-probs read the head's weight directly, so it would not train: TRL refuses it too), or on
            an input embedding tied to the output layer (:func:`_check_no_tied_embedding_adapter`); and
            the errors of :func:`rlzoo.trainer.models.load_model` and :func:`lora_config`.
    """
    import copy

    from rlzoo.trainer.models import load_model

    if peft_config is not None and adapter_config.peft not in (None, peft_options(peft_config)):
        raise ValueError("give the adapter either as peft_config or as --peft options, not both")
    given_as_object = peft_config is not None
    if peft_config is None and adapter_config.peft is not None:
        peft_config = lora_config(adapter_config.peft)
    if peft_config is not None:  # bad adapter options fail before a model loads
        _check_no_dropout(peft_config, given_as="--peft.lora_dropout" if adapter_config.peft is not None
                          and not given_as_object else "peft_config.lora_dropout")
    by_name = model is None
    if by_name:
        model, tokenizer = load_model(model_config.model, dtype=dtype, device=device, trainable=True)
    else:
        if tokenizer is None:
            raise ValueError("Trainer(model=...) needs its tokenizer too: Trainer(config, model=..., tokenizer=...)")
        model.to(device=device, dtype=dtype)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    if peft_config is not None:
        from peft import get_peft_model

        if is_peft_model(model):
            raise ValueError("the model already carries a PEFT adapter; drop peft_config / --peft to train it")
        model = get_peft_model(model, copy.copy(peft_config))
        # the saved adapter names its base as the run records it: a built-in name, path or hub id, or for a model
        # object without one the ``model:CLASS`` name that load_model refuses saying what to pass
        model.peft_config["default"].base_model_name_or_path = model_config.model
    if is_peft_model(model):
        from peft.tuners.tuners_utils import BaseTunerLayer

        if isinstance(model.get_output_embeddings(), BaseTunerLayer):
            raise ValueError("an adapter on the output layer (lm_head) would not train: the log-probs read "
                             "lm_head.weight directly; remove it from --peft.target_modules")
        _check_no_tied_embedding_adapter(model, option="peft_config.target_modules" if given_as_object
                                         else "--peft.target_modules")
    model.eval()
    if not needs_reference:
        return model, tokenizer, None
    reference = AdapterDisabled(model) if is_peft_model(model) else copy.deepcopy(model).requires_grad_(False)
    return model, tokenizer, reference


def _check_no_tied_embedding_adapter(model: Any, *, option: str) -> None:
    """Refuse an adapter layer on an input embedding that the model ties to its output layer (SmolLM2, Qwen2.5
    0.5B, tiny-random): training reads the shared base weight in lm_head untouched, but merging writes the
    embedding's delta into that shared weight, so the exported model's lm_head changes too (a user trial: logits
    off by 19). ``modules_to_save`` trains a copy of the embedding instead, which exports as it trained.

    Raises:
        ValueError: names the embedding, ``option`` and the alternatives.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not (isinstance(embedding, BaseTunerLayer) and head is not None
            and getattr(embedding.get_base_layer(), "weight", None) is getattr(head, "weight", False)):
        return
    name = next((n for n, m in causal_lm(model).named_modules() if m is embedding), "embed_tokens").rsplit(".")[-1]
    raise ValueError(f"an adapter on the input embedding ({name}) of a model that ties it to its output layer "
                     f"(lm_head) would export another model than it trains: training leaves the shared weight "
                     f"untouched in lm_head, merging writes the adapter into it (lm_head changes too); remove {name} "
                     f"from {option}, or train the embedding whole with "
                     f"modules_to_save=['{name}'] (--peft.modules_to_save [{name}])")


def _check_no_dropout(peft_config: Any, *, given_as: str) -> None:
    """Refuse an adapter with dropout: the policy runs in eval mode, so dropout would do nothing while it is asked
    for (and in train mode it would make the first iteration's ratio differ from 1).

    Raises:
        ValueError: ``peft_config.lora_dropout > 0`` (names ``given_as``, why, and the value to use).
    """
    dropout = getattr(peft_config, "lora_dropout", 0.0) or 0.0
    if dropout > 0:
        raise ValueError(f"{given_as} must be 0, got {dropout:g}: rlzoo trains with dropout off, as in its full-model "
                         "runs (dropout would make the ratio differ from 1 at the first iteration); drop the option")


def adapter_save_options(model: Any) -> dict[str, Any]:
    """Keyword arguments for a PEFT model's ``save_pretrained`` / ``get_peft_model_state_dict`` (none for another
    model): ``save_embedding_layers`` is whether the input embedding carries an adapter. peft's default ``"auto"``
    otherwise looks the base model up on the hub on every save, to see whether the vocabulary was resized (a
    network request, or a warning per checkpoint); rlzoo never resizes it."""
    if not is_peft_model(model):
        return {}
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {"save_embedding_layers": isinstance(model.get_input_embeddings(), BaseTunerLayer)}


def checkpoint_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint's ``model/`` holds, keyed as it is saved: the adapter's tensors
    (``peft.get_peft_model_state_dict``) for a PEFT model, else ``model.state_dict()``."""
    if is_peft_model(model):
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model, **adapter_save_options(model)))
    return dict(model.state_dict())


def load_checkpoint_weights(model: Any, weights: Mapping[str, torch.Tensor]) -> None:
    """Load a checkpoint's ``model/`` tensors (keyed as :func:`checkpoint_state_dict`) into ``model``: the adapter
    (``peft.set_peft_model_state_dict``) or the whole model (tied copies may be absent)."""
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, dict(weights))
    else:
        model.load_state_dict(dict(weights), strict=False)


def export_model(source: str | Path, output: str | Path, *, model: Any = None, tokenizer: Any = None,
                 dtype: torch.dtype | None = None, overwrite: bool = False) -> Path:
    """Write the model of ``source`` (a checkpoint's ``model/``, a run's checkpoint directory, or anything
    :func:`~rlzoo.trainer.models.load_model` loads) to ``output`` as a plain Hugging Face checkpoint, an adapter
    merged into its base (``PeftModel.merge_and_unload``). Atomic.

    Args:
        model: the base model object of an adapter ``source`` trained on a model given from Python
            (``Trainer(config, model=obj)`` with ``peft``), whose ``adapter_config.json`` names it as
            ``model:CLASS``, which cannot be loaded by name. The adapter is merged into a copy: ``model`` is left
            unchanged. It must be the base as it was before training (not a ``PeftModel``, no LoRA layers: the
            object a Trainer trained with ``peft`` carries its adapter, changed in place).
        tokenizer: with ``model``, the tokenizer written when ``source`` holds none (rlzoo's checkpoints do).
        overwrite: replace an ``output`` directory that is not empty (everything in it is deleted); default:
            refuse. Refused either way: a run directory or a directory holding one, anything inside a run's own
            files (``RUN/checkpoints/...``, ``RUN/abandoned/...``: a run's ``RUN/final`` is fine), an rlzoo
            checkpoint or anything inside one, a directory holding ``source``, and the current directory.

    Raises:
        FileExistsError: ``output`` is a directory that is not empty and ``overwrite`` is False.
        ValueError: ``output`` is one of those refused either way (names why and where to write instead); an
            adapter on a model given from Python without ``model`` (names ``export_model(..., model=BASE)``);
            ``model`` for a ``source`` that holds no adapter, a ``model`` of another class than the adapter's base,
            or one carrying LoRA layers; no tokenizer in ``source`` nor given.
        the errors of :func:`~rlzoo.trainer.models.load_model`; OSError: the write failed.
    """
    from rlzoo.trainer.models import load_model

    source = Path(source)
    if (source / "model").is_dir() and (source / "trainer_state.json").is_file():
        source = source / "model"
    _check_export_target(source, Path(output), overwrite=overwrite)
    if model is None:
        _check_loadable_base(source)
        model, tokenizer = load_model(str(source), dtype=dtype)
    else:
        model, tokenizer = _adapter_on(model, source, tokenizer=tokenizer, dtype=dtype)
    if is_peft_model(model):
        model = model.merge_and_unload()
    return save_pretrained_atomic(model, tokenizer, Path(output).resolve())


def _adapter_base(source: Path) -> str | None:
    """The base model an adapter directory's ``adapter_config.json`` names; None for a directory without one."""
    import json

    config = source / "adapter_config.json"
    return str(json.loads(config.read_text()).get("base_model_name_or_path") or "") if config.is_file() else None


def _check_loadable_base(source: Path) -> None:
    """Refuse, saying what to call instead, the export of an adapter whose base was a model object given from
    Python (only ``export_model(..., model=BASE)`` can merge it)."""
    from rlzoo.trainer.models import PYTHON_MODEL

    base = _adapter_base(source)
    if base is not None and base.startswith(PYTHON_MODEL):
        raise ValueError(f"export: the adapter {str(source)!r} was trained on a model object given from Python "
                         f"({base!r}), which cannot be loaded by name: merge it from Python with the same base model "
                         f"as it was before training, rlzoo.trainer.adapters.export_model({str(source)!r}, OUTPUT, "
                         "model=BASE)")


def _adapter_on(model: Any, source: Path, *, tokenizer: Any, dtype: torch.dtype | None) -> tuple[Any, Any]:
    """``(PeftModel, tokenizer)``: the adapter of ``source`` on a copy of the base ``model``; the tokenizer is
    ``source``'s when it has one, else ``tokenizer``. Raises ValueError as :func:`export_model` says."""
    import copy

    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoTokenizer

    from rlzoo.trainer.models import PYTHON_MODEL

    base = _adapter_base(source)
    if base is None:
        raise ValueError(f"export: model= is the base of an adapter, but {str(source)!r} holds no adapter "
                         "(adapter_config.json); export it without model=")
    if is_peft_model(model) or any(isinstance(m, BaseTunerLayer) for m in model.modules()):
        raise ValueError("export: model= carries LoRA layers (a model object a Trainer trained with peft holds its "
                         "adapter, changed in place); pass the base model as it was before training")
    expected = base.removeprefix(PYTHON_MODEL).split(":", 1)[0] if base.startswith(PYTHON_MODEL) else None
    if expected is not None and type(model).__name__ != expected:
        raise ValueError(f"export: the adapter {str(source)!r} was trained on a {expected} ({base!r}); model= is a "
                         f"{type(model).__name__}")
    if (source / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(source)
    elif tokenizer is None:
        raise ValueError(f"export: {str(source)!r} holds no tokenizer: pass the base's, export_model(..., model=BASE, "
                         "tokenizer=TOKENIZER)")
    model = copy.deepcopy(model)
    if dtype is not None:
        model.to(dtype)
    return PeftModel.from_pretrained(model, str(source)), tokenizer


def _check_export_target(source: Path, output: Path, *, overwrite: bool) -> None:
    """Refuse an export that would delete what it must not (see :func:`export_model`)."""
    target = output.resolve()
    if target == Path.cwd().resolve() or target in Path.cwd().resolve().parents:
        raise ValueError(f"export: OUTPUT {str(output)!r} is the current directory or holds it; name a new directory")
    if source.exists() and (target == source.resolve() or target in source.resolve().parents):  # (not a hub id)
        raise ValueError(f"export: OUTPUT {str(output)!r} holds the model being exported ({str(source)!r}); "
                         "write it to a new directory")
    from rlzoo.trainer.run_dir import RUN_FILES, RunDirectory  # (run_dir imports this module, indirectly)

    for run in target.parents:  # RUN/checkpoints/...: the export would delete checkpoints or pose as one
        inside = target.relative_to(run).parts[0]
        if inside in RUN_FILES and RunDirectory(run).holds_run():
            raise ValueError(f"export: OUTPUT {str(output)!r} is inside the {inside} of the training run {str(run)!r}, "
                             f"which the export would replace or the run would misread; write it to a new directory "
                             f"outside them (e.g. {str(run / 'final')!r})")
    checkpoint = next((d for d in (target, *target.parents) if (d / "trainer_state.json").is_file()), None)
    if checkpoint is not None:  # a checkpoint copied out of its run
        raise ValueError(f"export: OUTPUT {str(output)!r} {'is' if checkpoint == target else 'is inside'} the rlzoo "
                         f"checkpoint {str(checkpoint)!r}, which the export would replace; write it to a new directory")
    runs = [d for d in (target, *(target.iterdir() if target.is_dir() else ())) if RunDirectory(d).holds_run()]
    if runs:
        raise ValueError(f"export: OUTPUT {str(output)!r} {'is' if runs[0] == target else 'holds'} a training run's "
                         f"directory, which the export would replace; write it to a new directory (e.g. "
                         f"{str(output / 'final')!r} for a run's)")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"export: OUTPUT {str(output)!r} exists and is not empty; choose a new directory, or "
                              "give --overwrite to replace it (everything in it is deleted)")
