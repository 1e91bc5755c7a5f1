"""A trace as a function of the batch size: fitted on two traces, checked on real ones.

Finding the largest batch that fits traced the step at every value the search tried: doubling
from the cell's batch size, then bisecting, 6 to 12 traces. Yet in most steps every request
is an affine function of the batch size (activations grow with it, weights and optimizer state
do not), and so are the sizes in the trace's other records (cuDNN's problems, reduction
buffers, attention calls). :class:`BatchFamily` takes two traces at batch sizes ``b0`` and
``b1`` whose events match one for one (same ops, same order, same everything but sizes), and
writes every integer that differs as ``v0 + (v1 - v0) / (b1 - b0) * (b - b0)``: a trace for any
``b``, without running the code.

A CUDA reduction's staging buffers are the exception: their launch plan (blocks, splits)
is not affine in the sizes, so they come and go with the batch (a bias gradient over 512 rows
needs none, over 1,024 four). A family leaves them out and fits the plans' sizes instead
(``_collapse``), and makes the buffers from the plans at each ``b`` (``_expand``), as an
estimate for another GPU does. ``benchmarks/batch_family_zoo.py`` checks the family against
real traces, event for event, on the zoo.

Where the step's control flow depends on the batch size (a kernel chosen by size, a branch in
the user's code) the two traces do not match, or a later real trace does not match the
family's: :func:`same_trace` says so, and the caller traces for real (``batch_search.py`` checks
the answer it found against real traces before it reports it). Integers that would not be
whole numbers, or would be negative, at some ``b`` end the family there (``trace_at`` gives None).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from xmem_engine.affine import NotAffine, OutOfRange as _Negative, evaluate as _eval, fit as _fit, varies as _has_linear
from xmem_engine.trace import Trace, TraceEvent

#: meta entries that describe the run, not the requests (not fitted, not compared)
VOLATILE_META = frozenset({"seconds", "notes", "guesses", "overrides", "script", "argv", "fallback"})
_EVENT_FIELDS = tuple(f.name for f in fields(TraceEvent))


@dataclass(frozen=True)
class _PerElement:
    """Bytes as the event's shape has elements: a (B, B) tensor's grow as B squared, where a
    straight line through two traces would put them."""

    at_b0: int
    numel_b0: int

    def of(self, shape: tuple) -> int:
        n = self.at_b0 * _numel(shape)
        if n % self.numel_b0:
            raise _Negative  # not whole bytes there: no family at this size
        return n // self.numel_b0


def _numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= d
    return n


def _event_row(e: TraceEvent) -> tuple:
    return tuple(getattr(e, f) for f in _EVENT_FIELDS)


_ID, _BYTES, _SHAPE = (_EVENT_FIELDS.index(f) for f in ("id", "bytes", "shape"))


def _fit_event(x: tuple, y: tuple, db: int, path: str) -> tuple:
    """An event's template: its bytes by its shape's elements where they are in proportion at
    both sizes (:class:`_PerElement`), the rest as :func:`_fit` has them."""
    bx, by, sx, sy = x[_BYTES], y[_BYTES], x[_SHAPE], y[_SHAPE]
    if not (bx != by and sx != sy and _numel(sx) > 0 and bx * _numel(sy) == by * _numel(sx)):
        return _fit(x, y, db, path)
    t = _fit((*x[:_BYTES], 0, *x[_BYTES + 1:]), (*y[:_BYTES], 0, *y[_BYTES + 1:]), db, path)
    return (*t[:_BYTES], _PerElement(bx, _numel(sx)), *t[_BYTES + 1:])


def _eval_event(t: tuple, k: int) -> tuple:
    row = _eval(t, k)
    if isinstance(row[_BYTES], _PerElement):
        row = (*row[:_BYTES], row[_BYTES].of(row[_SHAPE]), *row[_BYTES + 1:])
    return row


def _collapse(tr: Trace) -> tuple[list[tuple], dict]:
    """The trace in a form that does not depend on what its reductions' staging buffers were.

    A CUDA reduction's buffers (``meta["by_sm"]``: events the tracer sized by the GPU's SM
    count) come from a launch plan that is not affine in the sizes: more blocks, another
    split. Their events are left out and only their plan's arguments (sizes, affine) kept,
    with where they stood; ids become the order of first use, and the meta entries that point
    at events (``gemm_into``, ``repeat_span``: event indices; ``conv_calls``: ids) point at the
    events kept. :func:`_expand` makes the buffers again from the plans, as an estimate for
    another GPU does (``cuda_temporaries.resized_by_sm``)."""
    events, by = tr.events, tr.meta.get("by_sm")
    groups = sorted(by["groups"], key=lambda g: g[0]) if by else []
    skip = bytearray(len(events))
    for g in groups:
        skip[g[0]:g[0] + g[1]] = b"\x01" * g[1]
    kept_before, groups_before = [0] * (len(events) + 1), [0] * (len(events) + 1)
    kept = gi = 0
    for i in range(len(events) + 1):
        while gi < len(groups) and groups[gi][0] < i:
            gi += 1
        kept_before[i], groups_before[i] = kept, gi
        if i < len(events) and not skip[i]:
            kept += 1
    ids: dict[int, int] = {}
    rows = []
    for i, e in enumerate(events):
        if not skip[i]:
            row = _event_row(e)
            if e.id:
                row = (*row[:_ID], ids.setdefault(e.id, len(ids) + 1), *row[_ID + 1:])
            rows.append(row)
    meta = {k: v for k, v in tr.meta.items() if k not in VOLATILE_META and k != "batch_family"}
    at = lambda n: [kept_before[n], groups_before[n]]  # noqa: E731 - an index, of events kept and of groups
    if groups:
        meta["by_sm"] = {**by, "groups": [[kept_before[g[0]], *g[2:]] for g in groups]}
    if meta.get("gemm_into"):
        meta["gemm_into"] = [[at(g[0]), *g[1:]] for g in meta["gemm_into"]]
    if meta.get("repeat_span"):
        meta["repeat_span"] = [at(n) for n in meta["repeat_span"]]
    if meta.get("conv_calls"):
        meta["conv_calls"] = [[ids.get(i, 0), *rest] for i, *rest in meta["conv_calls"]]
    return rows, meta


def _expand(rows: list[tuple], meta: dict) -> tuple[list[TraceEvent], dict]:
    """A trace's events and meta from :func:`_collapse`'s form (its reductions' buffers made
    from their plans, for the GPU it was traced for)."""
    from xmem_engine.trace import ALLOC, FREE, Category
    from xmem_engine.tracing.kernels.cuda_temporaries import plan_steps

    by = meta.get("by_sm")
    groups = by["groups"] if by else []
    events: list[TraceEvent] = []
    next_id = max((r[_ID] or 0 for r in rows), default=0) + 1
    expanded, placed, gi = [], [0], 0  # the groups as the trace has them; events of the first g groups
    for p in range(len(rows) + 1):
        while gi < len(groups) and groups[gi][0] == p:
            _, plan, stream, op, module, phase, source, iteration = groups[gi]
            start, slots = len(events), {}
            for action, slot, nbytes in plan_steps(plan, by["sm_count"], by["max_threads_per_sm"], by["torch_version"]):
                if action == "alloc":
                    slots[slot] = TraceEvent(ALLOC, id=next_id, bytes=nbytes, stream=stream,
                                             category=Category.TEMPORARY, op=op, module=module, phase=phase,
                                             dtype="uint8", shape=(nbytes,), source=source, iteration=iteration)
                    next_id += 1
                    events.append(slots[slot])
                else:
                    a = slots.pop(slot)
                    events.append(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=stream, category=a.category,
                                             op=op, module=module, phase=phase, dtype="uint8", shape=a.shape,
                                             iteration=iteration))
            expanded.append([start, len(events) - start, *groups[gi][1:]])
            placed.append(placed[-1] + len(events) - start)
            gi += 1
        if p < len(rows):
            events.append(TraceEvent(*rows[p]))
    meta = dict(meta)
    index = lambda at: at[0] + placed[at[1]]  # noqa: E731
    if groups:
        meta["by_sm"] = {**by, "groups": expanded}
    if meta.get("gemm_into"):
        meta["gemm_into"] = [[index(g[0]), *g[1:]] for g in meta["gemm_into"]]
    if meta.get("repeat_span"):
        meta["repeat_span"] = [index(at) for at in meta["repeat_span"]]
    return events, meta


@dataclass
class BatchFamily:
    """Traces at any batch size from two real ones (module docstring)."""

    b0: int
    b1: int
    events: list  # per event (reductions' buffers left out, _collapse): its row (TraceEvent's fields) or its template
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
        (r0, m0), (r1, m1) = _collapse(t0), _collapse(t1)
        if len(r0) != len(r1):
            raise NotAffine(f"{len(r0):,} vs {len(r1):,} events: the step runs differently")
        db = b1 - b0
        rows = [x if x == y else _fit_event(x, y, db, f"event {i}") for i, (x, y) in enumerate(zip(r0, r1))]
        return cls(b0, b1, rows, _fit(m0, m1, db, "meta"), t0.mode,
                   {k: v for k, v in t0.meta.items() if k in VOLATILE_META}, [_has_linear(r) for r in rows])

    def trace_at(self, b: int) -> Trace | None:
        """The trace at batch size ``b``; None where a size would be negative there."""
        k = b - self.b0
        try:
            rows = [_eval_event(r, k) if v else r for r, v in zip(self.events, self.varies)]
            events, meta = _expand(rows, _eval(self.meta, k))
        except _Negative:
            return None
        meta.update(self.kept_meta)
        meta["batch_family"] = {"from": [self.b0, self.b1], "at": b}
        return Trace(events=events, mode=self.mode, seconds=0.0, meta=meta)


@dataclass
class SymbolicFamily:
    """Traces at any batch size from one trace whose batch size was a symbol
    (``tracing/symbolic.py``): each request's size is an expression in it, evaluated at ``b``,
    and the reductions' buffers are made from their plans there, as :class:`BatchFamily` makes
    them. A ``b`` that breaks a guard the trace recorded is not answered (:meth:`trace_at`
    gives None; :meth:`broken_at` says which guard)."""

    batch: Any  # tracing.symbolic.SymbolicBatch
    events: list  # _collapse's rows, sizes as SymInts
    meta: dict
    mode: str
    kept_meta: dict

    @classmethod
    def of(cls, tr: Trace, batch: Any) -> "SymbolicFamily":
        rows, meta = _collapse(tr)
        return cls(batch, rows, meta, tr.mode, {k: v for k, v in tr.meta.items() if k in VOLATILE_META})

    @property
    def b0(self) -> int:
        return self.batch.value

    def broken_at(self, b: int) -> str | None:
        return self.batch.broken_at(b)

    def trace_at(self, b: int) -> Trace | None:
        """The trace at batch size ``b``; None where a guard does not hold there."""
        from xmem_engine.tracing.symbolic import Evaluator

        if self.broken_at(b):
            return None
        at = Evaluator(self.batch.symbol, b)
        try:
            events, meta = _expand([at(r) for r in self.events], at(self.meta))
        except ValueError:  # a size below zero there
            return None
        meta.update(self.kept_meta)
        if b != self.b0:
            meta["batch_family"] = {"from": [self.b0], "at": b, "symbolic": self.batch.variable}
        return Trace(events=events, mode=self.mode, seconds=0.0, meta=meta)


class NotSymbolic(Exception):
    """The code could not be traced with the variable as a symbol, or it fixed the symbol at
    its value (the message says where); the caller traces concrete values instead."""


def symbolic_family(path: str, variable: str, value: int, **trace_kwargs: Any) -> SymbolicFamily:
    """Trace a script once (fake mode) with its top-level ``variable`` a symbol worth ``value``
    (``tracing/symbolic.py``): the trace at every size its guards allow. Raises
    :class:`NotSymbolic` (:func:`symbolic_trace`)."""
    from xmem_engine.tracing import trace_script

    return symbolic_trace(variable, value, lambda batch: trace_script(path, mode="fake", symbolic=batch,
                                                                      **trace_kwargs))


def symbolic_trace(variable: str, value: int, run: Callable[[Any], Trace]) -> SymbolicFamily:
    """``run(batch)`` traces the code with ``batch`` (a ``tracing.symbolic.SymbolicBatch``) as
    its variable's value. Raises :class:`NotSymbolic` where the trace failed with the symbol (a
    size the code or a library needs as a plain number; the error is the message), or pinned
    it (``int(size)``, ``range(size)``: where, is the message)."""
    from xmem_engine.tracing.symbolic import SymbolicBatch, SymbolPinned

    try:
        batch = SymbolicBatch.make(variable, value)
    except ValueError as e:
        raise NotSymbolic(str(e)) from None
    try:
        tr = run(batch)
    except SymbolPinned:
        raise NotSymbolic(f"{variable} was fixed at {value}: {batch.pinned()}") from None
    except Exception as e:  # noqa: BLE001 - any failure means: trace the values one by one
        first = (str(e).strip().splitlines() or [""])[0]
        raise NotSymbolic(f"{type(e).__name__}: {first[:300]}") from e
    pinned = batch.pinned()
    if pinned:
        raise NotSymbolic(f"{variable} was fixed at {value}: {pinned}")
    return SymbolicFamily.of(tr, batch)


class SymbolicRegions:
    """Traces at any value of one variable from as few symbolic traces as its guards allow:
    a value that breaks a guard of every trace so far is traced (symbolically) at itself,
    which holds its own region (the attention kernel a size picks, a branch in the code).
    ``make(value)`` is :func:`symbolic_family` with the script's arguments bound."""

    MAX_TRACES = 4  # then concrete traces, value by value (a variable the step branches on often)

    def __init__(self, make: Callable[[int], SymbolicFamily]) -> None:
        self.make = make
        self.families: list[SymbolicFamily] = []
        self.failed: dict[int, str] = {}  # value -> why it could not be traced symbolically

    def family_at(self, b: int) -> SymbolicFamily:
        """The symbolic trace whose guards hold at ``b``, made there where none does; raises
        :class:`NotSymbolic` where ``b`` cannot be traced with a symbol."""
        for fam in self.families:
            if not fam.broken_at(b):
                return fam
        if b in self.failed:
            raise NotSymbolic(self.failed[b])
        if len(self.families) >= self.MAX_TRACES:
            raise NotSymbolic(f"{len(self.families)} symbolic traces and {b} is in none of their regions")
        try:
            fam = self.make(b)
        except NotSymbolic as e:
            self.failed[b] = str(e)
            raise
        self.families.append(fam)
        return fam

    def known(self, b: int) -> Trace | None:
        """The trace at ``b`` where a symbolic trace made so far holds it (no code run), else None."""
        return next((tr for fam in self.families if (tr := fam.trace_at(b)) is not None), None)

    def trace_at(self, b: int) -> Trace:
        """The trace at ``b``; raises :class:`NotSymbolic` where it cannot come from a symbolic
        trace (then trace ``b`` as it is)."""
        tr = self.family_at(b).trace_at(b)
        if tr is None:
            raise NotSymbolic(f"a size would be below zero at {b}")
        return tr

    @property
    def traced(self) -> list[int]:
        return [f.b0 for f in self.families]

    def describe(self) -> str:
        """What the traces were and why there was more than one (a CLI / widget note)."""
        if not self.families:
            return "; ".join(f"{v} not symbolic: {why}" for v, why in self.failed.items())
        parts = [f"traced once with {self.families[0].batch.variable} as a symbol, at "
                 f"{', '.join(map(str, self.traced))}"]
        for fam in self.families[1:]:
            for other in self.families:
                if other is not fam and (why := other.broken_at(fam.b0)):
                    parts.append(f"{fam.b0} broke a guard of the trace at {other.b0}: {why}")
                    break
        parts += [f"{v} not symbolic: {why}" for v, why in self.failed.items()]
        return "; ".join(parts)


