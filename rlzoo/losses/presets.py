"""Presets: named compositions of parts with their paper's defaults (``rlzoo.get_loss(name, **overrides)``).

Each preset is a function returning a :class:`~rlzoo.losses.PolicyLoss`, registered with its card (paper,
arXiv id, reference implementations, recommended advantage estimator). The function's docstring is the
card's formula; ``rlzoo explain NAME`` prints the card and docs/algorithms.md is generated from them.
"""

import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rlzoo.losses.penalty import KLPenalty
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.ratio import GeometricRatio, SequenceRatio, SequenceTokenRatio
from rlzoo.losses.surrogate import (
    CISPO,
    DRO,
    GMPO,
    SAPO,
    VESPO,
    ClipCov,
    DPPOBinaryKL,
    DPPOBinaryTV,
    KLCov,
    PPOClip,
    Reinforce,
)
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

    @property
    def formula(self) -> str:
        """The objective, from the build function's docstring."""
        return inspect.cleandoc(self.build.__doc__ or "")

    def card(self) -> str:
        """Plain-text card printed by ``rlzoo explain``."""
        loss = self.build()
        lines = [
            f"{self.name}: {self.title}",
            f"paper:     {self.paper}" + (f" (arXiv:{self.arxiv})" if self.arxiv else ""),
            f"matches:   {self.matches}",
            f"advantage: {self.advantage}" + (f" {dict(self.advantage_options)}" if self.advantage_options else ""),
            "",
            self.formula,
            "",
            "components (defaults):",
            textwrap.indent(loss.describe(), "  "),
        ]
        required = sorted(loss.required_fields())
        lines.append("needs:     logprobs, advantages, completion_mask" + "".join(f", {f}" for f in required))
        if self.notes:
            lines += ["", "notes: " + self.notes]
        return "\n".join(lines)


presets: Registry[Preset] = Registry("loss preset")


def preset(name: str, **card: Any) -> Callable[[Callable[[], PolicyLoss]], Callable[[], PolicyLoss]]:
    """Decorator registering a zero-argument loss builder as preset ``name`` with its card fields.

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
        presets.register(name)(Preset(name=name, build=build, **card))
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


def _ppo_clip(**kw: Any) -> PPOClip:
    return PPOClip(**kw)


# ------------------------------------------------------------------------------------------------ presets
@preset(
    "ppo",
    title="Proximal Policy Optimization (clipped surrogate)",
    paper="Schulman et al. 2017, Proximal Policy Optimization Algorithms",
    arxiv="1707.06347",
    matches="verl loss_mode='vanilla' with loss_agg_mode='token-mean' (verl also applies dual clip c=3: "
    "pass dual_clip=3.0); TRL PPOTrainer's policy term",
    advantage="grpo",
    notes="The paper pairs PPO with GAE from a learned critic (rlzoo.get_advantage('gae') and "
    "rlzoo.advantages.value_loss); rlzoo's trainer has no critic, so it uses group-normalised advantages.",
)
def ppo() -> PolicyLoss:
    r"""loss = -min(w A, clip(w, 1 - eps_low, 1 + eps_high) A), token ratio w, token-mean.

    Defaults: eps_low = eps_high = 0.2, no dual clip (dual_clip=None), no delta cap, no KL term (beta = 0).
    """
    return PolicyLoss(surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.2), aggregation="token-mean")


@preset(
    "grpo",
    title="Group Relative Policy Optimization",
    paper="Shao et al. 2024, DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    arxiv="2402.03300",
    matches="TRL 1.16 loss_type='grpo' (beta=0.04); verl adv_estimator='grpo', loss_agg_mode='seq-mean-token-mean', "
    "use_kl_loss=True, kl_loss_type='k3' (verl's 'low_var_kl' also clamps k3)",
    advantage="grpo",
    notes="Paper eq. (3): per-sequence token mean, then mean over the group; KL (k3) in the loss with beta=0.04.",
)
def grpo() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t [ -min(w A, clip(w, 1-eps, 1+eps) A) + beta * k3 ], eps = 0.2."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.2),
        aggregation="seq-mean-token-mean",
        penalties=(KLPenalty(beta=0.04, kl_estimator="k3"),),
    )


@preset(
    "bnpo",
    title="GRPO clip with batch token-level normalisation (TRL's loss_type='bnpo')",
    paper="TRL's 'batch-normalised per-token' GRPO loss (token-level normalisation as in DAPO sec. 3.3)",
    arxiv=None,
    matches="TRL 1.16 loss_type='bnpo'; Liger 'bnpo'; verl loss_agg_mode='token-mean'",
    advantage="grpo",
    notes="Despite the name, unrelated to the BNPO paper (Xiao et al. 2025, arXiv:2506.02864, a Beta "
    "normalisation of advantages). TRL normalises by the active tokens of the local batch; with a Normalizer "
    "this is the token-mean of the optimizer-step batch, i.e. 'dapo' with epsilon_high=0.2.",
)
def bnpo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps, 1+eps) A) / N_tokens, eps = 0.2."""
    return PolicyLoss(surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.2), aggregation="token-mean")


