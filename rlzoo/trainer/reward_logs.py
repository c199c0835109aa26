"""What reward functions log while a :class:`~rlzoo.trainer.rewards.RewardSet` scores a generation batch, with TRL
1.16's ``log_extra`` and ``log_metric``, and the checks that keep them from misaligning the completions table or
replacing the trainer's own metrics.

``log_extra(column, values)``: adds a column to the completions table (``--log-completions``), one value per
completion (a function may log a column in several calls, as TRL extends it; another count is an error naming
the function, the column and the counts, where TRL would misalign the table); when several functions log the
same column the last one logged is kept, as TRL keeps it (a warning when the values differ);
``log_metric(name, value)``: a scalar averaged over the step and logged with the step's metrics. A name the
trainer writes in the step's row itself (``step``, ``loss``, ``reward``, ``rewards/NAME/mean``, ``kl``,
``eval/...``: every key of the row, checked when the row is assembled, plus ``step`` and ``eval/*`` when logged)
is an error naming the function and the metric, where TRL would average it into its own metric or overwrite it
(prefix the name, e.g. ``FUNCTION/loss``).

:class:`RewardLogs` is the base of :class:`~rlzoo.trainer.rewards.RewardSet`, which gives each reward function it calls
its own ``log_extra`` / ``log_metric`` (:meth:`RewardLogs._extra_logger`, :meth:`RewardLogs._metric_logger`) so that
errors name the function.
"""

import collections
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from rlzoo.trainer.distributed import ONE_PROCESS, Distributed
from rlzoo.trainer.reward_functions import RewardFunctionError

log = logging.getLogger("rlzoo.train")

__all__ = ["MetricNameError", "RewardLogs"]


class MetricNameError(RewardFunctionError):
    """A ``log_metric`` name the trainer keeps for itself; raised inside the reward function's call and passed on as
    it is (it names the function already)."""


def _who(functions: Sequence[str]) -> str:
    """``reward function 'f'``, ``reward functions 'f' and 'g'``, or ``a reward function`` when none is known."""
    if not functions:
        return "a reward function"
    return f"reward function{'s' if len(functions) > 1 else ''} {' and '.join(map(repr, functions))}"


def _always_reserved(name: str) -> bool:
    """Whether metric ``name`` is the trainer's in every row: ``step``, and ``eval/*`` (the evaluation's, joined
    after the reward metrics)."""
    return name == "step" or name.startswith("eval/")


def _reserved_because(name: str) -> str:
    """Why metric ``name`` is the trainer's (for :func:`_clash`)."""
    if name.startswith("eval/"):
        return "the held-out evaluation writes eval/* in the step's row"
    return "the trainer writes it in every row" if name == "step" else "the trainer writes it in the step's row"


def _clash(name: str, functions: Sequence[str], why: str) -> str:
    """The one-line error of metric ``name``, one of the trainer's, logged by ``functions``."""
    rename = f"{functions[0] if functions else 'FUNCTION'}/{name}"
    return f"{_who(functions)} logged the metric {name!r} with log_metric, but {why}: log it under another name, " \
           f"e.g. {rename!r}"


