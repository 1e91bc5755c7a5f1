"""A sweep's output file: CSV, JSON Lines or Parquet, written as rows finish and read back to resume.

A sweep of hundreds of points is interrupted (Ctrl-C, a closed laptop, a pre-empted node):
every finished row is already on disk, and the next run with the same ``--out`` skips the
points it holds. CSV and JSON Lines (``.json`` or ``.jsonl``: one object a line) are appended
to and flushed row by row. Parquet cannot be appended to, so the whole file is rewritten
(to a temporary file, then renamed: never half written) after each finished work unit; it
needs ``pyarrow``.

The row's fields are :class:`xmem_engine.sweep.Row`'s; in CSV and Parquet each ``--set``
variable is a column ``set:VAR`` and the notes one text, a note a line. Every row carries a
``checksum`` (CRC-32 of its values as text): a row cut short by a full disk or a killed
process (a peak of "767" bytes parses as a number) is not trusted on resume. Rows that fail
the check, or cannot be parsed, are dropped and their points run again; the file is first
rewritten with the good rows only, so nothing is appended into a half-written line.
"""

from __future__ import annotations

import csv
import json
import os
import zlib
from dataclasses import fields
from typing import Any, Iterable

FORMATS = {".csv": "csv", ".json": "jsonl", ".jsonl": "jsonl", ".parquet": "parquet"}
SET_PREFIX = "set:"
CHECKSUM = "checksum"
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
    return out + [CHECKSUM]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def checksum(values: Iterable[Any]) -> str:
    """CRC-32 of the values as the file holds them as text (CSV cells, JSON values alike)."""
    return format(zlib.crc32("\x1f".join(_text(v) for v in values).encode("utf-8")), "08x")


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
    flat[CHECKSUM] = checksum(flat.values())
    return flat


def _intact(record: dict[str, Any], keys: list[str]) -> bool:
    """Whether ``record`` (a flat record or a JSON Lines object) is whole: every key, and the checksum."""
    if any(k not in record for k in keys) or not isinstance(record.get(CHECKSUM), str):
        return False
    return record[CHECKSUM] == checksum(record[k] for k in keys if k != CHECKSUM)


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
        self.dropped = 0  # rows of the file that were cut short or failed their checksum (run again)
        if os.path.exists(path) and not fresh:
            self.rows = self._read()
        elif os.path.exists(path):
            os.remove(path)

    # ------------------------------------------------------------------ reading
    def _read(self) -> list[Any]:
        """The intact rows of the file; if any row is not (a cut line, a failed checksum), the
        file is rewritten with the intact ones first (their points run again)."""
        try:
            records, lines = self._records()
        except OutputError:
            raise
        except (OSError, ValueError, csv.Error) as e:
            raise OutputError(f"--out {self.path}: cannot resume from it ({type(e).__name__}: {e}); "
                              "give another file, or --force to start it over") from None
        except Exception as e:  # pyarrow's own errors
            if self.format != "parquet":
                raise
            raise OutputError(f"--out {self.path}: cannot read it as Parquet ({e}); "
                              "give another file, or --force to start it over") from None
        keys = self.columns if self.format != "jsonl" else [f.name for f in fields(self.row_type)] + [CHECKSUM]
        rows = []
        for rec in records:
            if not isinstance(rec, dict) or not _intact(rec, keys):
                continue
            try:
                rows.append(unflatten(self.row_type, rec))
            except (ValueError, KeyError, TypeError):
                continue
        self.dropped = lines - len(rows)
        if self.dropped:
            self.rows = rows
            self._rewrite()
        return rows

    def _records(self) -> tuple[list[Any], int]:
        """The file's records (dicts; None for a line that is not one) and how many lines it had."""
        if self.format == "csv":
            with open(self.path, newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if reader.fieldnames and list(reader.fieldnames) != self.columns:
                    raise OutputError(
                        f"--out {self.path} holds another sweep's rows (columns {', '.join(reader.fieldnames)}); "
                        "give another file, or --force to start it over")
                records = _csv_records(reader)
            return records, len(records)
        if self.format == "jsonl":
            records = []
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except ValueError:
                            records.append(None)
            return records, len(records)
        import pyarrow.parquet as pq

        records = pq.read_table(self.path).to_pylist()
        return records, len(records)

    # ------------------------------------------------------------------ writing
    def append(self, rows: list[Any]) -> None:
        """Add finished rows to the file, on disk (flushed and synced) before this returns."""
        if not rows:
            return
        self.rows += rows
        if self.format == "parquet":
            self._rewrite()
            return
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        with open(self.path, "a", newline="", encoding="utf-8") as fh:
            self._write(fh, rows, header=new)
            fh.flush()
            os.fsync(fh.fileno())

    def _write(self, fh: Any, rows: list[Any], header: bool) -> None:
        if self.format == "csv":
            writer = csv.DictWriter(fh, fieldnames=self.columns)
            if header:
                writer.writeheader()
            writer.writerows(flatten(r, self.variables) for r in rows)
        else:
            for r in rows:
                fh.write(json.dumps(_jsonable(r)) + "\n")

    def _rewrite(self) -> None:
        """The whole file from ``self.rows``: to a temporary file, then renamed (never half written)."""
        tmp = self.path + ".partial"
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist([flatten(r, self.variables) for r in self.rows]), tmp)
        else:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                self._write(fh, self.rows, header=True)
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _csv_records(reader: csv.DictReader) -> list[Any]:
    """The reader's rows; None for one with more cells than columns, and one None for the rest
    of the file once a quoted field is left open (a write cut short)."""
    out: list[Any] = []
    while True:
        try:
            r = next(reader)
        except StopIteration:
            return out
        except csv.Error:
            return out + [None]
        out.append(r if None not in r else None)


def _jsonable(row: Any) -> dict[str, Any]:
    obj = {f.name: getattr(row, f.name) for f in fields(row)}
    obj[CHECKSUM] = checksum(obj.values())
    return obj
