"""Loading a data set task's rows with ``datasets``: the training and held-out data sets that ``--task`` names, and
where their rows come from (for errors).

Sources (:func:`load_dataset_source`): a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.tsv`` / ``.parquet`` file, a directory
written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a directory laid out as a hub data set
repository (``data/train-*.parquet``, ...), or a hub data set id (``org/name``), which ``datasets`` downloads when
online and reads from its cache when ``HF_HUB_OFFLINE=1``. Splits are split names or ``datasets``' split syntax
(``train[:100]``); a file that cannot be read is named with its first bad line where one can be found.

:class:`~rlzoo.trainer.tasks.datasets_source.DatasetTask` makes the rows a task (and re-exports these names).
"""

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.tasks.rows import RowOrigin

__all__ = ["FILE_BUILDERS", "data_suffix", "is_dataset_spec", "load_dataset_rows", "load_dataset_source"]

log = logging.getLogger("rlzoo.train")

FILE_BUILDERS: Mapping[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv",
                                     ".parquet": "parquet"}
"""File suffix (any case) -> the ``datasets`` builder that reads it (``.tsv``: the csv builder, tab-separated)."""
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
"""Compressed text files ``datasets`` decompresses as it reads them (``d.jsonl.gz``)."""


def data_suffix(path: Path) -> str | None:
    """The suffix that names a data file's type, lower case (``.csv`` of ``d.CSV.gz``), or None."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if len(suffixes) == 2 and suffixes[1] in COMPRESSIONS and suffixes[0] != ".parquet":
        suffixes = suffixes[:1]
    return suffixes[-1] if suffixes else None


def file_builder(path: Path) -> str | None:
    """The ``datasets`` builder of a data file's name (``.jsonl``, ``.JSONL``, ``.csv.gz``...), or None."""
    suffix = data_suffix(path)
    return FILE_BUILDERS.get(suffix) if suffix else None


def is_dataset_spec(spec: str) -> bool:
    """Whether ``--task spec`` names a data set (a path, a data file name or a hub id) rather than a
    reasoning-gym task."""
    return Path(spec).exists() or file_builder(Path(spec)) is not None or "/" in spec