class RewardLogs:
    """The ``log_extra`` columns and ``log_metric`` values logged by reward functions since they were last taken.

    Attributes:
        extra_columns: what the functions logged with ``log_extra`` since :meth:`take_extra` or :meth:`take_logged`
            (column -> values).
        table_columns: the completions table's own columns, which a ``log_extra`` column may not replace (set by the
            trainer when it writes the table; empty: none).
    """

    def __init__(self) -> None:
        self.extra_columns: dict[str, list[Any]] = collections.defaultdict(list)
        self.table_columns: frozenset[str] = frozenset()
        self._extra_rows = 0  # completions scored since the extra columns were last taken (aligns the columns)
        self._warned_extra: set[tuple[str, tuple[str, ...]]] = set()
        self._metrics: dict[str, list[float]] = collections.defaultdict(list)
        self._metric_owners: dict[str, dict[str, None]] = {}  # metric -> the functions that logged it (names)
        self._taken_owners: dict[str, dict[str, None]] = {}  # those of the metrics take_logged returned last

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """TRL's ``log_extra``: add ``values`` (one per completion) to the completions table's ``column``.

        Reward functions called by the set get a ``log_extra`` of their own that checks the count (see
        :meth:`RewardSet.__call__ <rlzoo.trainer.rewards.RewardSet.__call__>`); this one, for calls outside of the set's, appends as given."""
        self.extra_columns[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar, averaged over the values logged before :meth:`take_logged`.

        Reward functions called by the set get a ``log_metric`` of their own that names them in its errors (see
        :meth:`RewardSet.__call__ <rlzoo.trainer.rewards.RewardSet.__call__>`); this one is for calls outside of the set's.

        Raises:
            RewardFunctionError: ``name`` is not a string, or ``step`` or ``eval/*``, the trainer's (its other
                names, those of the step's row, are refused when the row is assembled: :meth:`add_logged`).
        """
        self._log_metric(name, value, None)

    def _log_metric(self, name: str, value: float, function: str | None) -> None:
        """Record ``value`` for metric ``name``, logged by reward function ``function`` (None: unknown).

        Raises:
            RewardFunctionError: see :meth:`log_metric` (names ``function``).
        """
        functions = (function,) if function is not None else ()
        if not isinstance(name, str):
            raise MetricNameError(f"{_who(functions)} logged a metric named {name!r} ({type(name).__name__}) with "
                                   "log_metric; a metric's name is a string")
        if _always_reserved(name):
            raise MetricNameError(_clash(name, functions, _reserved_because(name)))
        self._metrics[name].append(float(value))
        if function is not None:
            self._metric_owners.setdefault(name, {})[function] = None

    def _metric_logger(self, function: str) -> Callable[[str, float], None]:
        """The ``log_metric`` given to reward function ``function``: :meth:`log_metric`, naming it in errors."""

        def log_metric(name: str, value: float) -> None:
            self._log_metric(name, value, function)

        return log_metric

    def add_logged(self, row: Mapping[str, Any], metrics: Mapping[str, float]) -> dict[str, Any]:
        """``row`` with the ``log_metric`` ``metrics`` of :meth:`take_logged` added, refusing a metric that would
        replace one of the trainer's own: a key of ``row`` (the step's metrics: ``loss``, ``reward``, ``kl``...),
        ``step`` or ``eval/*`` (the held-out evaluation's, joined later). TRL 1.16 would average such a value into
        its own metric of that name, or overwrite it (``loss``); the error is raised before the row is written.

        Raises:
            RewardFunctionError: a metric named as one of the trainer's (names it and the functions that logged it,
                and says to rename it).
        """
        for name in metrics:
            if name in row or _always_reserved(name):
                owners = tuple(self._taken_owners.get(name, ()))
                raise RewardFunctionError(_clash(name, owners, _reserved_because(name)))
        return {**row, **metrics}

    def refuse_names(self, metrics: Mapping[str, float], reserved: Collection[str], why: str) -> None:
        """Refuse a metric of the last :meth:`take_logged` named as one of ``reserved`` (``why``: whose name it is).

        Raises:
            RewardFunctionError: names the metric, the functions that logged it, and says to rename it.
        """
        for name in metrics:
            if name in reserved:
                raise RewardFunctionError(_clash(name, tuple(self._taken_owners.get(name, ())), why))

    def take_extra(self) -> dict[str, list[Any]]:
        """The ``log_extra`` columns logged since the last call (or :meth:`take_logged`), which forgets them (so that
        the trainer can attach each call's values to the completions it scored)."""
        extra = dict(self.extra_columns)
        self.extra_columns.clear()
        self._extra_rows = 0
        return extra

    def _extra_logger(self, name: str, logged: dict[str, dict[str, list[Any]]]) -> Callable[[str, Iterable[Any]], None]:
        """The ``log_extra`` given to reward function ``name`` in one call: collects its values per column in
        ``logged`` (column -> function -> values; the function that logged a column last comes last), extending
        them when it logs a column again, as TRL's ``_log_completion_extra``."""

        def log_extra(column: str, values: Iterable[Any]) -> None:
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise RewardFunctionError(f"reward function {name!r} logged {type(values).__name__} for column "
                                          f"{column!r} with log_extra; expected a list, one value per completion")
            by_function = logged.setdefault(column, {})
            by_function[name] = [*by_function.pop(name, []), *values]

        return log_extra

    def _record_extra(self, logged: Mapping[str, Mapping[str, list[Any]]], n: int) -> None:
        """Add one call's ``log_extra`` columns (``n`` completions) to :attr:`extra_columns`, aligned: a column not
        logged by this call (or only by later ones) is None for its completions.

        As TRL 1.16 (``_log_completion_extra`` extends the batch's list; the table keeps the generation batch's last
        values), a column several functions logged keeps the values of the one that logged it last (a warning,
        once, when their values differ). A count other than ``n`` is an error, where TRL would misalign the table.

        Raises:
            RewardFunctionError: a function logged a column with a count other than ``n`` (names it, the column and
                both counts), or one of :attr:`table_columns` (TRL replaces the table's own column).
        """
        for column, by_function in logged.items():
            for name, values in by_function.items():
                if column in self.table_columns:
                    raise RewardFunctionError(
                        f"reward function {name!r} logged the column {column!r} with log_extra, one of the completions "
                        f"table's own ({', '.join(sorted(self.table_columns))}), which it would replace: log it under "
                        f"another name, e.g. {f'{name}/{column}'!r}")
                if len(values) != n:
                    raise RewardFunctionError(
                        f"reward function {name!r} logged {len(values)} values for column {column!r} with log_extra, "
                        f"but {n} completions were scored (one value per completion; TRL would misalign the "
                        "completions table)")
        for column, by_function in logged.items():
            names = tuple(by_function)
            if len(names) > 1 and (column, names) not in self._warned_extra:
                first = next(iter(by_function.values()))
                try:
                    same = all(bool(values == first) for values in by_function.values())
                except (ValueError, TypeError):  # values whose == is not a bool (arrays)
                    same = False
                if not same:
                    self._warned_extra.add((column, names))
                    log.warning("reward functions %s all log the column %r with log_extra; the completions table "
                                "keeps the values of %r (the last logged, as TRL)", ", ".join(map(repr, names)), column,
                                names[-1])
        for column in [*self.extra_columns, *(c for c in logged if c not in self.extra_columns)]:
            values = list(logged[column].values())[-1] if column in logged else [None] * n
            self.extra_columns[column] = [*self.extra_columns.get(column, [None] * self._extra_rows), *values]
        self._extra_rows += n

    def take_logged(self, dist: Distributed = ONE_PROCESS) -> tuple[dict[str, float], dict[str, list[Any]]]:
        """The metrics and extra columns logged since the last call, which forgets them. A metric is the mean of every
        value logged for it on every rank of ``dist`` (TRL 1.16 ``GRPOTrainer._generate_and_score_completions``: the
        values' sum over the processes divided by their count; one all-gather); extra columns are this rank's."""
        sums = {name: (sum(v), len(v)) for name, v in self._metrics.items() if v}
        if dist.enabled:  # a metric some ranks did not log counts their values only
            merged: dict[str, tuple[float, int]] = {}
            gathered = dist.all_gather_object((sums, {k: list(v) for k, v in self._metric_owners.items()}))
            for rank_sums, owners in gathered:
                for name, (total, count) in rank_sums.items():
                    before = merged.get(name, (0.0, 0))
                    merged[name] = (before[0] + total, before[1] + count)
                for name, functions in owners.items():  # so that every rank's error names them alike
                    self._metric_owners.setdefault(name, {}).update(dict.fromkeys(functions))
            sums = merged
        self._metrics.clear()
        self._taken_owners, self._metric_owners = self._metric_owners, {}  # an error names this round's functions
        return {name: total / count for name, (total, count) in sums.items()}, self.take_extra()
