"""The policy and its reference, with or without a PEFT adapter (LoRA): building them, checkpointing the adapter,
merging it into a plain model.

With LoRA (``--peft.r 16 ...`` or ``Trainer(config, peft_config=LoraConfig(...))``), ``peft.get_peft_model`` wraps
the model: its weights are frozen and only the adapter's train. The reference policy is the same model with its
adapter disabled (``PeftModel.disable_adapter()``), so ``beta > 0`` costs no second copy of the model, as in TRL
1.16 (``GRPOTrainer``: "If PEFT is used, the reference model is not needed since the adapter can be disabled");
an adapter trained already is copied, frozen, as the reference instead (:mod:`rlzoo.trainer.reference_adapter`).
A checkpoint's ``model/`` then holds the adapter (``adapter_model.safetensors``, ``adapter_config.json`` naming the
base model) and the tokenizer; :func:`rlzoo.trainer.models.load_model` loads such a directory onto its base, and
:func:`export_model` writes it merged into a plain Hugging Face checkpoint. The ``--peft`` options (checked, recorded
and compared on a resume) are in :mod:`rlzoo.trainer.adapter_options`.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlzoo.trainer.adapter_options import (
    built_adapter,
    check_adapter_options,
    lora_config,
    peft_options,
    peft_wrapping,
    recorded_peft,
    refuse_prompt_learning,
)
from rlzoo.trainer.config import AdapterConfig, ModelConfig
from rlzoo.trainer.io import save_pretrained_atomic
from rlzoo.trainer.reference_adapter import AdapterDisabled, adapter_reference, scoring_model

__all__ = ["AdapterDisabled", "adapter_save_options", "build_policy", "built_adapter", "causal_lm",
           "checkpoint_state_dict", "export_model", "is_peft_model", "load_checkpoint_weights", "lora_config",
           "nonzero_update", "peft_options", "recorded_peft", "scoring_model"]


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
        ValueError: a model object without a tokenizer, a tokenizer without a model object, both ``peft_config``
            and other ``--peft`` options than its own (:func:`peft_options`), options the run cannot honour (:func:`check_adapter_options`: dropout, a
            task type other than CAUSAL_LM, trained biases with a reference; before the model loads), an adapter on the output layer
            (the fused log-probs read the head's weight directly, so it would not train: TRL refuses it too), or on
            an input embedding tied to the output layer (:func:`_check_no_tied_embedding_adapter`), a new adapter
            that does not start at a zero update when a reference is needed (:func:`_check_adapter_starts_at_zero`:
            PiSSA, OLoRA, ...); a PEFT model given whose adapter is not named "default" or is frozen; and
            the errors of :func:`rlzoo.trainer.models.load_model` and :func:`lora_config`.
    """
    import copy

    from rlzoo.trainer.models import load_model

    if peft_config is not None and adapter_config.peft not in (None, peft_options(peft_config)):
        raise ValueError("give the adapter either as peft_config or as --peft options, not both")
    given_as_object = peft_config is not None
    if peft_config is None and adapter_config.peft is not None:
        peft_config = lora_config(adapter_config.peft)
    init_option = "peft_config.init_lora_weights" if given_as_object else "--peft.init_lora_weights"
    target = "peft_config.target_modules" if given_as_object else "--peft.target_modules"
    if peft_config is not None:  # bad adapter options fail before a model loads
        if getattr(peft_config, "inference_mode", False):  # LoraConfig.from_pretrained of a saved adapter sets it
            raise ValueError("peft_config.inference_mode=True freezes the adapter, and nothing would train: set it False")
        check_adapter_options(peft_config, given_as="peft_config" if given_as_object else "--peft",
                              needs_reference=needs_reference)
        if needs_reference:
            _check_adapter_starts_at_zero(peft_config, option=init_option)
    by_name = model is None
    if by_name and tokenizer is not None:  # (TRL's processing_class with a model id: it was dropped silently)
        raise ValueError(f"Trainer(config, tokenizer=...) without model=: a tokenizer goes with a model object, "
                         f"Trainer(config, model=AutoModelForCausalLM.from_pretrained({model_config.model!r}), "
                         "tokenizer=...); a model loaded by name (config.model) brings its own tokenizer")
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
        try:
            with peft_wrapping():
                model = get_peft_model(model, copy.copy(peft_config))
        except ValueError as err:  # peft: "Target modules {'x'} not found in the base model. Please check ..."
            if "target modules" not in str(err).lower():
                raise
            from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

            linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()  # lm_head refused below
                             if isinstance(module, torch.nn.Linear | Conv1D) and module is not model.get_output_embeddings()})
            layers, n = getattr(peft_config, "layers_to_transform", None), getattr(model.config, "num_hidden_layers", 0)
            where = (f" with {target.replace('target_modules', 'layers_to_transform')} {layers!r} (the model's layers: "
                     f"0-{n - 1})" if layers is not None and n else "")  # peft finds no module in those layers
            raise ValueError(f"{target}{where}: {err} The model's linear layers: {', '.join(linear)} (or all-linear)"
                             ) from None
        if needs_reference:
            _check_adapter_starts_at_zero(peft_config, model, option=init_option)
        # the saved adapter names its base as the run records it: a built-in name, path or hub id, or for a model
        # object without one the ``model:CLASS`` name that load_model refuses saying what to pass
        model.peft_config["default"].base_model_name_or_path = model_config.model
    if is_peft_model(model):
        from peft.tuners.tuners_utils import BaseTunerLayer

        refuse_prompt_learning(model.peft_config[model.active_adapter], given_as="the model's adapter")
        if peft_config is None and model.active_adapter != "default":  # peft saves another name in a subfolder
            raise ValueError(f"the model's adapter is named {model.active_adapter!r}: name it 'default' (peft writes "
                             "another adapter into a subfolder, which checkpoints, rlzoo eval and export do not read)")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("the model's adapter is frozen, so nothing would train (PeftModel.from_pretrained loads "
                             "one with is_trainable=False): load it with PeftModel.from_pretrained(..., "
                             "is_trainable=True), or give its directory as --model")

        if isinstance(model.get_output_embeddings(), BaseTunerLayer):
            raise ValueError("an adapter on the output layer (lm_head) would not train: the log-probs read "
                             f"lm_head.weight directly; remove it from {target}")
        _check_no_tied_embedding_adapter(model, option=target)
    model.eval()
    if not needs_reference:
        return model, tokenizer, None
    if not is_peft_model(model):
        return model, tokenizer, copy.deepcopy(model).requires_grad_(False)
    # an adapter made here starts at a zero update (checked above): disabled, it is the starting policy
    return model, tokenizer, AdapterDisabled(model) if peft_config is not None else adapter_reference(model)


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