@preset(
    "dr_grpo",
    title="Dr. GRPO (GRPO done right: no length or std normalisation)",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective",
    arxiv="2503.20783",
    matches="TRL 1.16 loss_type='dr_grpo' with scale_rewards='none'; verl loss_agg_mode='seq-mean-token-sum-norm' "
    "with loss_scale_factor=max_completion_length",
    advantage="dr_grpo",
    notes="Needs max_completion_length (the paper's constant MAX_TOKENS): get_loss('dr_grpo', max_completion_length=L).",
)
def dr_grpo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps, 1+eps) A) / (S * max_completion_length), A = r - mean_group(r)."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.2),
        aggregation="seq-mean-token-sum-norm",
    )


@preset(
    "dapo",
    title="Decoupled Clip and Dynamic sAmpling Policy Optimization",
    paper="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    arxiv="2503.14476",
    matches="TRL 1.16 loss_type='dapo', epsilon=0.2, epsilon_high=0.28; verl clip_ratio_low=0.2, "
    "clip_ratio_high=0.28, loss_agg_mode='token-mean'",
    advantage="grpo",
    notes="Dynamic sampling, overlong reward shaping and mask_truncated_completions are trainer options "
    "(rlzoo train --dynamic-sampling --overlong-buffer ...), not part of the loss.",
)
def dapo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps_low, 1+eps_high) A) / N_tokens, eps_low = 0.2, eps_high = 0.28 (sec. 3.1, 3.3)."""
    return PolicyLoss(surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.28), aggregation="token-mean")


@preset(
    "gspo",
    title="Group Sequence Policy Optimization",
    paper="Zheng et al. 2025, Group Sequence Policy Optimization",
    arxiv="2507.18071",
    matches="TRL 1.16 loss_type='grpo', importance_sampling_level='sequence', epsilon=3e-4, epsilon_high=4e-4; "
    "verl loss_mode='gspo' (which uses the GSPO-token ratio, see gspo_token)",
    advantage="grpo",
)
def gspo() -> PolicyLoss:
    r"""loss = (1/S) sum_i -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i), s_i = exp(mean_t log w_it), eps = (3e-4, 4e-4)."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=3e-4, epsilon_high=4e-4),
        ratio=SequenceRatio(),
        aggregation="seq-mean-token-mean",
    )


