"""Where the model runs and in which precision: the device, the parameter dtype and the autocast dtype."""

import contextlib
import dataclasses
from typing import Any

import torch

from rlzoo.trainer.config import ModelConfig

__all__ = ["Precision"]


@dataclasses.dataclass(frozen=True)
class Precision:
    """The resolved ``device`` and ``dtype`` of a run.

    Attributes:
        device: where the model and its tensors live.
        param_dtype: dtype of the trained parameters and of the optimizer state.
        autocast_dtype: dtype of the forward passes under ``torch.autocast`` (bf16-mixed), or None.
    """

    device: torch.device
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None

    @classmethod
    def resolve(cls, config: ModelConfig, *, local_rank: int = 0) -> "Precision":
        """``auto`` device = CUDA if available; ``auto`` dtype = bf16-mixed on CUDA, float32 elsewhere. Under
        torchrun, ``cuda`` without an index is this rank's GPU (``cuda:LOCAL_RANK``).

        Raises:
            ValueError: a device torch does not know (``gpu``), or a CUDA device asked for where CUDA is not
                available (names --device).
        """
        if config.device == "auto":
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            try:
                device = torch.device(config.device)
            except RuntimeError:  # torch's message lists twenty device types and names no flag
                raise ValueError(f"--device {config.device!r} is not a device{_meant(config.device)}: use auto, cpu, "
                                 "cuda or cuda:N (N: a GPU's index)") from None
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device {config.device!r} requested but CUDA is not available; use --device cpu or auto")
        if device.type == "cuda" and device.index is None and local_rank:
            device = torch.device("cuda", local_rank)
        name = config.dtype
        if name == "auto":
            name = "bf16-mixed" if device.type == "cuda" else "float32"
        if name == "bf16-mixed":
            return cls(device, torch.float32, torch.bfloat16)
        return cls(device, getattr(torch, name), None)

    @property
    def inference_dtype(self) -> torch.dtype:
        """Parameter dtype for evaluation only (no optimizer): mixed precision loads the weights in bf16."""
        return self.autocast_dtype or self.param_dtype

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around forward passes in mixed precision (fp32 weights); a no-op otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def __str__(self) -> str:
        text = f"{self.device} {str(self.param_dtype).removeprefix('torch.')}"
        return text + (" + bf16 autocast" if self.autocast_dtype else "")


def _meant(device: str) -> str:
    """`` (did you mean 'cuda:0'?)`` for ``gpu:0`` or ``CUDA:0`` (a device torch knows), else ``""``."""
    name = device.strip().lower()
    name = "cuda" + name[3:] if name.startswith("gpu") else name
    try:
        torch.device(name)
    except RuntimeError:
        return ""
    return f" (did you mean {name!r}?)"