REWRITE_BASE = ("pissa", "olora", "corda", "loftq")
"""peft's ``init_lora_weights`` that rewrite the base weights to a residual (``pissa_niter_N`` too)."""


def _check_adapter_starts_at_zero(peft_config: Any, model: Any = None, *, option: str) -> None:
    """Refuse a new LoRA adapter whose update ``B A`` does not start at zero when the loss needs a reference: the
    reference is the model with the adapter disabled (as TRL), which is then not the initial policy (a user trial:
    KL 0.005 at step 1 with PiSSA, where it is exactly 0). Without ``model`` (before it loads), by name: PiSSA,
    OLoRA, CorDA, LoftQ (:data:`REWRITE_BASE`) rewrite the base weights to a residual and start ``B A`` at the
    difference. With ``model`` (the adapter just made), by value (:func:`nonzero_update`), for any other start
    (``init_lora_weights=False`` is random). Only ``peft.LoraConfig`` adapters (AdaLoRA starts its update at zero
    through its own ``E``).

    Raises:
        ValueError: names ``option`` (and the first layer whose update is not zero) and what to do instead.
    """
    from peft import AdaLoraConfig, LoraConfig

    if not isinstance(peft_config, LoraConfig) or isinstance(peft_config, AdaLoraConfig):
        return
    init = peft_config.init_lora_weights
    layer = None
    if isinstance(init, str) and init.lower().startswith(REWRITE_BASE):
        layer = "every adapted layer"
    elif model is not None:
        layer = nonzero_update(model)
    if layer is not None:
        raise ValueError(
            f"{option}={init!r}: the adapter starts with a non-zero update ({layer}; PiSSA, OLoRA, CorDA and LoftQ "
            "rewrite the base weights, init_lora_weights=False is random), so the model with the adapter disabled, "
            "which is the reference (ref_logprobs, as TRL), is not the initial policy: use the default "
            "init_lora_weights, or train without a reference (--loss.beta 0, no --use-kl-in-reward)")