@preset(
    "gspo_token",
    title="GSPO-token (sequence ratio value, per-token gradient)",
    paper="Zheng et al. 2025, Group Sequence Policy Optimization (sec. 4.3)",
    arxiv="2507.18071",
    matches="verl loss_mode='gspo' (without its max=10 clamp on the log-ratio)",
    advantage="grpo",
)
def gspo_token() -> PolicyLoss:
    r"""As gspo with s_it = sg[s_i] * pi_theta(o_it) / sg[pi_theta(o_it)]: same value, per-token gradient."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=3e-4, epsilon_high=4e-4),
        ratio=SequenceTokenRatio(),
        aggregation="seq-mean-token-mean",
    )


@preset(
    "cispo",
    title="Clipped IS-weight Policy Optimization",
    paper="MiniMax 2025, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
    arxiv="2506.13585",
    matches="TRL 1.16 loss_type='cispo' with epsilon_high=5.0 (TRL's cap is absolute: 1 + epsilon_high here); "
    "verl loss_mode='cispo' with clip_ratio_low=1.0, clip_ratio_high=4.0",
    advantage="grpo",
    notes="The paper sets no lower bound and tunes only the upper one; the default clip(w, 0, 5) is TRL's "
    "recommendation for ScaleRL (Khatri et al. 2025, arXiv:2510.13786). verl's defaults (0.2/0.2) would clip to "
    "[0.8, 1.2].",
)
def cispo() -> PolicyLoss:
    r"""loss = sum_it -sg[clip(w, 1-eps_low, 1+eps_high)] A logp / N_tokens, eps_low = 1, eps_high = 4."""
    return PolicyLoss(surrogate=CISPO(epsilon_low=1.0, epsilon_high=4.0), aggregation="token-mean")


@preset(
    "sapo",
    title="Soft Adaptive Policy Optimization",
    paper="Gao et al. 2025, Soft Adaptive Policy Optimization",
    arxiv="2511.20347",
    matches="TRL 1.16 loss_type='sapo' (sapo_temperature_pos=1.0, sapo_temperature_neg=1.05); verl loss_mode='sapo'",
    advantage="grpo",
)
def sapo() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t -(4/tau) sigmoid(tau (w - 1)) A, tau = tau_pos (A > 0) or tau_neg.

    Defaults: tau_pos = 1.0, tau_neg = 1.05 (TRL's sapo_temperature_pos/neg), token ratio w.
    """
    return PolicyLoss(surrogate=SAPO(tau_pos=1.0, tau_neg=1.05), aggregation="seq-mean-token-mean")


@preset(
    "gpg",
    title="Group Policy Gradient (REINFORCE with group advantages)",
    paper="Chu et al. 2025, GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arxiv="2504.02546",
    matches="verl loss_mode='gpg', adv_estimator='gpg'",
    advantage="gpg",
)
def gpg() -> PolicyLoss:
    r"""loss = sum_it -A logp / N_tokens (no ratio, no clip)."""
    return PolicyLoss(surrogate=Reinforce(), aggregation="token-mean")


@preset(
    "gmpo",
    title="Geometric-Mean Policy Optimization",
    paper="Zhao et al. 2025, Geometric-Mean Policy Optimization",
    arxiv="2507.20673",
    matches="verl loss_mode='geo_mean' with clip_ratio_low=clip_ratio_high=0.4 (verl's default 0.2 is not the paper's)",
    advantage="grpo",
    notes="verl averages over the micro-batch's sequences, ignoring loss_agg_mode; here the aggregation is "
    "seq-mean-token-mean with a Normalizer, so micro-batch splits do not change the result.",
)
def gmpo() -> PolicyLoss:
    r"""loss = (1/S) sum_i -A_i exp(mean_t sgn(A) min(sgn(A) l_it, sgn(A) clip(l_it, -0.4, 0.4))), l = log w."""
    return PolicyLoss(
        surrogate=GMPO(),
        ratio=GeometricRatio(epsilon_low=0.4, epsilon_high=0.4),
        aggregation="seq-mean-token-mean",
    )


@preset(
    "clip_cov",
    title="Clip-Cov (entropy control by clipping high-covariance tokens)",
    paper="Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arxiv="2505.22617",
    matches="verl loss_mode='clip_cov' (clip_cov_ratio=2e-4, clip_cov_lb=1, clip_cov_ub=5)",
    advantage="grpo",
)
def clip_cov() -> PolicyLoss:
    r"""PPO clip loss with the loss of floor(r N) random tokens with lb < cov < ub set to 0; token-mean.

    Defaults: eps_low = eps_high = 0.2, r = clip_cov_ratio = 2e-4, lb = clip_cov_lb = 1, ub = clip_cov_ub = 5.
    """
    return PolicyLoss(surrogate=ClipCov(), aggregation="token-mean")


