"""A sweep's output file: CSV, JSON Lines or Parquet, written as rows finish and read back to resume.

A sweep of hundreds of points is interrupted (Ctrl-C, a closed laptop, a pre-empted node):
every finished row is already on disk, and the next run with the same ``--out`` skips the
points it holds. CSV and JSON Lines (``.json`` or ``.jsonl``: one object a line) are appended
to and flushed row by row. Parquet cannot be appended to, so the whole file is rewritten
(to a temporary file, then renamed: never half written) after each finished work unit; it
needs ``pyarrow``.

The row's fields are :class:`xmem_engine.sweep.Row`'s; in CSV and Parquet each ``--set``
variable is a column ``set:VAR`` and the notes one text, a note a line.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import fields
from typing import Any, Iterable

FORMATS = {".csv": "csv", ".json": "jsonl", ".jsonl": "jsonl", ".parquet": "parquet"}
SET_PREFIX = "set:"
PARQUET_HINT = "Parquet output needs pyarrow: pip install pyarrow (or write .csv / .jsonl)"


class OutputError(ValueError):
    """An output file the sweep cannot write to or resume from (bad input: checked first)."""


def output_format(path: str) -> str:
    """``csv``, ``jsonl`` or ``parquet``, from the file name; refused otherwise, and Parquet
    without pyarrow."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise OutputError(f"--out {path}: give a .csv, .json (JSON Lines), .jsonl or .parquet file")
    fmt = FORMATS[ext]
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise OutputError(f"--out {path}: {PARQUET_HINT}") from None
    return fmt


def columns(row_type: type, variables: Iterable[str]) -> list[str]:
    """The flat columns of a sweep over ``variables``: the row's fields, ``settings`` spread
    into one ``set:VAR`` column each, right after the script."""
    out: list[str] = []
    for f in fields(row_type):
        if f.name == "settings":
            out += [SET_PREFIX + v for v in variables]
        else:
            out.append(f.name)
    return out


def flatten(row: Any, variables: Iterable[str]) -> dict[str, Any]:
    """A row as one flat record (CSV, Parquet)."""
    flat: dict[str, Any] = {}
    for f in fields(row):
        value = getattr(row, f.name)
        if f.name == "settings":
            flat.update({SET_PREFIX + v: value.get(v, "") for v in variables})
        elif f.name == "notes":
            flat["notes"] = "\n".join(value)
        else:
            flat[f.name] = value
    return flat


def _parse(value: Any, kind: str) -> Any:
    """A CSV cell (text) as the field's type: ``kind`` is the annotation's text."""
    if not isinstance(value, str):
        return value
    if value == "" and ("None" in kind or kind in ("bool", "int", "float")):
        return None
    if kind.startswith("bool"):
        return value == "True"
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    return value


def unflatten(row_type: type, flat: dict[str, Any]) -> Any:
    """A flat record (or a JSON Lines object) back as a row."""
    kw: dict[str, Any] = {}
    for f in fields(row_type):
        if f.name == "settings":
            if isinstance(flat.get("settings"), dict):  # JSON Lines
                kw["settings"] = {k: str(v) for k, v in flat["settings"].items()}
            else:
                searched = flat.get("variable") if flat.get("kind") == "max_batch" else None
                kw["settings"] = {k[len(SET_PREFIX):]: ("" if v is None else str(v))
                                  for k, v in flat.items() if k.startswith(SET_PREFIX)
                                  and k[len(SET_PREFIX):] != searched}  # a search's own variable: no value
        elif f.name == "notes":
            notes = flat.get("notes") or []
            kw["notes"] = notes.split("\n") if isinstance(notes, str) else list(notes)
        elif f.name in flat:
            kw[f.name] = _parse(flat[f.name], str(f.type))
    return row_type(**kw)


class Output:
    """The file a sweep writes: rows read back from an earlier run, rows appended as they finish."""

    def __init__(self, path: str, row_type: type, variables: list[str], fresh: bool = False):
        self.path, self.row_type, self.variables = path, row_type, list(variables)
        self.format = output_format(path)
        self.columns = columns(row_type, self.variables)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise OutputError(f"--out {path}: the folder {folder} does not exist")
        if os.path.isdir(path):
            raise OutputError(f"--out {path}: that is a folder; give a file name")
        self.rows: list[Any] = []  # every row in the file (earlier runs' and this run's)
        if os.path.exists(path) and not fresh:
            self.rows = self._read()
        elif os.path.exists(path):
            os.remove(path)

    # ------------------------------------------------------------------ reading
    def _read(self) -> list[Any]:
        try:
            if self.format == "csv":
                with open(self.path, newline="", encoding="utf-8") as fh:
                    reader = csv.DictReader(fh)
                    if reader.fieldnames and list(reader.fieldnames) != self.columns:
                        raise OutputError(
                            f"--out {self.path} holds another sweep's rows (columns {', '.join(reader.fieldnames)}); "
                            "give another file, or --force to start it over")
                    return [unflatten(self.row_type, r) for r in reader]
            if self.format == "jsonl":
                with open(self.path, encoding="utf-8") as fh:
                    return [unflatten(self.row_type, json.loads(line)) for line in fh if line.strip()]
            import pyarrow.parquet as pq

            return [unflatten(self.row_type, r) for r in pq.read_table(self.path).to_pylist()]
        except OutputError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:  # a truncated last line, another file's layout
            raise OutputError(f"--out {self.path}: cannot resume from it ({type(e).__name__}: {e}); "
                              "give another file, or --force to start it over") from None
        except Exception as e:  # pyarrow's own errors
            raise OutputError(f"--out {self.path}: cannot read it as Parquet ({e}); "
                              "give another file, or --force to start it over") from None

    # ------------------------------------------------------------------ writing
    def append(self, rows: list[Any]) -> None:
        """Add finished rows to the file, on disk before this returns."""
        if not rows:
            return
        self.rows += rows
        if self.format == "parquet":
            self._rewrite_parquet()
            return
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        with open(self.path, "a", newline="", encoding="utf-8") as fh:
            if self.format == "csv":
                writer = csv.DictWriter(fh, fieldnames=self.columns)
                if new:
                    writer.writeheader()
                writer.writerows(flatten(r, self.variables) for r in rows)
            else:
                for r in rows:
                    fh.write(json.dumps(_jsonable(r)) + "\n")
            fh.flush()

    def _rewrite_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([flatten(r, self.variables) for r in self.rows])
        tmp = self.path + ".partial"
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)


def _jsonable(row: Any) -> dict[str, Any]:
    return {f.name: getattr(row, f.name) for f in fields(row)}
