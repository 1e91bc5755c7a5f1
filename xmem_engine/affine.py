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


def moved(f: Any, a: Any, b: Any, path: str = "value") -> Any:
    """``f`` moved on by what differs from ``a`` to ``b`` (each integer of ``f``, alone or in a
    string, plus ``b``'s minus ``a``'s at its place): the next sample of ``f``'s line where lines
    share their steps. :class:`NotAffine` where ``f`` is not of ``a``'s structure."""
    if type(f) is not type(a) or type(a) is not type(b):
        raise NotAffine(f"{path}: {type(f).__name__} vs {type(a).__name__}")
    if type(f) is int:
        return f + (b - a)
    if isinstance(f, str):
        pf, pa, pb = _NUMBER.split(f), _NUMBER.split(a), _NUMBER.split(b)
        if not len(pf) == len(pa) == len(pb) or pf[::2] != pa[::2] or pa[::2] != pb[::2]:
            raise NotAffine(f"{path}: {f[:60]!r} vs {a[:60]!r}")
        out = "".join(x if i % 2 == 0 else str(int(x) + int(y) - int(z)) for i, (x, y, z) in enumerate(zip(pf, pb, pa)))
        return f if out == f else out  # (an enum's word stays the enum)
    if isinstance(f, (list, tuple)):
        if not len(f) == len(a) == len(b):
            raise NotAffine(f"{path}: {len(f)} vs {len(a)} items")
        return type(f)(moved(x, y, z, f"{path}[{i}]") for i, (x, y, z) in enumerate(zip(f, a, b)))
    if isinstance(f, dict):
        if not f.keys() == a.keys() == b.keys():
            raise NotAffine(f"{path}: keys differ")
        return {k: moved(f[k], a[k], b[k], f"{path}.{k}") for k in f}
    if a != b or f != a:
        raise NotAffine(f"{path}: {f!r} vs {a!r}")
    return f


def varies(t: Any) -> bool:
    """Whether the template holds a fitted value (else it is the same at every ``k``)."""
    if isinstance(t, (Linear, Text)):
        return True
    if isinstance(t, (list, tuple)):
        return any(varies(x) for x in t)
    if isinstance(t, dict):
        return any(varies(v) for v in t.values())
    return False
