"""The batch-size variable: its values, and the cell re-written for another value.

``--batch-var VAR`` names a variable that holds the batch size, either assigned in the cell
(``batch = 64``) or taken from the namespace. Another batch size means running the cell
again with that value: a top-level assignment of VAR in the cell has its right-hand side
replaced in the source text, in place, so every other line keeps its number (tracebacks and
"source line" in the flame chart stay right); otherwise VAR is set in the copy of the
namespace the cell runs in.
"""

from __future__ import annotations

import ast
from typing import Any

from xmem_engine.overrides import NO_VALUE, OverrideError, keyword_value, rewrite_source, top_level_literals


class BatchSpecError(ValueError):
    """A ``--batch-values`` that cannot be read."""


def parse_batch_values(spec: str) -> list[int]:
    """``"8,16,32"`` (a list), ``"8:128"`` (powers of two from 8 to 128) or ``"8:64:8"``
    (8 to 64 in steps of 8, both ends included)."""
    spec = spec.strip()
    try:
        if ":" in spec:
            parts = [int(p) for p in spec.split(":")]
            if len(parts) == 2:
                lo, hi = parts
                if lo < 1 or hi < lo:
                    raise BatchSpecError(f"--batch-values {spec!r}: need 1 <= start <= stop")
                out, v = [], lo
                while v <= hi:
                    out.append(v)
                    v *= 2
                return out
            if len(parts) == 3:
                lo, hi, step = parts
                if lo < 1 or hi < lo or step < 1:
                    raise BatchSpecError(f"--batch-values {spec!r}: need 1 <= start <= stop and step >= 1")
                return list(range(lo, hi + 1, step))
            raise BatchSpecError(f"--batch-values {spec!r}: use START:STOP or START:STOP:STEP")
        values = sorted({int(p) for p in spec.replace(" ", ",").split(",") if p})
    except ValueError as e:
        if isinstance(e, BatchSpecError):
            raise
        raise BatchSpecError(f"--batch-values {spec!r}: expected integers like 8,16,32 or 8:128 or 8:64:8") from None
    if not values or values[0] < 1:
        raise BatchSpecError(f"--batch-values {spec!r}: batch sizes must be positive integers")
    return values


def default_batch_values(current: int) -> list[int]:
    """Powers of two from current/8 to current*8, with the current value itself."""
    vals = {current}
    v = 1
    while v <= current * 8:
        if v >= max(1, current // 8):
            vals.add(v)
        v *= 2
    return sorted(vals)


def current_batch(source: str, var: str, namespace: dict) -> int | None:
    """The batch size the cell uses now: its last top-level literal assignment (of those
    ``--set`` and the slider change), else the literal its calls give as the keyword argument
    ``var=`` (``SFTConfig(per_device_train_batch_size=4)``), else the namespace's value; None
    unless a positive integer."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    value = None if tree is None else top_level_literals(tree).get(var)
    if value is None and tree is not None:
        try:
            found = keyword_value(tree, var)
        except OverrideError:  # different values: the slider would make them one; not "the" batch
            found = NO_VALUE
        value = None if found is NO_VALUE else found
    if value is None:
        value = namespace.get(var)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def with_symbolic_batch(source: str, var: str, batch: Any, ns: dict) -> tuple[str, dict]:
    """The cell and a copy of its namespace with ``var`` a symbol (``batch``, a
    ``tracing.symbolic.SymbolicBatch``): its top-level assignments take the symbol's name, or,
    where the cell assigns none, the namespace holds it."""
    from xmem_engine.tracing.symbolic import NAME, names

    out, found = rewrite_source(source, {var: ast.Name(NAME, ast.Load())})
    ns = {**ns, **names(batch)}
    if var not in found:
        ns[var] = batch.sym
    return out, ns


def with_batch(source: str, var: str, value: int) -> tuple[str, bool]:
    """The cell with every top-level ``var = ...`` set to ``value`` (as ``--set`` does, one
    inside ``if __name__ == "__main__":`` too; where it assigns none, every ``var=<literal>``
    keyword argument); False when the cell has neither (the caller then sets it in the namespace)."""
    out, found = rewrite_source(source, {var: repr(int(value))})
    return out, var in found
