"""A digest of the model a run starts from, so that a resume or an export onto a changed ``--model`` is said.

A LoRA checkpoint holds only the adapter: a resume rebuilds the base from ``--model``, and ``rlzoo export`` merges
the adapter onto the base its ``adapter_config.json`` names; a full fine-tune's reference model (``beta > 0``) is
``--model`` too. When that folder (or a hub id's revision) changed since the run started, nothing said so: the
adapter went on over another base. The checkpoint records :func:`weights_digest` of the base (``trainer_state.json``
``model_digest``), and :func:`check_digest` warns when the base loaded now differs.

The digest samples each tensor (at most 256 evenly spaced values, their bytes in the loaded dtype) with its name
and shape: a re-initialised, retrained or other model changes it; reading it costs a few milliseconds whatever the
model's size. It is compared only between loads in the same dtype (a ``--dtype`` change on resume is not a
different model). Adapter weights are left out, and a PEFT model's parameter names are read as its base model's,
so the base of a LoRA run and the plain model it was loaded from have one digest.
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


def weights_digest(model: Any) -> dict[str, str]:
    """``{"dtype": ..., "sha256": ...}`` of ``model``'s base weights (adapter weights left out; see the module
    docstring). ``model``: a Hugging Face model or a ``PeftModel``, its parameters whole (not yet sharded)."""
    adapters = tuple(getattr(model, "peft_config", None) or ())
    digest, dtypes = hashlib.sha256(), set()
    for name, param in model.named_parameters():
        if any(f".{adapter}." in f"{name}." for adapter in adapters):
            continue  # lora_A.default.weight, ...: the adapter, not the base
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // _SAMPLES)][:_SAMPLES].cpu().contiguous()
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
        dtypes.add(str(param.dtype).removeprefix("torch."))
    return {"dtype": ",".join(sorted(dtypes)), "sha256": digest.hexdigest()[:16]}


def check_digest(checkpoint: str | os.PathLike[str], model: Any, *, model_name: str, doing: str) -> None:
    """Warn when ``model`` (loaded now from ``model_name``) is not the base that ``checkpoint`` (a directory with a
    ``trainer_state.json``) recorded as its ``model_digest``. Nothing is said for a checkpoint of an older rlzoo
    (no digest) or a model loaded in another dtype than the run's.

    Args:
        doing: what goes on over the changed base, for the message (e.g. "the run goes on").
    """
    try:
        recorded = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("model_digest")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(recorded, dict):
        return
    now = weights_digest(model)
    if now["dtype"] == recorded.get("dtype") and now["sha256"] != recorded.get("sha256"):
        log.warning("the model %s is not the one checkpoint %s started from (its weights differ: the folder or the "
                    "hub revision changed since); %s over the model as it is now", model_name, checkpoint, doing)
