"""``--set VAR=VALUE``: change a training script's top-level assignments without editing it.

An override replaces the value of a top-level assignment (``batch_size = 32``), also one
inside a top-level ``if __name__ == "__main__":`` block, so a user can ask "what if the batch
were 64" without editing the file. The script is compiled from its AST with the file's own
path and line numbers, so tracebacks point at the user's lines.

One grammar for everything that runs a script with overrides: ``xmem estimate --set``, the
tracer (``tracing/script.py``), the widget's batch slider (:func:`rewrite_source`, on the
cell's text) and the GPU recordings of ``benchmarks/`` (so a recorded run and its estimate
apply the same change). It needs no torch.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, Iterable


class OverrideError(ValueError):
    """A ``--set`` that is malformed or names no top-level assignment of the script."""


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """``["batch_size=64", "lr=1e-3"]`` -> ``{"batch_size": "64", "lr": "1e-3"}``."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise OverrideError(f"--set expects VAR=VALUE with a Python name, got {item!r}")
        out[name] = value
    return out


def _value_node(text: str | ast.expr) -> ast.expr:
    """A literal (``64``, ``1e-3``, ``'adam'``, ``(2, 3)``, ``True``) or else the text as a string;
    an expression node as it is (``tracing/symbolic.py``'s name for a symbolic batch)."""
    if isinstance(text, ast.expr):
        return text
    try:
        value: Any = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        value = text
    return ast.parse(repr(value), mode="eval").body


def _assigned_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _top_level_statements(tree: ast.Module) -> Iterable[ast.stmt]:
    for stmt in tree.body:
        yield stmt
        if isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
            yield from stmt.body


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _overridden(tree: ast.Module, overrides: dict[str, str], filename: str) -> list[tuple[Any, str]]:
    """The top-level assignments (statement, name) that ``overrides`` change: the ones
    :func:`apply_overrides` and :func:`rewrite_source` both rewrite."""
    out = []
    for stmt in _top_level_statements(tree):
        for name in _assigned_names(stmt):
            if name in overrides:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) > 1:
                    raise OverrideError(f"{filename}:{stmt.lineno}: cannot override {name!r} in a chained assignment")
                out.append((stmt, name))
    return out


def apply_overrides(tree: ast.Module, overrides: dict[str, str], filename: str) -> ast.Module:
    """Replace the value of every top-level assignment to each overridden name."""
    found: set[str] = set()
    for stmt, name in _overridden(tree, overrides, filename):
        stmt.value = ast.copy_location(_value_node(overrides[name]), stmt.value)
        ast.fix_missing_locations(stmt)
        found.add(name)
    missing = sorted(set(overrides) - found)
    if missing:
        raise OverrideError(f"{filename} has no top-level assignment to {', '.join(missing)} (for --set)")
    return tree


def rewrite_source(source: str, overrides: dict[str, str], filename: str = "<cell>") -> tuple[str, set[str]]:
    """``source`` with the value of every top-level assignment to each overridden name (the
    ones :func:`apply_overrides` changes) replaced in the text, in place: every other line
    keeps its number and text, so tracebacks and the flame chart's source lines stay right
    and show the value that ran. Returns the text and the names it found (a cell that does
    not assign the batch variable takes it from its namespace instead)."""
    targets = _overridden(ast.parse(source, filename=filename), overrides, filename)
    lines = source.splitlines(True)
    for stmt, name in sorted(targets, key=lambda t: (t[0].value.lineno, t[0].value.col_offset), reverse=True):
        value, text = stmt.value, ast.unparse(_value_node(overrides[name]))
        first, last = value.lineno - 1, value.end_lineno - 1
        head = lines[first][:_col(lines[first], value.col_offset)]
        tail = lines[last][_col(lines[last], value.end_col_offset):]
        # keep the line count: the value's other lines (if it spans several) become blank
        lines[first:last + 1] = [head + text + tail] + ["\n"] * (last - first)
    return "".join(lines), {name for _, name in targets}


def _col(line: str, byte_offset: int) -> int:
    """ast column offsets count UTF-8 bytes; str slicing counts characters."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def top_level_value(path: str | Path, name: str) -> Any:
    """The literal a script assigns to ``name`` at top level (for ``--max-batch``)."""
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    for stmt in _top_level_statements(tree):
        if name in _assigned_names(stmt):
            try:
                return ast.literal_eval(stmt.value)  # type: ignore[attr-defined]
            except ValueError:
                raise OverrideError(f"{path}: {name} is assigned an expression, not a literal; "
                                    f"--max-batch needs a number like `{name} = 32`") from None
    raise OverrideError(f"{path} has no top-level assignment to {name!r}")


def positive_int_value(path: str | Path, name: str) -> int:
    """The positive integer a script assigns ``name`` at top level: the start of a batch search
    or a sweep's axis (``OverrideError`` for anything else, said the same way everywhere)."""
    value = top_level_value(path, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OverrideError(f"the script assigns it {value!r}; a positive integer is needed")
    return value


def top_level_literals(tree: ast.Module) -> dict[str, Any]:
    """Top-level names bound to plain literals: the script's knobs as it will run (a
    recording keeps them beside its measurements)."""
    knobs: dict[str, Any] = {}
    for stmt in _top_level_statements(tree):
        names = _assigned_names(stmt)
        if len(names) == 1:
            try:
                knobs[names[0]] = ast.literal_eval(stmt.value)  # type: ignore[attr-defined]
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
    return knobs


def parse_script(path: str | Path, overrides: dict[str, str] | None = None, source: str | None = None) -> ast.Module:
    """The script's AST with ``overrides`` applied, on the file's own line numbers.
    ``source``: the script's text as read earlier (a sweep's cluster node lacks the file);
    ``path`` then only names it."""
    path = os.path.abspath(path)
    text = Path(path).read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=path)
    return apply_overrides(tree, overrides, path) if overrides else tree


def load_script(path: str | Path, overrides: dict[str, str] | None = None, source: str | None = None) -> Any:
    """The script's code object, overrides applied. Raises FileNotFoundError, SyntaxError, OverrideError."""
    path = os.path.abspath(path)
    return compile(parse_script(path, overrides, source), path, "exec", dont_inherit=True)


def as_set_text(value: Any) -> str:
    """A Python value as ``--set`` text that parses back to it (``repr``: 64, 'adam', None)."""
    return value if isinstance(value, str) and not _is_literal(value) else repr(value)


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return False
    return True
