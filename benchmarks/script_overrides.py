"""Override top-level knob assignments of a training script without editing it.

Workload scripts expose their knobs as plain `name = value` statements at module
level.  We rewrite the parsed AST (not the text) so line numbers, and therefore
the file:line locations in memory snapshots, still match the file on disk.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import CodeType
from typing import Any, Iterable, Mapping


class OverrideError(ValueError):
    """An override names a knob the script does not assign exactly once at top level."""


def _literal_node(value: Any) -> ast.expr:
    """Turn a Python literal into an expression node; refuse anything that is not one."""
    try:
        node = ast.parse(repr(value), mode="eval").body
        if ast.literal_eval(node) != value:
            raise ValueError
    except (SyntaxError, ValueError) as exc:
        raise OverrideError(f"override value {value!r} is not a Python literal") from exc
    return node


def _assigned_names(stmt: ast.stmt) -> list[str]:
    """Simple names bound by a top-level `x = ...`, `x = y = ...` or `x: T = ...`."""
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def top_level_knobs(source: str) -> dict[str, int]:
    """Name -> number of top-level assignments, for error messages and listings."""
    counts: dict[str, int] = {}
    for stmt in ast.parse(source).body:
        for name in _assigned_names(stmt):
            counts[name] = counts.get(name, 0) + 1
    return counts


def apply_overrides(source: str, overrides: Mapping[str, Any], filename: str = "<script>") -> ast.Module:
    """Return the script's AST with the value of each overridden top-level assignment replaced.

    Raises OverrideError for a name that is not assigned at top level, or is
    assigned more than once there (which one to replace would be a guess).
    """
    tree = ast.parse(source, filename=filename)
    counts = top_level_knobs(source)
    for name in overrides:
        if counts.get(name, 0) == 0:
            known = ", ".join(sorted(counts)) or "none"
            raise OverrideError(f"{filename}: no top-level assignment to {name!r} (knobs: {known})")
        if counts[name] > 1:
            raise OverrideError(f"{filename}: {name!r} is assigned {counts[name]} times at top level")
    for stmt in tree.body:
        names = _assigned_names(stmt)
        hit = [n for n in names if n in overrides]
        if not hit:
            continue
        if len(names) > 1:
            raise OverrideError(f"{filename}:{stmt.lineno}: cannot override {hit[0]!r} in a chained assignment")
        new = _literal_node(overrides[hit[0]])
        for node in ast.walk(new):  # keep every new node on the original line
            ast.copy_location(node, stmt.value)
        stmt.value = new
    return tree


def literal_knobs(tree: ast.Module) -> dict[str, Any]:
    """Top-level names bound to plain literals, i.e. the script's effective knob values."""
    knobs: dict[str, Any] = {}
    for stmt in tree.body:
        names = _assigned_names(stmt)
        if len(names) == 1:
            try:
                knobs[names[0]] = ast.literal_eval(stmt.value)  # type: ignore[union-attr]
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
    return knobs


def compile_with_overrides(path: str | Path, overrides: Mapping[str, Any]) -> CodeType:
    """Compile a script file with overrides applied, keeping its real filename in tracebacks."""
    return compile(load_with_overrides(path, overrides), str(Path(path).resolve()), "exec")


def load_with_overrides(path: str | Path, overrides: Mapping[str, Any]) -> ast.Module:
    """Parse a script file and apply overrides; the AST carries the file's real line numbers."""
    path = str(Path(path).resolve())
    return apply_overrides(Path(path).read_text(), overrides, path)


def parse_set_args(items: Iterable[str]) -> dict[str, Any]:
    """Parse `VAR=VALUE` strings; VALUE is a Python literal, else taken as a plain string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise OverrideError(f"expected VAR=VALUE, got {item!r}")
        try:
            out[name.strip()] = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            out[name.strip()] = text
    return out
