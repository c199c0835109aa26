"""Presets: named compositions of parts with their paper's defaults (``rlzoo.get_loss(name, **overrides)``).

Each preset is a function returning a :class:`~rlzoo.losses.PolicyLoss`, registered with its card (paper,
arXiv id, reference implementations, recommended advantage estimator) by :func:`preset`. The function's
docstring is the card's formula; ``rlzoo explain NAME`` prints the card and docs/algorithms.md is generated
from them. The built-in presets are defined one algorithm family per file in :mod:`rlzoo.algorithms`, which
``import rlzoo`` loads; this module holds the registry and the card, so that :mod:`rlzoo.losses` never
imports the algorithms.
"""

import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rlzoo.losses.base import Part
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.registry import Registry

__all__ = ["Preset", "algorithms_markdown", "get_loss", "list_losses", "preset", "presets"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset:
    """A registered algorithm: how to build its loss and its card.

    Attributes:
        name: registry name (``rlzoo.get_loss(name)``).
        build: zero-argument function returning the preset's :class:`PolicyLoss` (paper defaults).
        title: one-line name of the method.
        paper: authors, year and title.
        arxiv: arXiv id, or None.
        matches: reference implementations whose semantics the preset matches, and how to spell it there.
        advantage: recommended advantage estimator (``rlzoo.get_advantage``), used by the trainer by default.
        advantage_options: keyword options for that estimator.
        notes: caveats (trainer-side parts, deviations between paper and implementations).
        parts: the part classes only this algorithm uses (defined beside it): the card is their provenance,
            appended to their docstrings by :func:`preset` and listed by ``rlzoo explain``.
    """

    name: str
    build: Callable[[], PolicyLoss]
    title: str
    paper: str
    arxiv: str | None
    matches: str
    advantage: str = "grpo"
    advantage_options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    notes: str = ""
    parts: tuple[type[Part], ...] = ()

    @property
    def formula(self) -> str:
        """The objective, from the build function's docstring."""
        return inspect.cleandoc(self.build.__doc__ or "")

    @property
    def source(self) -> str:
        """Where the preset is defined: its module's path for rlzoo's own (``rlzoo/algorithms/dapo.py``), else
        the module name."""
        module = self.build.__module__
        return module.replace(".", "/") + ".py" if module.startswith("rlzoo.") else module

    def reading(self) -> list[tuple[str, str]]:
        """The files a reader opens besides :attr:`source` to understand the preset, each once (its entries
        joined), in the order of their first use, as ``(path, what to read there)``: the pipeline that calls the
        parts (``PolicyLoss.__call__``, and ``LossInputs``, what every part reads; the off-policy path too when the
        loss takes it), the module of each active part defined outside the preset's own file, with the parts'
        names (``("rlzoo/losses/surrogate.py", "token, ppo_clip")``), and for a part defined in the preset's file
        the module of its slot's base (``"the Surrogate base"``)."""
        loss = self.build()
        files = [("rlzoo/losses/policy_loss.py", "PolicyLoss.__call__"), ("rlzoo/losses/base.py", "LossInputs")]
        if loss.off_policy:
            files.append(("rlzoo/losses/off_policy.py", "policy_loss"))
        modules: dict[str, list[str]] = {}
        for part in loss.parts():
            module = type(part).__module__
            if module != self.build.__module__:
                modules.setdefault(module, []).append(part.registered_name())
            else:  # the preset's own part: its slot's base (what it implements) lives with the slot's shared parts
                slot = next(c for c in type(part).__mro__[1:] if "registry" in vars(c))
                if slot.__module__ != module:
                    modules.setdefault(slot.__module__, []).append(f"the {slot.__name__} base")
        reading = dict(files)  # a file read for the pipeline and for a part is listed once
        for module, names in modules.items():
            path = module.replace(".", "/") + ".py"
            reading[path] = ", ".join([reading[path], *names]) if path in reading else ", ".join(names)
        return list(reading.items())

    def provenance(self) -> str:
        """One paragraph: the paper (arXiv id) and the reference implementations the preset matches."""
        arxiv = f", arXiv:{self.arxiv}" if self.arxiv else ""
        return f"Source: the ``{self.name}`` card ({self.source}): {self.paper}{arxiv}. Matches {self.matches}."

    def markdown(self) -> str:
        """The preset's section of docs/algorithms.md (``rlzoo explain NAME --markdown``)."""
        loss = self.build()
        out = [
            f"## {self.name}",
            "",
            f"**{self.title}.** {self.paper}" + (f", [arXiv:{self.arxiv}](https://arxiv.org/abs/{self.arxiv})" if self.arxiv else "") + ".",
            "",
            "```text",
            self.formula,
            "```",
            "",
            f"![{self.name}: objective and gradient vs. the ratio](pictures/{self.name}.png)",
            "",
            "Components and defaults:",
            "",
            "```text",
            loss.describe(),
            "```",
            "",
            f"- Matches: {self.matches}.",
            f"- Defined in: `{self.source}`.",
            "- Read with: " + ", ".join(f"`{path}` ({what})" for path, what in self.reading()) + ".",
            f"- Recommended advantage: `{self.advantage}`" + (f" {dict(self.advantage_options)}" if self.advantage_options else "") + ".",
            "- Needs: `logprobs`, `advantages`, `completion_mask`"
            + "".join(f", `{f}`" for f in sorted(loss.required_fields())) + ".",
        ]
        if self.notes:
            out.append(f"- Notes: {self.notes}")
        return "\n".join(out)

    def card(self) -> str:
        """Plain-text card printed by ``rlzoo explain``."""
        loss = self.build()
        lines = [
            f"{self.name}: {self.title}",
            f"paper:     {self.paper}" + (f" (arXiv:{self.arxiv})" if self.arxiv else ""),
            f"matches:   {self.matches}",
            f"advantage: {self.advantage}" + (f" {dict(self.advantage_options)}" if self.advantage_options else ""),
            f"source:    {self.source}"
            + (f" (parts: {', '.join(cls.registered_name() for cls in self.parts)})" if self.parts else ""),
            "read with: " + "\n           ".join(f"{path} ({what})" for path, what in self.reading()),
            "",
            self.formula,
            "",
            "components (defaults):",
            textwrap.indent(loss.describe(), "  "),
        ]
        lines.append(needs_line(loss))
        if self.notes:
            lines += ["", "notes: " + self.notes]
        return "\n".join(lines)


presets: Registry[Preset] = Registry("loss preset")


def needs_line(loss: PolicyLoss) -> str:
    """The card's ``needs:`` line: the :class:`~rlzoo.PolicyBatch` fields ``loss`` reads."""
    return "needs:     logprobs, advantages, completion_mask" + "".join(f", {f}" for f in sorted(loss.required_fields()))


def preset(name: str, **card: Any) -> Callable[[Callable[[], PolicyLoss]], Callable[[], PolicyLoss]]:
    """Decorator registering a zero-argument loss builder as preset ``name`` with its card fields.

    Args:
        name: the registry name (``rlzoo.get_loss(name)``); must not be registered yet.
        **card: the :class:`Preset` fields other than ``name`` and ``build``: ``title``, ``paper``, ``arxiv``,
            ``matches`` (required), ``advantage``, ``advantage_options``, ``notes``, ``parts``.

    Raises:
        ValueError: ``name`` is already registered.
        TypeError: a card field is missing or unknown.

    Example:
        >>> from rlzoo.losses import PolicyLoss, presets
        >>> with presets.scoped():
        ...     @preset("my_reinforce", title="REINFORCE", paper="Williams 1992", arxiv=None, matches="-")
        ...     def my_reinforce() -> PolicyLoss:
        ...         '''loss = -A logp'''
        ...         return PolicyLoss(surrogate="reinforce")
        ...     get_loss("my_reinforce").surrogate.registered_name()
        'reinforce'
    """

    def decorator(build: Callable[[], PolicyLoss]) -> Callable[[], PolicyLoss]:
        entry = presets.register(name)(Preset(name=name, build=build, **card))
        for cls in entry.parts:  # provenance is written once, on the card
            cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\n    {entry.provenance()}\n"
        return build

    return decorator


def get_loss(name: str, **overrides: Any) -> PolicyLoss:
    """The preset loss ``name`` with keyword overrides (the field's standard names).

    Args:
        name: one of :func:`list_losses`.
        **overrides: loss options, e.g. ``epsilon_high=0.28``, ``beta=0.04``, ``aggregation="token-mean"``,
            ``importance_sampling_level="sequence"``, ``max_completion_length=256``.

    Raises:
        UnknownNameError: unknown preset (lists the presets) or unknown option (lists the valid options).
        ValueError: an invalid option value (names the option and the valid range or choices).

    Example:
        >>> import rlzoo
        >>> rlzoo.get_loss("dapo").surrogate.epsilon_high
        0.28
        >>> rlzoo.get_loss("dapo", epsilon_high=0.3).surrogate.epsilon_high
        0.3
    """
    card = presets.get(name)  # case-insensitive: "DAPO" is dapo
    loss = dataclasses.replace(card.build(), name=card.name)
    return loss.with_options(**overrides)


def list_losses() -> list[str]:
    """Sorted names of the registered presets."""
    return presets.names()


def algorithms_markdown() -> str:
    """docs/algorithms.md, rendered from the registry (a test checks the committed file for drift)."""
    out = [
        "# Algorithms",
        "",
        "Generated from the preset registry by `rlzoo explain --all --markdown > docs/algorithms.md`;",
        "a test fails when this file and the registry disagree. Every preset is a composition of parts",
        "(see [composing.md](composing.md)); any option can be overridden: `rlzoo.get_loss(name, **options)`.",
        "",
        "Each preset's picture is `rlzoo plot NAME`: its per-token objective and the gradient with respect to",
        "log pi as functions of the ratio r, for A > 0 and A < 0, computed by calling the loss with autograd on",
        "one-token batches (conventions: `rlzoo.losses.pictures`). Regenerate them all with",
        "`rlzoo plot --all --output-dir docs/pictures --dpi 72`; a test checks that every preset has one and",
        "that it shows the preset as it is now (each PNG stores the options of the loss it draws).",
        "",
        "| preset | method | paper |",
        "|---|---|---|",
    ]
    for name, p in presets.items():
        link = f"[arXiv:{p.arxiv}](https://arxiv.org/abs/{p.arxiv})" if p.arxiv else "-"
        out.append(f"| [`{name}`](#{name}) | {p.title} | {link} |")
    for p in presets.values():
        out += ["", p.markdown()]
    return "\n".join(out) + "\n"
