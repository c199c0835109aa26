"""The ``--peft`` options of an adapter run: checking them and building the ``peft.LoraConfig`` they give
(:func:`lora_config`), refusing what a run cannot honour (:func:`check_adapter_options`), a PEFT config object's options as ``--peft`` options (:func:`peft_options`), what a run
records as its ``peft`` setting (:func:`recorded_peft`) and what a resume compares (:func:`built_adapter`), and
:func:`peft_wrapping`, around peft's wrapping of a model.

:mod:`rlzoo.trainer.adapters` builds the policy with the adapter these options describe (and re-exports these names).
"""

import contextlib
import dataclasses
import math
import re
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["built_adapter", "check_adapter_options", "lora_config", "peft_options", "peft_wrapping", "recorded_peft",
           "refuse_prompt_learning"]


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around ``get_peft_model`` / ``PeftModel.from_pretrained``: hides the FutureWarning transformers (>= 5) gives
    when peft reads the deprecated ``model.is_gradient_checkpointing``, which every LoRA run would print and no user
    can act on. Other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


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
        raise ValueError(f"--peft.peft_type {options['peft_type']}: --peft options build a LoRA adapter (the fields of "
                         "peft.LoraConfig); another method's adapter is given from Python as a peft_config object "
                         "(Trainer(config, peft_config=...); a run that trained one resumes with the same object: "
                         "Trainer(resume_config(RUN), peft_config=...))")
    if options.get("inference_mode") is True:  # the adapter would be frozen: "optimizer got an empty parameter list"
        raise ValueError("--peft.inference_mode true freezes the adapter, and nothing would train; leave it out")
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


def refuse_prompt_learning(peft_config: Any, *, given_as: str) -> None:
    """Refuse a prompt-learning method (prefix / prompt / p-tuning: virtual tokens PeftModel adds to the input):
    the scorer runs the model's body on the completion's own tokens, so they would receive no gradient (a raw
    autograd error at the first backward).

    Raises:
        ValueError: names ``given_as``, the config's class and the adapters that train.
    """
    if getattr(peft_config, "is_prompt_learning", False):
        raise ValueError(f"{given_as}: {type(peft_config).__name__} is a prompt-learning method (virtual tokens added "
                         "to the input), which rlzoo's log-probs do not see, so it would not train; use an adapter "
                         "of the weights: LoraConfig (--peft.r ...; DoRA, rsLoRA), IA3Config, LoKrConfig, ...")


def check_adapter_options(peft_config: Any, *, given_as: str, needs_reference: bool) -> None:
    """Refuse, before a model loads, adapter options a run cannot honour: dropout (the policy runs in eval mode, as in
    rlzoo's full-model runs, so it would do nothing; in train mode the first iteration's ratio would differ from 1),
    a ``task_type`` other than a causal LM's (the policy is one; an adapter saved as ``SEQ_CLS`` loads as no causal
    LM's), and, when the loss needs a reference (the model with the adapter disabled, as TRL's), trained biases
    (``bias`` ``'all'`` / ``'lora_only'``: disabling the adapter does not restore them, so the reference would move
    with the policy; peft warns the same).

    Args:
        peft_config: a ``peft`` config object (another method's too: absent fields pass).
        given_as: how the options were given, ``"--peft"`` or ``"peft_config"``: errors name ``GIVEN_AS.FIELD``.
        needs_reference: the loss or the reward needs the reference policy's log-probs (``beta > 0``, the KL in
            the reward).

    Also refused: a prompt-learning method (:func:`refuse_prompt_learning`).

    Raises:
        ValueError: names the option, why, and the value to use.
    """
    refuse_prompt_learning(peft_config, given_as=given_as)
    dropout = getattr(peft_config, "lora_dropout", 0.0) or 0.0
    if dropout > 0:
        raise ValueError(f"{given_as}.lora_dropout must be 0, got {dropout:g}: rlzoo trains with dropout off, as in its "
                         "full-model runs (dropout would make the ratio differ from 1 at the first iteration); drop the "
                         "option")
    task_type = getattr(peft_config, "task_type", None)
    task_type = getattr(task_type, "value", task_type)  # peft's TaskType enum, or its string
    if task_type not in (None, "CAUSAL_LM"):
        raise ValueError(f"{given_as}.task_type {task_type}: the policy is a causal LM, and an adapter saved as "
                         f"{task_type} does not load as one; give CAUSAL_LM or leave the option out")
    bias = getattr(peft_config, "bias", "none")
    if needs_reference and bias not in (None, "none"):
        raise ValueError(f"{given_as}.bias {bias!r} trains the model's biases, which disabling the adapter does not "
                         "restore: the reference policy (the model with the adapter disabled) would move with the "
                         "policy; use bias 'none' with a KL to the reference (beta > 0, --use-kl-in-reward), or "
                         "train without one (--loss.beta 0, also on the resume of a run that trained so)")


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
