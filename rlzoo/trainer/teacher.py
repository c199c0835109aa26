"""The teacher of on-policy distillation: a second frozen model, scored at generation time like the reference
policy, whose log-probs of the student's sampled tokens become ``teacher_logprobs`` (``--teacher MODEL``).

The teacher scores the student's token ids, so both must share one tokenizer (the same vocabulary, token for
token); a teacher with another tokenizer is refused before training starts. Source: the teacher wiring of verl
0.9.1's distillation (``distillation.teacher_model``, same-tokenizer on-policy distillation), NeMo-RL and
prime-rl; the loss is ``rlzoo.get_loss("opd")`` (rlzoo/algorithms/opd.py).
"""

from typing import Any

import torch

__all__ = ["check_same_tokenizer", "check_teacher", "load_teacher"]


def check_same_tokenizer(teacher: str, teacher_tokenizer: Any, tokenizer: Any) -> None:
    """Refuse a teacher whose tokenizer maps any token differently from the policy's.

    Raises:
        ValueError: one line naming ``--teacher``, both vocabulary sizes and the first token that differs.
    """
    mine, theirs = tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if mine == theirs:
        return
    differing = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: (kv[1], kv[0]))
    token, index = differing[0]
    raise ValueError(
        f"--teacher {teacher}: its tokenizer differs from the policy's ({len(theirs)} vs {len(mine)} tokens; first "
        f"difference: {token!r} -> {index}); the teacher scores the student's token ids, so both must share one "
        "tokenizer"
    )


def load_teacher(teacher: str, *, tokenizer: Any, dtype: torch.dtype, device: torch.device,
                 vocab_size: int | None = None) -> torch.nn.Module:
    """Load ``teacher`` (any ``--model`` spec) frozen, in eval mode, after checking its tokenizer and its size.

    Args:
        teacher: a built-in name, path, ``.gguf`` file or hub id (:func:`rlzoo.trainer.models.load_model`).
        tokenizer: the policy's tokenizer.
        dtype, device: as the policy's parameters.
        vocab_size: the policy's output size (the token ids it can sample); None: not checked.

    Raises:
        ValueError: another tokenizer (:func:`check_same_tokenizer`), or fewer embedding or output rows than
            ``vocab_size`` (the teacher could not score every id the policy samples; a larger, padded one is fine);
            and the errors of ``load_model``.
    """
    from rlzoo.trainer.models import load_model

    model, teacher_tokenizer = load_model(teacher, dtype=dtype, device=device)
    check_same_tokenizer(teacher, teacher_tokenizer, tokenizer)
    heads = (model.get_input_embeddings(), model.get_output_embeddings())
    rows = min(h.weight.shape[0] for h in heads if getattr(h, "weight", None) is not None)
    if vocab_size is not None and rows < vocab_size:
        raise ValueError(f"--teacher {teacher}: its embeddings have {rows} rows, fewer than the policy's {vocab_size} "
                         "output tokens (padding rows included: the policy may sample any of them), so it cannot "
                         "score every token id the policy samples; give a teacher whose embeddings cover them")
    return model.eval().requires_grad_(False)


def check_teacher(teacher: str | None, needed: bool) -> None:
    """A teacher exactly when the loss uses teacher log-probs.

    Raises:
        ValueError: the loss needs ``teacher_logprobs`` without ``--teacher``, or ``--teacher`` with a loss that
            does not use them (names both ways to fix it).
    """
    if needed and teacher is None:
        raise ValueError("this loss needs teacher_logprobs (on-policy distillation): give --teacher MODEL, a frozen "
                         "model with the policy's tokenizer")
    if teacher is not None and not needed:
        raise ValueError(f"--teacher {teacher} is set but the loss does not use teacher_logprobs: use --algorithm opd "
                         "or --loss.distillation_loss_coef > 0, or drop --teacher")
