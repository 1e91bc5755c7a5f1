"""A trace as a function of the batch size: fitted on two traces, checked on real ones.

Finding the largest batch that fits traced the step at every value the search tried: doubling
from the cell's batch size, then bisecting, 6 to 12 traces. Yet in most steps every request
is an affine function of the batch size (activations grow with it, weights and optimizer state
do not), and so are the sizes in the trace's other records (cuDNN's problems, reduction
buffers, attention calls). :class:`BatchFamily` takes two traces at batch sizes ``b0`` and
``b1`` whose events match one for one (same ops, same order, same everything but sizes), and
writes every integer that differs as ``v0 + (v1 - v0) / (b1 - b0) * (b - b0)``: a trace for any
``b``, without running the code.

Where the step's control flow depends on the batch size (a kernel chosen by size, a branch in
the user's code) the two traces do not match, or a later real trace does not match the
family's: :func:`same_trace` says so, and the caller traces for real (``batch_search.py`` checks
the answer it found against real traces before it reports it). Integers that would not be
whole numbers, or would be negative, at some ``b`` end the family there (``trace_at`` gives None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from xmem_engine.trace import Trace, TraceEvent

#: meta entries that describe the run, not the requests (not fitted, not compared)
VOLATILE_META = frozenset({"seconds", "notes", "guesses", "overrides", "script", "argv", "fallback"})
_NUMBER = re.compile(r"(\d+)")
_EVENT_FIELDS = tuple(f.name for f in fields(TraceEvent))


class NotAffine(ValueError):
    """Two traces that no affine function of the batch size joins."""


def _fit(a: Any, b: Any, db: int, path: str) -> Any:
    """A template of ``a`` and ``b``: equal parts as they are, differing integers as (value at
    b0, slope), strings as their number tokens fitted in turn."""
    if type(a) is not type(b):
        raise NotAffine(f"{path}: {type(a).__name__} vs {type(b).__name__}")
    if type(a) is int:
        if a == b:
            return a
        if (b - a) % db:
            raise NotAffine(f"{path}: {a} -> {b} is not a whole step per batch element")
        return _Linear(a, (b - a) // db)
    if isinstance(a, str):
        if a == b:
            return a
        pa, pb = _NUMBER.split(a), _NUMBER.split(b)
        if len(pa) != len(pb) or any(x != y for x, y in zip(pa[::2], pb[::2])):
            raise NotAffine(f"{path}: {a[:60]!r} vs {b[:60]!r}")
        return _Text([x if i % 2 == 0 else _fit(int(x), int(y), db, path) for i, (x, y) in enumerate(zip(pa, pb))])
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise NotAffine(f"{path}: {len(a)} vs {len(b)} items")
        return type(a)(_fit(x, y, db, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, dict):
        if a.keys() != b.keys():
            raise NotAffine(f"{path}: keys differ")
        return {k: _fit(a[k], b[k], db, f"{path}.{k}") for k in a}
    if a != b:
        raise NotAffine(f"{path}: {a!r} vs {b!r}")
    return a


@dataclass(frozen=True)
class _Linear:
    at_b0: int
    slope: int


@dataclass(frozen=True)
class _Text:
    parts: list


class _Negative(Exception):
    pass


def _eval(t: Any, k: int) -> Any:
    """The template at ``k = b - b0``."""
    if isinstance(t, _Linear):
        v = t.at_b0 + t.slope * k
        if v < 0:
            raise _Negative
        return v
    if isinstance(t, _Text):
        return "".join(p if isinstance(p, str) else str(_eval(p, k)) for p in t.parts)
    if isinstance(t, (list, tuple)):
        return type(t)(_eval(x, k) for x in t)
    if isinstance(t, dict):
        return {key: _eval(v, k) for key, v in t.items()}
    return t


def _has_linear(t: Any) -> bool:
    if isinstance(t, (_Linear, _Text)):
        return True
    if isinstance(t, (list, tuple)):
        return any(_has_linear(x) for x in t)
    if isinstance(t, dict):
        return any(_has_linear(v) for v in t.values())
    return False


def _event_row(e: TraceEvent) -> tuple:
    return tuple(getattr(e, f) for f in _EVENT_FIELDS)


@dataclass
class BatchFamily:
    """Traces at any batch size from two real ones (module docstring)."""

    b0: int
    b1: int
    events: list  # per event: its row (a tuple of TraceEvent's fields) or its template
    meta: dict
    mode: str
    kept_meta: dict  # the first trace's volatile entries, as they were
    varies: list = field(default_factory=list)  # per event: whether its row holds a fitted value

    @classmethod
    def fit(cls, b0: int, t0: Trace, b1: int, t1: Trace) -> "BatchFamily":
        """Raises :class:`NotAffine` (saying where) when the two traces are not one family."""
        if b0 == b1:
            raise NotAffine("two traces at the same batch size")
        if b0 > b1:
            b0, t0, b1, t1 = b1, t1, b0, t0
        if t0.mode != t1.mode:
            raise NotAffine(f"traced in {t0.mode} and {t1.mode} mode")
        if len(t0.events) != len(t1.events):
            raise NotAffine(f"{len(t0.events):,} vs {len(t1.events):,} events: the step runs differently")
        db = b1 - b0
        rows = []
        for i, (x, y) in enumerate(zip(t0.events, t1.events)):
            rx, ry = _event_row(x), _event_row(y)
            rows.append(rx if rx == ry else _fit(rx, ry, db, f"event {i}"))
        m0 = {k: v for k, v in t0.meta.items() if k not in VOLATILE_META}
        m1 = {k: v for k, v in t1.meta.items() if k not in VOLATILE_META}
        return cls(b0, b1, rows, _fit(m0, m1, db, "meta"), t0.mode,
                   {k: v for k, v in t0.meta.items() if k in VOLATILE_META}, [_has_linear(r) for r in rows])

    def trace_at(self, b: int) -> Trace | None:
        """The trace at batch size ``b``; None where a size would be negative there."""
        k = b - self.b0
        try:
            events = [TraceEvent(*(_eval(r, k) if v else r)) for r, v in zip(self.events, self.varies)]
            meta = _eval(self.meta, k)
        except _Negative:
            return None
        meta.update(self.kept_meta)
        meta["batch_family"] = {"from": [self.b0, self.b1], "at": b}
        return Trace(events=events, mode=self.mode, seconds=0.0, meta=meta)


def family_note(meta: dict) -> str | None:
    """The estimate's note for a trace :meth:`BatchFamily.trace_at` made (None for a real one)."""
    fam = meta.get("batch_family")
    if not fam:
        return None
    (b0, b1), at = fam["from"], fam["at"]
    return (f"batch size {at} was not traced: the traces at {b0} and {b1} make the same requests, each "
            f"size a straight line in the batch size, and this is that line at {at}; a step that changes with "
            f"the batch size (a kernel chosen by size, a branch) shows only in a trace of its own")


def same_trace(a: Trace, b: Trace) -> bool:
    """Whether two traces make the same requests with the same records (what an estimate reads)."""
    if len(a.events) != len(b.events) or any(_event_row(x) != _event_row(y) for x, y in zip(a.events, b.events)):
        return False
    keys = (set(a.meta) | set(b.meta)) - VOLATILE_META - {"batch_family"}
    return all(a.meta.get(k) == b.meta.get(k) for k in keys)
