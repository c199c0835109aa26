"""A digest of the model a run starts from: a resume, export or evaluation onto a changed ``--model`` is said.

A LoRA checkpoint holds only the adapter: a resume rebuilds the base from ``--model``, and ``rlzoo export`` merges
the adapter onto the base its ``adapter_config.json`` names; a full fine-tune's reference model (``beta > 0``) is
``--model`` too. When that folder (or a hub id's revision) changed since the run started, nothing said so: the
adapter went on over another base. The checkpoint records :func:`weights_digest` of the base (``trainer_state.json``
``model_digest``), and :func:`check_digest` warns when the base loaded now differs.

The digest samples each tensor (at most 256 evenly spaced values, their bytes in the loaded dtype) with its name
and shape: a re-initialised, retrained or other model changes it; reading it costs a few milliseconds whatever the
model's size. Loads in two dtypes are compared rounded to the narrower one (bfloat16 or float16, as a load in it
rounds a wider file), so a ``--dtype`` change or an export in the file's dtype is no different model. Adapter
weights are left out, and a PEFT model's parameter names are read as its base model's, so the base of a LoRA run
and the plain model it was loaded from have one digest; a reference copied from a trained adapter
(:mod:`rlzoo.trainer.reference_adapter`) also records that starting adapter's digest, checked on resume.
"""

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["check_digest", "weights_digest"]

log = logging.getLogger("rlzoo.train")

_SAMPLES = 256
_NARROW = (torch.bfloat16, torch.float16)  # a base loaded in either compares with one loaded wider, rounded alike


def weights_digest(model: Any, *, adapter: bool = False) -> dict[str, str]:
    """The digest of ``model``'s base weights (adapter weights left out; see the module docstring):
    ``{"dtype": ..., "sha256": ...}`` of the samples as loaded, and ``"bfloat16"`` / ``"float16"``: of the samples
    rounded to that dtype (what a load in it reads from a wider file), so that a base loaded in another dtype than
    the run's is compared too. ``adapter``: also ``"adapter"``, the digest of the active adapter's weights (the
    reference copy of an adapter trained already is made from it). ``model``: its parameters whole (not sharded)."""
    adapters = tuple(getattr(model, "peft_config", None) or ())
    active = getattr(model, "active_adapter", None) if adapters else None
    digests = {key: hashlib.sha256() for key in ("sha256", *(str(d).removeprefix("torch.") for d in _NARROW))}
    own, dtypes = hashlib.sha256(), set()
    for name, param in model.named_parameters():
        sample = param.detach().reshape(-1)
        sample = sample[:: max(1, sample.numel() // _SAMPLES)][:_SAMPLES].cpu().contiguous()
        if any(f".{a}." in f"{name}." for a in adapters):  # lora_A.default.weight, ...: an adapter, not the base
            if f".{active}." in f"{name}.":
                own.update(name.encode() + sample.view(torch.uint8).numpy().tobytes())
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        dtypes.add(str(param.dtype).removeprefix("torch."))
        for key, digest in digests.items():
            cast = sample if key == "sha256" else sample.to(getattr(torch, key))
            digest.update(f"{name}{tuple(param.shape)}".encode() + cast.view(torch.uint8).numpy().tobytes())
    out = {"dtype": ",".join(sorted(dtypes)), **{key: d.hexdigest()[:16] for key, d in digests.items()}}
    return {**out, "adapter": own.hexdigest()[:16]} if adapter else out


def check_digest(checkpoint: str | os.PathLike[str], model: Any, *, model_name: str, doing: str,
                 reference_copy: bool = False, warn: bool = True) -> dict[str, str] | None:
    """Warn when ``model`` (loaded now from ``model_name``) is not the base that ``checkpoint`` (a directory with a
    ``trainer_state.json``) recorded as its ``model_digest``, or (when both recorded one) its starting adapter is
    not the one recorded. Compared as loaded when the dtypes agree, else rounded to the narrower of the two (bfloat16
    or float16); nothing is said for a checkpoint of an older rlzoo (no digest). Returns the recorded digest (None
    without one): a resumed run records it in its own checkpoints, so each names the model the run started from.

    Args:
        doing: what goes on over the changed base, for the message (e.g. "the run goes on").
        warn: False: only return the recorded digest (a rank other than the first).
        reference_copy: ``model`` is a resumed run's policy as rebuilt from ``--model``, whose reference is a copy
            of its starting adapter (:mod:`rlzoo.trainer.reference_adapter`): that adapter is compared too, and a
            checkpoint of an older rlzoo (whose reference for it was the base) is said to change the KL term.
    """
    try:
        recorded = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("model_digest")
    except (OSError, ValueError, AttributeError):
        return None
    if not warn:
        return recorded if isinstance(recorded, dict) else None
    if recorded is None and reference_copy:
        log.warning("checkpoint %s was written by an older rlzoo, whose reference for an adapter trained already was "
                    "its base model: from here on the reference is a frozen copy of the starting adapter (as TRL's), so "
                    "the KL term is not the one the run had so far", checkpoint)
    if not isinstance(recorded, dict):
        return None
    now = weights_digest(model, adapter=reference_copy and "adapter" in recorded)
    mine, theirs = now["dtype"], recorded.get("dtype")
    key = "sha256" if mine == theirs else next((k for k in ("bfloat16", "float16") if k in (mine, theirs)), None)
    if key is not None and key in recorded and now[key] != recorded[key]:
        log.warning("the model %s is not the one checkpoint %s started from (its weights differ: the folder or the "
                    "hub revision changed since); %s over the model as it is now", model_name, checkpoint, doing)
    if "adapter" in now and mine == theirs and now["adapter"] != recorded["adapter"]:
        log.warning("the adapter of %s is not the one checkpoint %s started from (its reference is a frozen copy of "
                    "it, made again at each start): the reference is now a copy of the adapter as it is now",
                    model_name, checkpoint)
    return recorded
