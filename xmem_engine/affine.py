"""Values that are affine functions of one integer, fitted on two samples.

A trace made at batch size ``b`` and one made at ``b + d`` differ, where they match one for one,
only in integers that grow by the same amount per batch element (``batch_family.py``); so do
two decode steps of ``generate()`` one token apart (``tracing/shims/decode_replay.py``). Both
write such values as a template: :func:`fit` takes two samples of the same structure (tuples,
lists, dicts, strings, integers) ``d`` apart and keeps what is equal, writing each integer that
differs as a :class:`Linear` (and each string as its number tokens, fitted in turn);
:func:`evaluate` gives the structure at ``k`` steps from the first sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NUMBER = re.compile(r"(\d+)")


class NotAffine(ValueError):
    """Two samples that no affine function joins (the message says where)."""


class OutOfRange(Exception):
    """A template evaluated where one of its integers would be negative (or not whole)."""


@dataclass(frozen=True)
class Linear:
    at_b0: int
    slope: int


@dataclass(frozen=True)
class Text:
    parts: list


def fit(a: Any, b: Any, db: int, path: str) -> Any:
    """A template of ``a`` and ``b`` (``db`` apart): equal parts as they are, differing integers
    as (value at the first sample, slope), strings as their number tokens fitted in turn."""
    if type(a) is not type(b):
        raise NotAffine(f"{path}: {type(a).__name__} vs {type(b).__name__}")
    if type(a) is int:
        if a == b:
            return a
        if (b - a) % db:
            raise NotAffine(f"{path}: {a} -> {b} is not a whole step per batch element")
        return Linear(a, (b - a) // db)
    if isinstance(a, str):
        if a == b:
            return a
        pa, pb = _NUMBER.split(a), _NUMBER.split(b)
        if len(pa) != len(pb) or any(x != y for x, y in zip(pa[::2], pb[::2])):
            raise NotAffine(f"{path}: {a[:60]!r} vs {b[:60]!r}")
        return Text([x if i % 2 == 0 else fit(int(x), int(y), db, path) for i, (x, y) in enumerate(zip(pa, pb))])
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise NotAffine(f"{path}: {len(a)} vs {len(b)} items")
        return type(a)(fit(x, y, db, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, dict):
        if a.keys() != b.keys():
            raise NotAffine(f"{path}: keys differ")
        return {k: fit(a[k], b[k], db, f"{path}.{k}") for k in a}
    if a != b:
        raise NotAffine(f"{path}: {a!r} vs {b!r}")
    return a


def evaluate(t: Any, k: int) -> Any:
    """The template at ``k`` steps from its first sample (:class:`OutOfRange` where an integer
    would be negative)."""
    if isinstance(t, Linear):
        v = t.at_b0 + t.slope * k
        if v < 0:
            raise OutOfRange
        return v
    if isinstance(t, Text):
        return "".join(p if isinstance(p, str) else str(evaluate(p, k)) for p in t.parts)
    if isinstance(t, (list, tuple)):
        return type(t)(evaluate(x, k) for x in t)
    if isinstance(t, dict):
        return {key: evaluate(v, k) for key, v in t.items()}
    return t


def rebase(t: Any, c: int, scale: int) -> Any:
    """The template whose ``k``-th value is ``t``'s at ``c + scale * k`` (one line of a
    template, read at every ``scale``-th step from step ``c``)."""
    if isinstance(t, Linear):
        return Linear(t.at_b0 + t.slope * c, t.slope * scale)
    if isinstance(t, Text):
        return Text([p if isinstance(p, str) else rebase(p, c, scale) for p in t.parts])
    if isinstance(t, (list, tuple)):
        return type(t)(rebase(x, c, scale) for x in t)
    if isinstance(t, dict):
        return {key: rebase(v, c, scale) for key, v in t.items()}
    return t


def anchored(t: Any, f: Any, k: int, path: str = "value") -> Any:
    """The template with ``t``'s slopes whose value at step ``k`` is ``f`` (a sample of ``t``'s
    structure; its integers, alone or in a string, may differ from ``t``'s): the line of a
    sample seen once, where lines share their steps. :class:`NotAffine` where ``f`` is not of
    ``t``'s structure. A part equal to ``t``'s is ``t``'s own (no line in it)."""
    if f == t:
        return t
    if isinstance(t, Linear):
        if type(f) is not int:
            raise NotAffine(f"{path}: {type(f).__name__} for a line")
        return Linear(f - t.slope * k, t.slope)
    if isinstance(t, (Text, str)):
        if not isinstance(f, str) or (isinstance(t, str) and type(f) is not type(t)):
            raise NotAffine(f"{path}: {type(f).__name__} vs a string")
        parts = t.parts if isinstance(t, Text) else _NUMBER.split(t)
        pf = _NUMBER.split(f)
        if len(pf) != len(parts) or any(isinstance(p, str) and p != x for p, x in zip(parts[::2], pf[::2])):
            raise NotAffine(f"{path}: {f[:60]!r}")
        if isinstance(t, str):
            return f
        return Text([x if i % 2 == 0 else anchored(p if isinstance(p, Linear) else int(p), int(x), k, path)
                     for i, (p, x) in enumerate(zip(parts, pf))])
    if type(t) is not type(f):
        raise NotAffine(f"{path}: {type(f).__name__} vs {type(t).__name__}")
    if type(t) is int:
        return f
    if isinstance(t, (list, tuple)):
        if len(t) != len(f):
            raise NotAffine(f"{path}: {len(f)} vs {len(t)} items")
        return type(t)(anchored(x, y, k, f"{path}[{i}]") for i, (x, y) in enumerate(zip(t, f)))
    if isinstance(t, dict):
        if t.keys() != f.keys():
            raise NotAffine(f"{path}: keys differ")
        return {key: anchored(t[key], f[key], k, f"{path}.{key}") for key in t}
    raise NotAffine(f"{path}: {f!r} vs {t!r}")


def varies(t: Any) -> bool:
    """Whether the template holds a fitted value (else it is the same at every ``k``)."""
    if isinstance(t, (Linear, Text)):
        return True
    if isinstance(t, (list, tuple)):
        return any(varies(x) for x in t)
    if isinstance(t, dict):
        return any(varies(v) for v in t.values())
    return False


def steps(t: Any) -> list[int]:
    """The slopes of a template's lines, in the order they occur: two lines through samples of
    the same quantity at different offsets move alike if it is linear (or padded), not if it
    grows faster (n x n), which any two samples also fit."""
    if isinstance(t, Linear):
        return [t.slope]
    if isinstance(t, Text):
        return [s for p in t.parts if not isinstance(p, str) for s in steps(p)]
    if isinstance(t, (list, tuple)):
        return [s for x in t for s in steps(x)]
    if isinstance(t, dict):
        return [s for v in t.values() for s in steps(v)]
    return []