def branches_on(source: str, variable: str) -> str | None:
    """Where the code tests ``variable`` in a way a family cannot follow: for (in)equality
    (``batch == 3``, ``batch in (3, 5)``) or a remainder (``batch % 8``), which may hold between
    two traced values and at neither (a branch past a threshold, ``batch > 600``, changes the
    traces at the ends instead, and they are then no family). None where it does not, or the
    code does not parse. What the code does with a copy of the variable is not followed."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    named = lambda n: isinstance(n, ast.Name) and n.id == variable  # noqa: E731
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) for op in node.ops) \
                and any(named(x) for x in (node.left, *node.comparators)):
            return f"line {node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and named(node.left):
            return f"line {node.lineno}: {ast.unparse(node)}"
    return None


def script_branches_on(path: str, variable: str) -> str | None:
    """:func:`branches_on` for a script's file (None where it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            return branches_on(f.read(), variable)
    except (OSError, UnicodeDecodeError):
        return None


def family_note(meta: dict) -> str | None:
    """The estimate's note for a trace :meth:`BatchFamily.trace_at` made (None for a real one)."""
    fam = meta.get("batch_family")
    if not fam:
        return None
    if fam.get("symbolic"):
        return (f"{fam['symbolic']} = {fam['at']} was not traced: the trace at {fam['from'][0]} with "
                f"{fam['symbolic']} as a symbol gives each request's size as a formula in it, and this is "
                f"that trace at {fam['at']} (every test the step made of the size holds there too)")
    (b0, b1), at = fam["from"], fam["at"]
    return (f"batch size {at} was not traced: the traces at {b0} and {b1} make the same requests, each "
            f"size a straight line in the batch size, and this is that line at {at}; a step that changes with "
            f"the batch size (a kernel chosen by size, a branch) shows only in a trace of its own")


def same_trace(a: Trace, b: Trace) -> bool:
    """Whether two traces make the same requests with the same records (what an estimate
    reads): compared as :func:`_collapse` has them, so ids may be numbered differently."""
    return _collapse(a) == _collapse(b)
