"""Read a data source into rows that remember where they came from.

A source is a ``.jsonl``, ``.json`` (a list of objects, or ``{"data": [...]}``), ``.csv`` or
``.parquet`` file, a directory saved with ``datasets.Dataset.save_to_disk``, or a ``datasets``
hub name (``name`` or ``name:split``). Each row carries a location string used in every error
message: ``file.jsonl:12`` (line), ``file.json:[3]`` (item), ``file.csv:5`` (line, header is 1),
``file.parquet:row 3``, ``name[row 3]``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Any

from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.hub import looks_like_local_path, unreachable_hub_host, use_hub_cache_only


@dataclass(frozen=True)
class Row:
    """One record of a data source."""

    data: dict[str, Any]
    where: str  # "path:line" (or item / row index), used in error messages


FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def check_data_source(source: str) -> None:
    """Fail early (before a run starts) when ``source`` names a local file or directory that is
    missing: a data file by its suffix, a path by its look (``./x``, ``runs/x`` when ``runs/``
    exists: ``runtime.hub.looks_like_local_path``)."""
    if objects.is_handle(source):
        return
    path = os.path.expanduser(source)
    if os.path.exists(path):
        return
    if path.lower().endswith(FILE_SUFFIXES):
        raise ProxrlError(f"data file '{source}' does not exist")
    if looks_like_local_path(source):
        raise ProxrlError(f"data path '{source}' does not exist")


def check_hub_dataset_reachable(source: str) -> None:
    """The data side of ``models.tokenizer.check_hub_model_reachable``: when the hub's host does
    not resolve, a datasets name that ``datasets`` has cached is read from the cache alone, and
    any other name (a mistyped path, usually) fails now instead of after ~30 s of retries."""
    host = unreachable_hub_host()
    if host is None:
        return
    name = source.partition(":")[0]
    if _in_datasets_cache(name):
        import datasets

        use_hub_cache_only(host, name)
        datasets.config.HF_HUB_OFFLINE = True
        return
    raise ProxrlError(
        f"data '{source}' is neither a local file or directory nor a datasets hub name in the "
        f"local cache, and {host} cannot be reached from here; check the path, or load the "
        "dataset once on a connected machine"
    )


def _in_datasets_cache(name: str) -> bool:
    """Whether ``datasets`` holds a prepared copy of hub dataset ``name`` (where its offline
    mode looks: ``<cache>/<namespace>___<snake_case name>``)."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    parts = name.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    return os.path.isdir(os.path.join(datasets.config.HF_DATASETS_CACHE, "___".join(parts)))


def read_rows(source: str, split: str = "train") -> list[Row]:
    """Every row of ``source`` (see the module docstring for what a source may be)."""
    if objects.is_handle(source):
        return _read_python_rows(source, split)
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return _read_saved_dataset(path, split)
    lower = path.lower()
    check_data_source(source)
    if lower.endswith(".jsonl"):
        return _read_jsonl(path)
    if lower.endswith(".json"):
        return _read_json(path)
    if lower.endswith(".csv"):
        return _read_csv(path)
    if lower.endswith(".parquet"):
        return _read_parquet(path)
    if os.path.exists(path):
        raise ProxrlError(
            f"data file '{source}': unknown format; expected .jsonl, .json, .csv, .parquet or a "
            "saved datasets directory"
        )
    check_hub_dataset_reachable(source)
    return _read_hub_dataset(source, split)


def _as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProxrlError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_text(path: str) -> str:
    """The file as text; not UTF-8 is a one-line error naming the line and the byte."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ProxrlError(
            f"{path}:{line}: expected UTF-8 text, "
            f"found byte 0x{data[exc.start]:02x} at column {column}"
        ) from None


def _read_jsonl(path: str) -> list[Row]:
    rows = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProxrlError(
                f"{where}: malformed JSON ({exc.msg} at column {exc.colno})"
            ) from None
        rows.append(Row(_as_object(value, where), where))
    return rows


def _read_json(path: str) -> list[Row]:
    try:
        value = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ProxrlError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if isinstance(value, dict) and isinstance(value.get("data"), list):
        value = value["data"]
    if not isinstance(value, list):
        raise ProxrlError(f'{path}: expected a JSON list of objects (or {{"data": [...]}})')
    return [Row(_as_object(item, f"{path}:[{i}]"), f"{path}:[{i}]") for i, item in enumerate(value)]


def _read_csv(path: str) -> list[Row]:
    """CSV cells are strings; a cell that holds a JSON list or number (``responses``,
    ``ranking``, ``margin``) is decoded."""
    rows = []
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    for record in reader:
        where = f"{path}:{reader.line_num}"
        if None in record:
            raise ProxrlError(f"{where}: more cells than the header has columns")
        rows.append(Row({k: _decode_cell(v) for k, v in record.items()}, where))
    return rows


def _decode_cell(value: str | None) -> Any:
    if value is None:
        return None
    stripped = value.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return value
    return value


def _read_parquet(path: str) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ProxrlError(f"{path}: cannot read Parquet ({exc})") from None
    return [Row(record, f"{path}:row {i}") for i, record in enumerate(table.to_pylist())]


def _read_saved_dataset(path: str, split: str) -> list[Row]:
    import datasets

    try:
        loaded = datasets.load_from_disk(path)
    except FileNotFoundError:
        raise ProxrlError(
            f"'{path}' is a directory but not a dataset saved with save_to_disk"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ProxrlError(f"{path}: no split '{split}' (has {sorted(loaded)})")
        loaded = loaded[split]
    return [Row(dict(record), f"{path}[{split} row {i}]") for i, record in enumerate(loaded)]


def _read_hub_dataset(source: str, split: str) -> list[Row]:
    import datasets

    name, _, explicit_split = source.partition(":")
    split = explicit_split or split
    try:
        loaded = datasets.load_dataset(name, split=split)
    except Exception as exc:  # network, missing dataset, bad split: all one message
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxrlError(
            f"data '{source}' is not a file or directory, and loading it as a datasets hub name "
            f"failed: {first}"
        ) from None
    return [Row(dict(record), f"{name}[{split} row {i}]") for i, record in enumerate(loaded)]


def _read_python_rows(handle: str, split: str) -> list[Row]:
    """Rows of a list of dicts or a ``datasets.Dataset`` (a ``DatasetDict``: its ``split``)
    given to the Python API; a row is named ``data[row 3]`` after the argument it came in."""
    rows = objects.lookup(handle)
    name = handle.removeprefix(objects.PREFIX).partition("@")[0]
    if isinstance(rows, dict):  # a DatasetDict: its split
        if split not in rows:
            raise ProxrlError(f"{name}: no split '{split}' (has {sorted(rows)})")
        rows = rows[split]
    return [
        Row(_as_object(record, f"{name}[row {i}]"), f"{name}[row {i}]")
        for i, record in enumerate(rows)
    ]