def _parquet_rows(path: Path) -> int | None:
    """The rows a parquet file's metadata declares; None when it cannot be read as parquet (the loader says why)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (OSError, pa.ArrowException):  # not parquet (or damaged): datasets' error names the file
        return None


def _refuse_mixed_types(directory: Path, spec: str) -> None:
    """Refuse a data directory whose files ``datasets`` would read (its split patterns: ``data/train-*``,
    ``train.*``, ..., else every file) hold more than one type (``x.jsonl`` and ``y.csv``): it reads one type and
    leaves the others' rows out, silently. A directory whose README.md declares ``configs`` in its front matter (a
    hub data set's layout) names its files itself, and is left to ``datasets``, as are patterns it cannot resolve.

    Raises:
        ValueError: naming the types and a file of each.
    """
    from datasets.data_files import DataFilesDict, get_data_patterns

    readme = directory / "README.md"
    front = readme.read_text(encoding="utf-8", errors="replace").split("---") if readme.is_file() else []
    if len(front) > 2 and not front[0].strip() and re.search(r"^configs:", front[1], re.MULTILINE):
        return
    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(directory)), base_path=str(directory))
    except Exception:  # noqa: BLE001 -- no data files, or a layout datasets itself refuses: its own error says so
        return
    kinds: dict[str, Path] = {}
    for file in sorted({Path(f) for split in files.values() for f in split}):
        if file_builder(file) is not None:
            kinds.setdefault(file_builder(file), file)
    if len(kinds) > 1:
        names = ", ".join(f"{file.relative_to(directory)} ({kind})" for kind, file in sorted(kinds.items()))
        raise ValueError(f"data set directory {spec!r} holds data files of {len(kinds)} types: {names}; datasets "
                         f"reads one type per directory and would leave the others' rows out: keep one type there, "
                         f"or give a file as --task")


def _is_saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def load_dataset_source(spec: str, *, split: str = "train", eval_split: str | None = None, name: str | None = None,
                        data_dir: str | None = None, revision: str | None = None) -> tuple[Any, Any | None]:
    """The ``(training, held-out or None)`` data sets that ``spec`` names, loaded with ``datasets``.

    Args:
        spec: a data file, a ``save_to_disk`` directory, a hub-style data set directory or a hub id.
        split, eval_split: split names, or ``datasets``' split syntax (``train[:100]``, ``train[10%:]``,
            ``train[:5]+test[:5]``), read with ``datasets.ReadInstruction`` (``eval_split`` None: no separate
            held-out split). A data file's rows are its one split, ``train``; so are a saved Dataset's.
        name, data_dir, revision: passed to ``datasets.load_dataset`` (hub ids and data set directories).

    Raises:
        FileNotFoundError: a data file path that does not exist.
        ValueError: an unknown split (names the available ones; a split other than "train" of a saved Dataset,
            which has none), a split slice that is not valid or selects no row, or a data set that cannot be
            loaded (names it; a hub id offline or not found says so; an empty file says so; a file that is not
            valid names the file and, for JSON lines, the first bad line); a directory that is an rlzoo run's or a
            model's (says what takes it), or whose data files are of more than one type (names them).
    """
    train, held_out, _, _ = load_dataset_rows(spec, split=split, eval_split=eval_split, name=name, data_dir=data_dir,
                                              revision=revision)
    return train, held_out


def load_dataset_rows(spec: str, *, split: str = "train", eval_split: str | None = None, name: str | None = None,
                      data_dir: str | None = None, revision: str | None = None
                      ) -> tuple[Any, Any | None, RowOrigin, RowOrigin | None]:
    """:func:`load_dataset_source`'s data sets and where their rows come from (:class:`RowOrigin`, for errors: a
    data file's rows as the file numbers them, ``task file 'd.jsonl' row 7 (line 8)``, a directory's or hub id's
    by split; a slice's rows as its split numbers them).

    A ``name``, ``data_dir`` or ``revision`` that a data file or a ``save_to_disk`` directory cannot have (a local
    directory: ``revision``) is ignored with a warning.

    Raises:
        the errors of :func:`load_dataset_source`.
    """
    import datasets

    path, builder = Path(spec), file_builder(Path(spec))
    local_data = path.is_file() or path.is_dir() and _is_saved_to_disk(path)
    ignored = [option for option, value in (("name", name), ("data_dir", data_dir), ("revision", revision))
               if value is not None and (local_data or option == "revision" and path.exists())]
    if ignored:  # they were ignored silently (a warning, not a refusal: a run that recorded one still resumes)
        log.warning("%s %r: %s ignored: a data file or save_to_disk directory has no configuration, sub-directory or "
                    "revision, a local directory no revision (they are a hub data set's)",
                    "task file" if path.is_file() else "data set", spec,
                    ", ".join(f"--task.{option}" for option in ignored))
    if path.is_file():
        if builder is None:
            raise ValueError(f"task file {spec!r}: unknown data file type {''.join(path.suffixes[-2:])!r}; "
                             f"rlzoo reads {', '.join(FILE_BUILDERS)} (also compressed: {', '.join(COMPRESSIONS)})")
        blank = path.stat().st_size == 0
        if builder != "parquet":
            blank = not _check_utf8(path).strip()  # Arrow's readers would replace bad bytes silently
        elif not blank and "".join(path.suffixes[-1:]).lower() == ".parquet":  # a valid file of 0 rows: ArrowInvalid
            blank = _parquet_rows(path) == 0
        if blank:
            raise ValueError(f"task file {spec!r} is empty: it has no rows")
    from rlzoo.trainer.checkpoint import is_run_config  # (here: it imports torch.distributed.checkpoint)

    if path.is_dir() and is_run_config(path / "config.json"):  # its metrics.jsonl would load as data
        raise ValueError(f"{spec!r} is an rlzoo run directory, not a data set: rlzoo eval --run {spec} evaluates its "
                         f"checkpoint on the task it trained on; rlzoo train --config {path / 'config.json'} reuses "
                         "its settings; --task takes a reasoning-gym task (rlzoo tasks), a data file or a data set")
    if path.is_dir() and not _is_saved_to_disk(path):
        _refuse_mixed_types(path / data_dir if data_dir else path, spec)
    try:
        if path.is_file():
            tabs = {"sep": "\t"} if data_suffix(path) == ".tsv" else {}
            loaded = datasets.load_dataset(builder, data_files=str(path), **tabs)
        elif not path.exists() and (builder is not None or spec.startswith(("./", "../", "/", "~"))):  # no hub id
            raise FileNotFoundError(f"task {'file' if builder else 'path'} {spec!r} does not exist")
        elif path.is_dir() and _is_saved_to_disk(path):
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(spec, name=name, data_dir=data_dir, revision=revision)
    except (FileNotFoundError, ValueError) as err:
        if path.is_file() or isinstance(err, FileNotFoundError) and not path.exists():
            raise _file_error(path, err) from err
        raise ValueError(_load_error(spec, err)) from err
    except Exception as err:  # datasets' own errors (DatasetGenerationError, DatasetNotFoundError, ...)
        if path.is_file():
            raise _file_error(path, err) from err
        raise ValueError(_load_error(spec, err)) from err
    label = f"task file {spec!r}" if path.is_file() else f"data set {spec!r}"
    if not isinstance(loaded, Mapping):  # a save_to_disk Dataset: one split, which has no name
        asked = {option: value for option, value in (("split", split), ("eval_split", eval_split))
                 if value is not None and _split_names(value) != {"train"}}
        if asked:
            raise ValueError(f"data set {spec!r} is one saved Dataset (save_to_disk), without named splits: drop "
                             + ", ".join(f"--task.{option} {value}" for option, value in asked.items())
                             + " (the held-out set is then a seeded split of it), or slice it as train[...]")
        loaded = {"train": loaded}
    file_path = spec if path.is_file() else None
    train, origin = _split(loaded, split, spec, "split", label, file_path)
    if eval_split is None:
        return train, None, origin, None
    held_out, eval_origin = _split(loaded, eval_split, spec, "eval_split", label, file_path)
    if eval_split == split:
        log.warning("data set %r: --task.eval_split %s is the training split: the held-out accuracy is measured on "
                    "training problems (unless --exclude-eval-questions, which drops them from training)", spec, split)
    elif origin.label == eval_origin.label:  # one split, sliced on either side (an unsliced one: all its rows)
        ours, theirs = (o.ranges or (range(len(d)),) for o, d in ((origin, train), (eval_origin, held_out)))
        shared = sum(max(0, min(a.stop, b.stop) - max(a.start, b.start)) for a in ours for b in theirs)
        if shared:
            log.warning("data set %r: --task.eval_split %s and --task.split %s share %d rows: the held-out accuracy "
                        "is partly measured on training problems (unless --exclude-eval-questions, which drops them "
                        "from training)", spec, eval_split, split, shared)
    return train, held_out, origin, eval_origin


def _check_utf8(path: Path) -> bytes:
    """The content of ``path`` (decompressed: ``d.jsonl.gz``); raise naming the line and column of its first byte that
    is not UTF-8."""
    if path.suffix.lower() in COMPRESSIONS:
        import fsspec
        from fsspec.utils import infer_compression

        if infer_compression(str(path)) is None:  # fsspec knows zstd / lz4 only with their packages
            package = {".zst": "zstandard", ".lz4": "lz4"}.get(path.suffix.lower(), path.suffix)
            raise ValueError(f"task file {path}: reading {path.suffix} files needs the {package} package "
                             f"(pip install {package})")
        try:
            with fsspec.open(str(path), "rb", compression="infer") as fh:
                data = fh.read()
        except Exception as err:  # noqa: BLE001 (not the compression its name says, or its library missing: zstd)
            raise ValueError(f"cannot read task file {path}: {type(err).__name__}: {err}") from None
    else:
        data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as bad:
        newline = b"\n"
        line, column = data.count(newline, 0, bad.start) + 1, bad.start - data.rfind(newline, 0, bad.start)
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {data[bad.start]:#04x} at column {column}); task "
                         "files must be UTF-8") from None
    return data


def _split_names(split: str) -> set[str] | None:
    """The split names in ``split`` (``datasets``' split syntax), or None when it is not valid syntax."""
    import datasets

    try:
        datasets.ReadInstruction.from_spec(split)  # NAME, NAME[SLICE], joined by +
    except ValueError:
        return None
    return {part.split("[")[0].strip() for part in split.split("+")}


def _split(loaded: Mapping[str, Any], split: str, spec: str, option: str, label: str,
           path: str | None) -> tuple[Any, RowOrigin]:
    """The data set that ``split`` names in ``loaded`` (a split name, or ``datasets``' split syntax, resolved with
    ``datasets.ReadInstruction``) and where its rows come from."""
    import datasets

    if split in loaded:
        return loaded[split], RowOrigin(label if path else f"{label} split {split!r}", path=path)
    names = _split_names(split)
    if names is None or not names <= set(loaded):
        if names is None and "[" in split:
            try:
                datasets.ReadInstruction.from_spec(split)
                why = ""
            except ValueError as err:
                why = f" ({err})"
            raise ValueError(f"data set {spec!r}: --task.{option} {split!r} is not valid in datasets' split syntax"
                             f"{why}: e.g. train[:100], train[10%:], train[:50%]; its splits: {', '.join(loaded)}")
        raise ValueError(f"data set {spec!r} has no split {split!r}; its splits: {', '.join(loaded)} "
                         f"(choose one with --task.{option}; slice one as train[:100], train[10%:])")
    try:
        parts = datasets.ReadInstruction.from_spec(split).to_absolute({k: len(v) for k, v in loaded.items()})
    except ValueError as err:  # e.g. a percent boundary out of range
        raise ValueError(f"data set {spec!r}: --task.{option} {split!r}: {err}") from None
    ranges = tuple(range(part.from_, part.to) for part in parts)
    if not any(ranges):
        raise ValueError(f"data set {spec!r}: --task.{option} {split!r} selects no row (its splits: "
                         + ", ".join(f"{k} has {len(v)}" for k, v in loaded.items()) + ")")
    pieces = [loaded[part.splitname].select(rows) for part, rows in zip(parts, ranges, strict=True)]
    data = pieces[0] if len(pieces) == 1 else datasets.concatenate_datasets(pieces)
    if len(names) == 1:  # rows numbered as their split numbers them
        base = next(iter(names))
        return data, RowOrigin(label if path else f"{label} split {base!r}", path=path, ranges=ranges)
    return data, RowOrigin(f"{label} split {split!r}")


def _load_error(spec: str, err: BaseException) -> str:
    import huggingface_hub.constants

    first = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    if Path(spec).is_dir():  # a local directory: no hub, no cache
        if (Path(spec) / "config.json").is_file():  # a Hugging Face model's
            return f"{spec!r} is a model directory, not a data set: give it as --model"
        if type(err).__name__ in ("DataFilesNotFoundError", "EmptyDatasetError"):  # datasets speaks of other formats
            return (f"cannot load data set directory {spec!r}: it holds no data files ({', '.join(FILE_BUILDERS)}, as "
                    f"a hub repository lays them out: data/train-*.parquet, ...; or under --task.data_dir) and is no "
                    f"save_to_disk directory ({first})")
        return f"cannot load data set directory {spec!r} ({first})"
    offline = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if huggingface_hub.constants.HF_HUB_OFFLINE \
        else ""
    return (f"cannot load data set {spec!r}{offline}: not a reasoning-gym task, a data file "
            f"({', '.join(FILE_BUILDERS)}), a data set directory nor a loadable hub id ({first})")


def _file_error(path: Path, err: BaseException) -> BaseException:
    """The error for a data file ``datasets`` could not read: the first line of JSON lines that is not a JSON
    object, a CSV file without rows, else the file and ``datasets``' message."""
    if isinstance(err, FileNotFoundError) and not path.exists():
        return err
    if path.suffix.lower() == ".jsonl":
        import json

        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as bad:
                    return ValueError(f"{path}:{lineno}: invalid JSON: {bad.msg} (column {bad.colno})")
                if not isinstance(row, dict):
                    return ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    if path.suffix.lower() in (".csv", ".tsv") and len([x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]) <= 1:
        return ValueError(f"task file {path} has no rows (a header at most)")
    cause = err.__cause__ or err.__context__ or err
    return ValueError(f"cannot read task file {path}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