@preset(
    "kl_cov",
    title="KL-Cov (entropy control by a KL penalty on high-covariance tokens)",
    paper="Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arxiv="2505.22617",
    matches="verl loss_mode='kl_cov' (kl_cov_ratio=2e-4, ppo_kl_coef=1; verl's yaml ships 0.1)",
    advantage="grpo",
    notes="The paper uses k=2e-3 for Qwen2.5-7B and 2e-4 for 32B, with beta=1 (sec. 4.3).",
)
def kl_cov() -> PolicyLoss:
    r"""loss = -w A + ppo_kl_coef |log w| on the top-k covariance tokens; token-mean.

    Defaults: k = max(1, floor(kl_cov_ratio N)) with kl_cov_ratio = 2e-4, ppo_kl_coef = 1.
    """
    return PolicyLoss(surrogate=KLCov(), aggregation="token-mean")


@preset(
    "two_sided",
    title="INTELLECT-2 two-sided clipping (delta cap on the unclipped ratio)",
    paper="Prime Intellect Team 2025, INTELLECT-2: A Reasoning Model Trained Through Globally Decentralized RL",
    arxiv="2505.07291",
    matches="TRL 1.16 loss_type='grpo' with delta=4.0, beta=0.001",
    advantage="grpo",
    notes="delta=4, epsilon=0.2 and beta=0.001 as TRL's paper index reports from the paper's sec. 4.1; the "
    "paper's loss normalisation is unconfirmed, GRPO's per-sequence mean is used.",
)
def two_sided() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t [-min(min(w, delta) A, clip(w, 1-eps, 1+eps) A) + beta k3], delta = 4."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=0.2, epsilon_high=0.2, delta=4.0),
        aggregation="seq-mean-token-mean",
        penalties=(KLPenalty(beta=0.001, kl_estimator="k3"),),
    )


@preset(
    "luspo",
    title="Length-Unbiased Sequence Policy Optimization",
    paper="Liu et al. 2026, Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response "
    "Length Variation in RLVR",
    arxiv="2602.05261",
    matches="TRL 1.16 loss_type='luspo' with importance_sampling_level='sequence' (TRL's default epsilon 0.2 is "
    "about 100x the paper's)",
    advantage="grpo",
)
def luspo() -> PolicyLoss:
    r"""loss = (1/S) sum_i |o_i| * -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i) (eq. 7), eps = (2e-3, 2.5e-3)."""
    return PolicyLoss(
        surrogate=_ppo_clip(epsilon_low=2e-3, epsilon_high=2.5e-3),
        ratio=SequenceRatio(),
        aggregation="seq-mean-token-sum",
    )


@preset(
    "vespo",
    title="VESPO (gamma-weighted sequence-level soft IS)",
    paper="Shen et al. 2026, VESPO: Variational Sequence-level Soft Policy Optimization for (Stable) Off-Policy "
    "LLM Training",
    arxiv="2602.10693",
    matches="TRL 1.16 loss_type='vespo' (vespo_k_pos=2, vespo_lambda_pos=3, vespo_k_neg=3, vespo_lambda_neg=2)",
    advantage="grpo",
)
def vespo() -> PolicyLoss:
    r"""loss = sum_it -sg[phi(W_i)] A logp / N_tokens, phi(W) = e^lambda W^k e^(-lambda W) (eq. 17), W_i = prod_t w_it.

    Defaults: (k_pos, lambda_pos) = (2, 3) for A >= 0, (k_neg, lambda_neg) = (3, 2) for A < 0.
    """
    return PolicyLoss(surrogate=VESPO(), aggregation="token-mean")


@preset(
    "dppo_tv",
    title="Divergence PPO, binary total-variation trust region",
    paper="Qi et al. 2026, Rethinking the Trust Region in LLM Reinforcement Learning",
    arxiv="2602.04879",
    matches="verl loss_mode='dppo_tv' with clip_ratio_low=clip_ratio_high=0.15, clip_ratio_c=5, "
    "loss_agg_mode='seq-mean-token-sum-norm' (verl's recipe)",
    advantage="dr_grpo",
    notes="Thresholds and C=5 are the paper's (App. C, E); r and the divergence are meant w.r.t. the sampling "
    "policy: pass the sampler's log-probs as old_logprobs (verl's bypass_mode). Needs max_completion_length.",
)
def dppo_tv() -> PolicyLoss:
    r"""loss = -A sg[min(w, C)] logp * M_t (eq. 12-13), M_t = 0 where |p - p_old| > delta_TV in the direction of A.

    Defaults: delta_TV = epsilon_low = epsilon_high = 0.15, C = clip_ratio_c = 5; seq-mean-token-sum-norm.
    """
    return PolicyLoss(
        surrogate=DPPOBinaryTV(epsilon_low=0.15, epsilon_high=0.15, clip_ratio_c=5.0),
        aggregation="seq-mean-token-sum-norm",
    )