def nonzero_update(model: Any) -> str | None:
    """``"layer NAME"`` of the first LoRA layer of ``model`` whose update ``B A`` is not zero, else None (an adapter
    just made, or a model without LoRA layers). ``||B A||_F^2`` is ``sum((B^T B) * (A A^T))`` of two ``r x r``
    matrices (conv weights flattened), "zero" relative to ``||B||_F ||A||_F`` within 4 ulps of the weights' or the
    base layer's dtype (an orthogonal initialisation's ``B A`` is zero up to rounding, in bf16 too)."""
    for name, module in model.named_modules():
        for a_dict, b_dict in ((getattr(module, "lora_A", {}), getattr(module, "lora_B", {})),
                               (getattr(module, "lora_embedding_A", {}), getattr(module, "lora_embedding_B", {}))):
            for key in a_dict.keys() & b_dict.keys():
                a, b = (getattr(x, "weight", x) for x in (a_dict[key], b_dict[key]))  # Linear / Conv, or a Parameter
                if key in getattr(module, "lora_E", {}):  # AdaLoRA: B (A * E), zero while E is
                    a = a * module.lora_E[key].reshape(-1, *[1] * (a.dim() - 1))
                base = getattr(getattr(module, "get_base_layer", lambda: None)(), "weight", a)  # made in its dtype
                tol = max(1e-6, 4 * torch.finfo(a.dtype).eps, 4 * torch.finfo(base.dtype).eps)
                a, b = a.detach().double().flatten(1), b.detach().double().flatten(1)  # (r, in...), (out, r)
                if float(((b.T @ b) * (a @ a.T)).sum().clamp(min=0).sqrt()) > tol * float(a.norm() * b.norm()):
                    return f"layer {name}"
    return None


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
            checkpoint or anything inside one, a directory holding ``source`` or the base model of its adapter, and the
            current directory.

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
        from rlzoo.trainer.model_digest import check_digest

        check_digest(source.parent, model, model_name=_adapter_base(source), doing="the adapter is merged")
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
    with peft_wrapping():
        return PeftModel.from_pretrained(model, str(source)), tokenizer


def _check_export_target(source: Path, output: Path, *, overwrite: bool) -> None:
    """Refuse an export that would delete what it must not (see :func:`export_model`)."""
    target = output.resolve()
    if target == Path.cwd().resolve() or target in Path.cwd().resolve().parents:
        raise ValueError(f"export: OUTPUT {str(output)!r} is the current directory or holds it; name a new directory")
    if source.exists() and (target == source.resolve() or target in source.resolve().parents):  # (not a hub id)
        raise ValueError(f"export: OUTPUT {str(output)!r} holds the model being exported ({str(source)!r}); "
                         "write it to a new directory")
    base = _adapter_base(source) if source.is_dir() else None
    if base and Path(base).exists() and (target == Path(base).resolve() or target in Path(base).resolve().parents):
        raise ValueError(f"export: OUTPUT {str(output)!r} holds the base model of the adapter being exported ({base!r}, "
                         "its adapter_config.json), which the run's checkpoints load; write it to a new directory")
    from rlzoo.trainer.run_dir import RunDirectory, inside_a_run  # (run_dir imports this module, indirectly)

    inside = inside_a_run(target)
    if inside is not None:
        where, owner = inside
        raise ValueError(f"export: OUTPUT {str(output)!r} {where}, which the export would replace or the run would "
                         f"misread; write it to a new directory outside them (e.g. {str(owner / 'final')!r})")
    # what --overwrite would delete: a run or a checkpoint anywhere below (exp1/seed0/...)
    runs = [Path(d) for d, _, files in os.walk(target) if RunDirectory(d).holds_run() or "trainer_state.json" in files]
    if runs:
        raise ValueError(f"export: OUTPUT {str(output)!r} {'is' if runs[0] == target else 'holds'} a training run's "
                         f"directory or checkpoint ({str(runs[0])!r}), which the export would replace; write it to a new "
                         f"directory (e.g. {str(output / 'final')!r} for a run's)")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"export: OUTPUT {str(output)!r} exists and is not empty; choose a new directory, or "
                              "give --overwrite to replace it (everything in it is deleted)")
