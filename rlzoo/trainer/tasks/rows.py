"""Row checks of a data set task: every row's prompt and answer, looked at before training starts.

A row with a missing or empty prompt or answer, or a prompt in neither of TRL's formats, used to fail only when
the training stream reached it (after some steps, and again at the same row after a resume). :func:`check_rows`
looks at every row of a ``datasets.Dataset`` at once (column by column, in Arrow batches) and refuses the first bad
one, naming it as the data file numbers it (:class:`RowOrigin`: the file, its 0-based row, the line of a JSON
lines or CSV file, and whether the value is absent, null, empty or a CSV cell that pandas reads as missing). A
stream (``IterableDataset``) is checked row by row as it is read (:func:`row_problem`).
"""

import csv
import dataclasses
import decimal
import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["RowOrigin", "check_rows", "content_digest", "row_problem"]

_BATCH = 8192
"""Rows per Arrow batch in :func:`check_rows`."""


@dataclasses.dataclass(frozen=True)
class RowOrigin:
    """Where a data set's rows come from, so that an error names the row as its source numbers it.

    Attributes:
        label: what holds the rows, as errors name it (``task file 'd.jsonl'``, ``data set 'dir' split 'test'``,
            ``train_dataset``).
        path: the data file the rows were read from, or None; the raw text of a ``.jsonl`` / ``.json`` / ``.csv``
            file tells an absent value from a null or empty one and gives the line.
        ranges: the rows of the file or split that the data set holds, in order (a split slice such as
            ``train[:10]``); None: all of them, from row 0.
    """

    label: str
    path: str | None = None
    ranges: tuple[range, ...] | None = None

    def source_row(self, position: int) -> int:
        """The 0-based row of the file or split at ``position`` in the data set."""
        if self.ranges is None:
            return position
        offset = position
        for part in self.ranges:
            if offset < len(part):
                return part[offset]
            offset -= len(part)
        raise IndexError(f"position {position} is past the {sum(map(len, self.ranges))} rows of {self.label}")

    def where(self, position: int) -> str:
        """``LABEL row N`` (0-based, as the file or split numbers it), with ``(line L)`` for JSON lines and CSV."""
        row = self.source_row(position)
        line = self._raw(row)[0]
        return f"{self.label} row {row}" + (f" (line {line})" if line else "")

    def missing(self, position: int, column: str) -> str:
        """What a null value of ``column`` at ``position`` is in the file: absent, null, an empty CSV cell, or a
        CSV cell that pandas reads as missing."""
        _, raw = self._raw(self.source_row(position))
        if isinstance(raw, dict):
            if column not in raw:
                return f"missing (the row has no {column!r} key)"
            if raw[column] is None:
                return "missing (null)"
        if isinstance(raw, list) and self.path is not None:  # a CSV record: header, then cells
            header, cells = raw
            if column in header and header.index(column) < len(cells):
                cell = cells[header.index(column)]
                if not cell.strip():
                    return "empty (an empty cell)"
                return (f"{cell!r}, which the CSV reader (pandas) reads as missing (a .jsonl or .parquet file keeps "
                        "such a value as text)")
        return "missing (null)"

    def _raw(self, row: int) -> tuple[int | None, Any]:
        """The line and the raw record of ``row`` in a JSON lines, JSON or CSV data file: ``(line, dict)`` for JSON,
        ``(line, [header, cells])`` for CSV; ``(None, None)`` when there is no such file or it cannot be read."""
        if self.path is None:
            return None, None
        path = Path(self.path)
        suffix = path.suffix.lower()
        try:
            text = path.read_text(encoding="utf-8")
            if suffix in (".csv", ".tsv"):
                return _csv_record(text, row, "\t" if suffix == ".tsv" else ",")
            if suffix == ".json":
                try:
                    whole = json.loads(text)
                except json.JSONDecodeError:
                    whole = None  # JSON lines in a .json file
                if isinstance(whole, list):
                    return None, whole[row] if row < len(whole) else None
                if whole is not None:
                    return None, None
            if suffix in (".jsonl", ".json"):
                lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
                if row < len(lines):
                    return lines[row][0], json.loads(lines[row][1])
        except (OSError, ValueError, csv.Error):
            pass
        return None, None


def _csv_record(text: str, row: int, delimiter: str = ",") -> tuple[int | None, Any]:
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter)
    header: list[str] | None = None
    seen = 0
    for cells in reader:
        if not any(cell.strip() for cell in cells):  # pandas skips blank lines
            continue
        if header is None:
            header = cells
            continue
        if seen == row:
            return reader.line_num, [header, cells]
        seen += 1
    return None, None


def _prompt_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return None if value.strip() else "empty"
    if (isinstance(value, list) and value
            and all(isinstance(m, Mapping) and m.get("role") is not None
                    and (m.get("content") is not None or m.get("tool_calls"))  # a tool call's turn: no content
                    for m in value)):
        last = value[-1]["role"]  # what render_prompt continues or answers (it refused others, naming no row)
        return None if last in ("user", "tool", "assistant") else (
            f"a conversation whose last message's role is {last!r}, not user, tool or assistant")
    return f"{value!r:.100} ({type(value).__name__})"


def _answer_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return None if value.strip() else "empty"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (bool, int, float, decimal.Decimal)):
        return None
    return _not_scalar(value)


def _not_scalar(value: Any) -> str:
    return f"a {type(value).__name__} ({value!r:.80})"  # "a ...": describe() gives the non-scalar answer's fix


