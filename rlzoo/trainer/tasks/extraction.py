"""Answer extraction: how a completion becomes the answer string a task's scorer sees, and the file tasks' scorer."""

import decimal
import re
from typing import Final

from rlzoo.registry import UnknownNameError, close_names

__all__ = ["DEFAULT_EXTRACTION", "EXTRACTIONS", "check_extraction", "extract_answer", "normalized_match"]

EXTRACTIONS: Final[tuple[str, ...]] = ("full", "first_line", "first_number", "last_number", "tag")
"""Ways to turn a completion into an answer string (:func:`extract_answer`)."""
DEFAULT_EXTRACTION: Final[str] = "last_number"
"""The default extraction. SmolLM2-135M-Instruct answers chain_sum in a sentence ("The final answer to this
arithmetic problem is 15."), so ``full`` scores ~0 (reasoning-gym's partial credit: mean 0.013 on 200
held-out 2-term 1-digit problems, greedy) while ``last_number`` gives 40.0 %: a learnable reward. The last
number rather than the first: worked answers end with the result ("5 - 9 = -4")."""


def check_extraction(extraction: object, field: str = "answer_extraction") -> None:
    """Refuse an unknown answer extraction, named as ``field``, with a did-you-mean and the valid names.

    Raises:
        UnknownNameError: ``extraction`` is not one of :data:`EXTRACTIONS`.

    Example:
        >>> check_extraction("lastnumber")
        Traceback (most recent call last):
        ...
        rlzoo.registry.UnknownNameError: unknown answer_extraction 'lastnumber'; did you mean 'last_number'?; valid: \
full, first_line, first_number, last_number, tag
    """
    if extraction in EXTRACTIONS:
        return
    close = close_names(extraction, EXTRACTIONS, n=2, cutoff=0.75) if isinstance(extraction, str) else []
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise UnknownNameError(f"unknown {field} {extraction!r}{hint}; valid: {', '.join(EXTRACTIONS)}")


_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?=\.|$|e)")  # "1,000" and "-12,345.5": the commas are grouping
_NUMBER = re.compile(r"(?:(?<![\w)\]])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


def extract_answer(completion: str, extraction: str = DEFAULT_EXTRACTION) -> str | None:
    """The answer string that a completion gives, or None when it gives none.

    Args:
        completion: decoded completion text (special tokens already removed, as TRL decodes).
        extraction: one of :data:`EXTRACTIONS`:

            - ``full``: the whole completion, whitespace stripped (None if empty);
            - ``first_line``: the first non-blank line, stripped;
            - ``first_number`` / ``last_number``: the first / last number: optional sign (only when not
              preceded by a word character, so ``4-1`` is ``4`` and ``1``), digits with optional thousands
              commas, optional decimals and exponent;
            - ``tag``: the content of the last ``<answer>...</answer>`` (reasoning_gym.utils.extract_answer).

    Raises:
        UnknownNameError: unknown ``extraction`` (lists the valid ones).

    Example:
        >>> extract_answer("The answer is -4. Check: 5 - 9 = -4", "first_number")
        '-4'
        >>> extract_answer("<think>5-9</think> <answer> -4 </answer>", "tag")
        '-4'
        >>> extract_answer("  7\\n", "full")
        '7'
    """
    if extraction == "full":
        return completion.strip() or None
    if extraction == "first_line":
        return next((line.strip() for line in completion.splitlines() if line.strip()), None)
    if extraction in ("first_number", "last_number"):
        numbers = _NUMBER.findall(completion)
        if not numbers:
            return None
        return numbers[0] if extraction == "first_number" else numbers[-1]
    if extraction == "tag":
        from reasoning_gym.utils import extract_answer as rg_extract_answer

        return rg_extract_answer(completion, tag_name="answer", strip=True)
    check_extraction(extraction, "answer extraction")
    raise AssertionError(extraction)  # pragma: no cover (every extraction is handled above)


def normalized_match(answer: str | None, reference: str) -> float:
    """1.0 if ``answer`` equals ``reference`` after normalisation, else 0.0 (the JSONL tasks' scorer).

    Normalisation: strip, collapse runs of whitespace to one space, casefold; if both sides then parse as
    decimal numbers (thousands commas removed where they group digits by three, a trailing period allowed) they are
    compared as numbers (``"1,000.0" == "1000"``, ``"+3" == "3"``; ``"3,4"`` is no number). None or empty answers
    score 0.

    Example:
        >>> normalized_match(" Paris ", "paris"), normalized_match("1,000.0", "1000")
        (1.0, 1.0)
        >>> normalized_match(None, "1"), normalized_match("-4", "4"), normalized_match("3,4", "34")
        (0.0, 0.0, 0.0)
    """
    if answer is None:
        return 0.0
    a, b = (" ".join(s.split()).casefold() for s in (answer, reference))
    if not a:
        return 0.0
    if a == b:
        return 1.0
    x, y = (_THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s).rstrip(".") for s in (a, b))
    try:
        return float(decimal.Decimal(x) == decimal.Decimal(y))
    except (decimal.InvalidOperation, ValueError):  # "3,4" is no number: not "34"
        return 0.0

