"""The reference policy of an adapter run, without a second copy of the model.

A new adapter (LoRA's update ``B A`` starts at zero) is disabled for the reference: the base is then exactly the
starting policy (TRL 1.16: "the adapter can be disabled"). An adapter trained already (``--model ADAPTER_DIR``, a
``PeftModel`` passed in whose update is not zero) is not: its base is another policy, so the KL started above 0.
Such an adapter is copied, frozen, as a second adapter named :data:`REFERENCE_ADAPTER`, and the reference is the
model with that copy active, as TRL 1.16 adds its ``"ref"`` adapter (``GRPOTrainer.__init__``, ``use_adapter``).
The copy is made from the adapter as loaded, before a resume restores the trained one, so a resumed run keeps the
starting policy as its reference; checkpoints and exports hold the trained adapter only.
"""

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

__all__ = ["REFERENCE_ADAPTER", "AdapterDisabled", "adapter_reference", "fresh_lora", "scoring_model"]

REFERENCE_ADAPTER = "rlzoo_reference"
"""The name of the frozen copy of a trained adapter that scores the reference."""


@dataclasses.dataclass(frozen=True)
class AdapterDisabled:
    """The reference policy of an adapter run: the policy with its adapter disabled, or with the frozen copy of its
    starting adapter active (``adapter``); no second copy of the model.

    Attributes:
        policy: the ``PeftModel`` being trained.
        module: what the policy is scored through (its :class:`~rlzoo.trainer.scorer.LogProbModule`, possibly
            wrapped by DDP / FSDP2), or None for the ``PeftModel`` itself.
        adapter: None (the adapter disabled), or the name of the frozen copy to score with
            (:data:`REFERENCE_ADAPTER`).
    """

    policy: Any
    module: Any = None
    adapter: str | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """What to score with, for the duration of the block: the adapter disabled (``PeftModel.disable_adapter``),
        or the copy active (``set_adapter``; the trained adapter is active again, and trainable, after it)."""
        scored = self.policy if self.module is None else self.module
        if self.adapter is None:
            with self.policy.disable_adapter():
                yield scored
            return
        trained = self.policy.active_adapter
        flags = [(p, p.requires_grad) for p in self.policy.parameters()]  # set_adapter makes a whole adapter trainable
        self.policy.set_adapter(self.adapter)
        try:
            yield scored
        finally:
            self.policy.set_adapter(trained)
            for param, flag in flags:  # exactly as before (a part of the adapter frozen by the user stays frozen)
                param.requires_grad_(flag)


@contextlib.contextmanager
def scoring_model(model: Any) -> Iterator[Any]:
    """The module to score with: an :class:`AdapterDisabled` reference's model while the block runs, or ``model``
    itself."""
    if isinstance(model, AdapterDisabled):
        with model.active() as base:
            yield base
    else:
        yield model


def fresh_lora(model: Any) -> bool:
    """Whether every adapter of a PEFT ``model`` is LoRA with its update ``B A`` still zero (as ``get_peft_model``
    makes one): the model with it disabled is then the starting policy."""
    from peft import LoraConfig

    from rlzoo.trainer.adapters import nonzero_update

    configs = list(getattr(model, "peft_config", {}).values())
    return bool(configs) and all(isinstance(c, LoraConfig) for c in configs) and nonzero_update(model) is None


def adapter_reference(model: Any) -> AdapterDisabled:
    """The reference of the PEFT ``model`` given trained (not made by the run): disabled for a new LoRA adapter
    (:func:`fresh_lora`) or one that is not LoRA (prefix tuning, IA3, AdaLoRA, which takes one adapter: the trainer
    warns when it is trained already); else a frozen copy of its adapter added as :data:`REFERENCE_ADAPTER` (the
    copy's weights equal the adapter's bit for bit). A model object given from Python keeps the copy after the run
    (as TRL's keeps its ``ref`` adapter); a second run of it copies its adapter into it again."""
    from peft import AdaLoraConfig, LoraConfig

    name = model.active_adapter
    config = model.peft_config[name]
    if fresh_lora(model) or not isinstance(config, LoraConfig) or isinstance(config, AdaLoraConfig):  # one adapter
        return AdapterDisabled(model)
    if REFERENCE_ADAPTER not in model.peft_config:  # else a model object trained before: its copy is made again
        flags = [(p, p.requires_grad) for p in model.parameters()]
        model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(config))
        for param, flag in flags:
            param.requires_grad_(flag)
    params = dict(model.named_parameters())
    for key, param in params.items():
        if f".{name}." in key:
            params[key.replace(f".{name}.", f".{REFERENCE_ADAPTER}.")].data.copy_(param.data)
    for key, param in model.named_parameters():
        if f".{REFERENCE_ADAPTER}." in key:
            param.requires_grad_(False)
    return AdapterDisabled(model, adapter=REFERENCE_ADAPTER)