def _is_scalar(kind: Any) -> bool:
    """Whether an Arrow type holds answers the scorer compares as text: strings, numbers and bools (their
    ``str``: ``normalized_match`` compares numbers as numbers and casefolds ``True`` to ``true``)."""
    import pyarrow as pa

    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer,
                                       pa.types.is_floating, pa.types.is_boolean, pa.types.is_decimal,
                                       pa.types.is_null))


def row_problem(row: Mapping[str, Any], prompt_column: str, answer_column: str | None) -> tuple[str, str] | None:
    """What is wrong with one row, as ``(column, what)`` (None: nothing): a prompt that is missing, empty or in
    neither of TRL's formats; an answer that is missing, empty, NaN or not a string, number or bool (a list, a
    dict, ...)."""
    checks = [(prompt_column, _prompt_problem)]
    if answer_column is not None:
        checks.append((answer_column, _answer_problem))
    for column, problem_of in checks:
        value = row.get(column)
        problem = "missing (null)" if value is None else problem_of(value)
        if problem:
            return column, problem
    return None


def describe(column: str, prompt_column: str, what: str) -> str:
    """The error text for ``column`` being ``what`` (a problem of :func:`row_problem`), with what to do."""
    if column == prompt_column:
        return (f"the prompt column {column!r} is {what}; every row needs a prompt: a string or a list of "
                "{'role', 'content'} messages: fix or remove the row")
    if what.startswith("a "):  # a list, a dict, ...: the column's type
        return (f"the answer column {column!r} holds {what}, not a string, a number or a bool: the accuracy compares "
                "one answer text with the completion's, and this one would be its Python text, which no completion "
                "matches; keep one answer per row (e.g. Dataset.map) or choose another --task.answer_column")
    return (f"the answer column {column!r} is {what}; every row needs an answer (a string, a number or a bool) for "
            "the accuracy: fix or remove the row")


def check_rows(data: Any, origin: RowOrigin, *, prompt_column: str, answer_column: str | None,
               limit: int | None = None) -> None:
    """Refuse the first of ``data``'s rows (its first ``limit``; None: all) whose prompt or answer cannot be used.

    Args:
        data: a ``datasets.Dataset``.
        origin: where its rows come from (names the row in the error).
        prompt_column, answer_column: the columns (``answer_column`` None: prompts only).
        limit: check only the first rows (a held-out set's).

    Raises:
        ValueError: ``ORIGIN row N (line L): the prompt|answer column 'C' is WHAT; ...``: missing (absent, null, a
            CSV cell read as missing), empty, NaN, a prompt in neither of TRL's formats, or an answer that is a
            list, a dict or another value that is not a string, a number or a bool (named with its type).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    columns = [c for c in (prompt_column, answer_column) if c is not None]
    position = 0
    for batch in data.select_columns(columns).with_format("arrow").iter(batch_size=_BATCH):
        bad: list[tuple[int, str, str]] = []
        for column in columns:
            values = batch.column(column)
            kind = values.type
            json_type = getattr(pa, "JsonType", ())
            messages_of_json = pa.types.is_list(kind) and isinstance(kind.value_type, json_type)  # tool calls
            if isinstance(kind, json_type) or messages_of_json:  # mixed types (datasets' Json): checked decoded
                problem_of = _answer_problem if column == answer_column else _prompt_problem
                decoded = [None if v is None else [json.loads(m) for m in v] if messages_of_json else json.loads(v)
                           for v in values.to_pylist()]
                first = next((i for i, v in enumerate(decoded) if v is None or problem_of(v)), -1)
                if first >= 0:
                    bad.append((first, column, "" if decoded[first] is None else str(problem_of(decoded[first]))))
                continue
            if column == answer_column and not _is_scalar(kind):
                present = pc.index(pc.is_valid(values), True).as_py()
                if present >= 0:  # Arrow columns have one type: every row's answer is one of these
                    value = values[present].as_py()
                    bad.append((present, column, _not_scalar(value)))
                    continue
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                blank = pc.or_kleene(pc.is_null(values), pc.equal(pc.utf8_trim_whitespace(values), ""))
            elif pa.types.is_floating(kind):
                blank = pc.or_kleene(pc.is_null(values), pc.is_nan(values))
            elif column == answer_column:
                blank = pc.is_null(values)
            else:  # a prompt of chat messages: the rule in Python
                first = next((i for i, v in enumerate(values.to_pylist()) if v is None or _prompt_problem(v)), -1)
                if first >= 0:
                    value = values[first].as_py()
                    bad.append((first, column, "" if value is None else str(_prompt_problem(value))))
                continue
            first = pc.index(pc.fill_null(blank, True), True).as_py()
            if first >= 0:
                value = values[first].as_py()
                what = "" if value is None else ("NaN" if isinstance(value, float) else "empty")
                bad.append((first, column, what))
        if bad:
            index, column, what = min(bad)
            row = position + index
            what = what or origin.missing(row, column)
            raise ValueError(f"{origin.where(row)}: {describe(column, prompt_column, what)}")
        position += batch.num_rows


def content_digest(data: Any) -> str:
    """A digest of a ``datasets.Dataset``'s rows: every column's values in row order, independent of how they are
    stored (Arrow chunks, an indices mapping of ``select`` / ``shuffle``, the schema's metadata), so that a resume
    notices data that changed under a run. About 0.1 s per million short rows (Arrow IPC of each batch)."""
    import pyarrow as pa

    digest = hashlib.sha256()
    for batch in data.with_format("arrow").iter(batch_size=_BATCH):
        table = batch.combine_chunks()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema.remove_metadata()) as writer:
            writer.write_table(table)
        digest.update(sink.getvalue())
    return digest.hexdigest()[:16]
