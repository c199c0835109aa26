"""The algorithms: one file per family, each holding its card (paper, arXiv id and equation, the reference
implementations it matches, defaults), its composition of :mod:`rlzoo.losses` parts, and the parts only it
uses, with a doctest.

Every module of this package is imported here (found on disk, not listed), so adding ``myalgo.py`` with an
``@preset("myalgo", ...)`` builder registers it: ``rlzoo.get_loss("myalgo")``, ``rlzoo explain myalgo``,
docs/algorithms.md and the zoo-wide conformance suite (tests/losses/test_conformance.py) pick it up.

================  =========================================================================================
file              presets (and own parts)
================  =========================================================================================
ppo.py            ppo
grpo.py           grpo, bnpo
dr_grpo.py        dr_grpo
dapo.py           dapo
gspo.py           gspo, gspo_token
luspo.py          luspo
two_sided.py      two_sided
cispo.py          cispo (surrogate ``cispo``)
sapo.py           sapo (surrogate ``sapo``)
gpg.py            gpg (surrogate ``reinforce``)
gmpo.py           gmpo (ratio level ``geometric``, surrogate ``gmpo``)
cov.py            clip_cov, kl_cov (surrogates ``clip_cov``, ``kl_cov``)
vespo.py          vespo (surrogate ``vespo``)
dppo.py           dppo_tv, dppo_kl (surrogates ``dppo_tv``, ``dppo_kl``)
dro.py            dro (surrogate ``dro``)
decoupled_ppo.py  decoupled_ppo (AReaL's PPO clip + ``is_correction`` behaviour weight; ``prox_logp_method``)
m2po.py           m2po (rejection ``m2po``: the second-moment mask)
vapo.py           vapo (penalty ``positive_nll``)
opd.py            opd (penalty ``distillation``: on-policy distillation, needs ``teacher_logprobs``)
================  =========================================================================================
"""

import importlib
import pkgutil

from rlzoo.losses.presets import Preset, get_loss, list_losses, preset, presets

__all__ = ["Preset", "get_loss", "list_losses", "modules", "preset", "presets"]


def modules() -> list[str]:
    """The algorithm modules of this package, by name (sorted)."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


for _name in modules():
    importlib.import_module(f"{__name__}.{_name}")
