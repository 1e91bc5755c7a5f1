"""``--set VAR=VALUE``: change a training script's top-level assignments without editing it.

An override replaces the value of a top-level assignment (``batch_size = 32``), also one
inside a top-level ``if __name__ == "__main__":`` block, so a user can ask "what if the batch
were 64" without editing the file. Where the script assigns no such name, the override
replaces the literal of every keyword argument of that name in a call
(``SFTConfig(per_device_train_batch_size=4)``, ``DataLoader(ds, batch_size=64)``): fine-tuning
scripts write their knobs into a trainer's config, not into variables. The script is compiled
from its AST with the file's own path and line numbers, so tracebacks point at the user's lines.

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
    """A ``--set`` that is malformed or names neither a top-level assignment of the script nor
    a keyword argument it gives a literal."""


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


class _Element:
    """One name of a tuple assignment (``batch, seq_len = 4, 1024``): its ``value`` is that
    name's element of the tuple, read and replaced as a statement's ``value`` is."""

    def __init__(self, values: ast.Tuple, index: int) -> None:
        self.values, self.index = values, index

    @property
    def value(self) -> ast.expr:
        return self.values.elts[self.index]

    @value.setter
    def value(self, node: ast.expr) -> None:
        self.values.elts[self.index] = node


def _bindings(stmt: ast.stmt) -> list[tuple[str, Any]]:
    """The names a statement assigns, each with what holds its value (an object with a
    ``value`` node: the statement, or an :class:`_Element` of a tuple assignment)."""
    if isinstance(stmt, ast.Assign):
        out: list[tuple[str, Any]] = [(t.id, stmt) for t in stmt.targets if isinstance(t, ast.Name)]
        if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
                and len(stmt.targets[0].elts) == len(stmt.value.elts):
            out += [(t.id, _Element(stmt.value, i)) for i, t in enumerate(stmt.targets[0].elts)
                    if isinstance(t, ast.Name)]
        return out
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return [(stmt.target.id, stmt)]
    return []


def _chained(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assign) and len(stmt.targets) > 1


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


def _is_literal_node(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False
    return True


def keyword_sites(tree: ast.Module, name: str) -> list[ast.keyword]:
    """Every ``name=<literal>`` keyword argument of a call in the script, in the order of the
    source (functions' bodies included: a ``main()`` builds the trainer's config). A keyword
    given a variable (``batch_size=bs``) is not one: the variable is the knob."""
    sites = [kw for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
             if kw.arg == name and _is_literal_node(kw.value)]
    return sorted(sites, key=lambda kw: (kw.value.lineno, kw.value.col_offset))


def _overridden(tree: ast.Module, overrides: dict[str, str], filename: str) -> list[tuple[Any, str]]:
    """The nodes with a ``.value`` (statement or keyword, name) that ``overrides`` change: the
    ones :func:`apply_overrides` and :func:`rewrite_source` both rewrite. A name's top-level
    assignments where it has any, else its :func:`keyword_sites`."""
    out: list[tuple[Any, str]] = []
    for stmt in _top_level_statements(tree):
        for name, holder in _bindings(stmt):
            if name in overrides:
                if _chained(stmt):
                    raise OverrideError(f"{filename}:{stmt.lineno}: cannot override {name!r} in a chained assignment")
                out.append((holder, name))
    assigned = {name for _, name in out}
    for name in overrides:
        if name not in assigned:
            out.extend((kw, name) for kw in keyword_sites(tree, name))
    return out


def apply_overrides(tree: ast.Module, overrides: dict[str, str], filename: str) -> ast.Module:
    """Replace the value of every top-level assignment to each overridden name (of every
    keyword argument of that name, where the script assigns none)."""
    found: set[str] = set()
    for holder, name in _overridden(tree, overrides, filename):
        holder.value = ast.copy_location(_value_node(overrides[name]), holder.value)
        found.add(name)
    ast.fix_missing_locations(tree)
    missing = sorted(set(overrides) - found)
    if missing:
        raise OverrideError(f"{filename} has no top-level assignment to {', '.join(missing)} and no call "
                            f"with {' or '.join(f'{m}=<a literal>' for m in missing)} (for --set)")
    return tree


def rewrite_source(source: str, overrides: dict[str, str], filename: str = "<cell>") -> tuple[str, set[str]]:
    """``source`` with the value of every top-level assignment to each overridden name (the
    ones :func:`apply_overrides` changes, keyword arguments included) replaced in the text, in
    place: every other line keeps its number and text, so tracebacks and the flame chart's
    source lines stay right and show the value that ran. Returns the text and the names it
    found (a cell that does not assign the batch variable takes it from its namespace instead)."""
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


def keyword_value(tree: ast.Module, name: str, where: str = "the code") -> Any:
    """The literal every ``name=...`` keyword argument of the script gives (:func:`keyword_sites`);
    :data:`NO_VALUE` when there is none. ``OverrideError`` when they differ: one value cannot
    stand for them all, and ``--set`` would make them one."""
    values = [(kw.value.lineno, ast.literal_eval(kw.value)) for kw in keyword_sites(tree, name)]
    if not values:
        return NO_VALUE
    if any(v != values[0][1] or type(v) is not type(values[0][1]) for _, v in values):
        listed = ", ".join(f"{v!r} at line {line}" for line, v in values)
        raise OverrideError(f"{where} gives {name}= different values ({listed}); --set {name}=... sets them all "
                            f"to one")
    return values[0][1]


#: :func:`keyword_value` of a name no call gives a literal
NO_VALUE = object()


def top_level_value(path: str | Path, name: str) -> Any:
    """The literal a script assigns to ``name`` at top level, else the one its keyword
    arguments ``name=...`` give (for ``--max-batch``, sweeps and the advisor)."""
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    for stmt in _top_level_statements(tree):
        for bound, holder in _bindings(stmt):
            if bound != name:
                continue
            try:
                return ast.literal_eval(holder.value)
            except ValueError:
                raise OverrideError(f"{path}: {name} is assigned an expression, not a literal; "
                                    f"--max-batch needs a number like `{name} = 32`") from None
    value = keyword_value(tree, name, str(path))
    if value is NO_VALUE:
        raise OverrideError(f"{path} has no top-level assignment to {name!r} and no call with {name}=<a literal>")
    return value


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
        if _chained(stmt):
            continue
        for name, holder in _bindings(stmt):
            try:
                knobs[name] = ast.literal_eval(holder.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
    return knobs


# ---------------------------------------------------------------- the batch size's name
BATCH_NAMES = ("batch_size", "batch", "bs", "train_batch_size", "micro_batch_size", "mini_batch_size",
               "per_device_train_batch_size")


def infer_batch_var(knobs: dict[str, Any], keyword_knobs: dict[str, Any] | None = None) -> str | None:
    """The batch-size variable, when the code assigns exactly one of :data:`BATCH_NAMES` a
    positive integer (``knobs``: its top-level literals): without one, the advisor cannot try
    gradient accumulation or a smaller batch, the levers a student needs most (issue #35, ``advisor.py``).
    Where it assigns none, the one such name its calls give as a keyword argument
    (``keyword_knobs``: ``SFTConfig(per_device_train_batch_size=4)``)."""
    for source in (knobs, keyword_knobs or {}):
        found = [n for n in BATCH_NAMES if type(source.get(n)) is int and source[n] >= 1]
        if found:
            return found[0] if len(found) == 1 else None
    return None


def batch_var_in(source: str, overrides: dict[str, str] | None = None) -> str | None:
    """:func:`infer_batch_var` of a script's or cell's source, with ``--set`` values applied
    (None for source that does not parse: the trace says where). A name assigned two values
    (``batch = 8`` ... ``batch = 16``) is not one: setting it, as the slider does, would make
    them one."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    knobs = top_level_literals(tree)
    for stmt in _top_level_statements(tree):
        for name, holder in _bindings(stmt):
            if name not in BATCH_NAMES:
                continue
            if _chained(stmt):  # a = batch = 8: no value can be set
                return None
            try:
                same = ast.literal_eval(holder.value) == knobs.get(name)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                same = False
            if not same:
                knobs.pop(name, None)  # batch = 8 ... batch = 16: one value would stand for both
    keywords: dict[str, Any] = {}
    for name in BATCH_NAMES:
        try:
            value = keyword_value(tree, name)
        except OverrideError:  # several different values: not one batch size
            continue
        if value is not NO_VALUE:
            keywords[name] = value
    set_ints = {k: int(v) for k, v in (overrides or {}).items() if v.isdigit()}
    for name, value in set_ints.items():
        (knobs if name in knobs or name not in keywords else keywords)[name] = value
    return infer_batch_var(knobs, keywords)


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