@preset(
    "dppo_kl",
    title="Divergence PPO, binary KL trust region",
    paper="Qi et al. 2026, Rethinking the Trust Region in LLM Reinforcement Learning",
    arxiv="2602.04879",
    matches="verl loss_mode='dppo_kl' with clip_ratio_low=clip_ratio_high=0.05, clip_ratio_c=5, "
    "loss_agg_mode='seq-mean-token-sum-norm' (verl's recipe)",
    advantage="dr_grpo",
    notes="As dppo_tv with the binary KL (eq. 14) and delta_KL = 0.05. Needs max_completion_length.",
)
def dppo_kl() -> PolicyLoss:
    r"""loss = -A sg[min(w, C)] logp * M_t (eq. 12, 14), M_t = 0 where binary KL(p_old, p) > delta_KL in the direction of A.

    Defaults: delta_KL = epsilon_low = epsilon_high = 0.05, C = clip_ratio_c = 5; seq-mean-token-sum-norm.
    """
    return PolicyLoss(
        surrogate=DPPOBinaryKL(epsilon_low=0.05, epsilon_high=0.05, clip_ratio_c=5.0),
        aggregation="seq-mean-token-sum-norm",
    )


@preset(
    "dro",
    title="DRO: REINFORCE with a quadratic log-ratio penalty",
    paper="Kimi Team 2025, Kimi k1.5: Scaling Reinforcement Learning with LLMs (sec. 2.3.2, the online "
    "mirror-descent surrogate); named after Richemond et al. 2024, arXiv:2405.19107",
    arxiv="2501.12599",
    matches="verl loss_mode='dro' (policy_loss.dro_beta); Tinker's 'dro' loss",
    advantage="grpo",
    notes="No paper value for dro_beta is confirmed; 0.05 is the verl/Tinker example value.",
)
def dro() -> PolicyLoss:
    r"""loss = sum_it -(A logp - dro_beta/2 (log w)^2) / N_tokens, log w = logp - logp_old."""
    return PolicyLoss(surrogate=DRO(dro_beta=0.05), aggregation="token-mean")


def algorithms_markdown() -> str:
    """docs/algorithms.md, rendered from the registry (a test checks the committed file for drift)."""
    out = [
        "# Algorithms",
        "",
        "Generated from the preset registry by `rlzoo explain --all --markdown > docs/algorithms.md`;",
        "a test fails when this file and the registry disagree. Every preset is a composition of parts",
        "(see [composing.md](composing.md)); any option can be overridden: `rlzoo.get_loss(name, **options)`.",
        "",
        "| preset | method | paper |",
        "|---|---|---|",
    ]
    for name, p in presets.items():
        link = f"[arXiv:{p.arxiv}](https://arxiv.org/abs/{p.arxiv})" if p.arxiv else "-"
        out.append(f"| [`{name}`](#{name.replace('_', '-')}) | {p.title} | {link} |")
    for name, p in presets.items():
        loss = p.build()
        out += [
            "",
            f"## {name}",
            "",
            f"**{p.title}.** {p.paper}" + (f", [arXiv:{p.arxiv}](https://arxiv.org/abs/{p.arxiv})" if p.arxiv else "") + ".",
            "",
            "```text",
            p.formula,
            "```",
            "",
            "Components and defaults:",
            "",
            "```text",
            loss.describe(),
            "```",
            "",
            f"- Matches: {p.matches}.",
            f"- Recommended advantage: `{p.advantage}`" + (f" {dict(p.advantage_options)}" if p.advantage_options else "") + ".",
            "- Needs: `logprobs`, `advantages`, `completion_mask`"
            + "".join(f", `{f}`" for f in sorted(loss.required_fields())) + ".",
        ]
        if p.notes:
            out.append(f"- Notes: {p.notes}")
    return "\n".join(out) + "\n"
