"""One ``%%xmem`` run's state: the cell, its traces per batch size, estimates per GPU.

Tracing is the slow part (seconds); re-simulating a trace on another GPU or allocator setting
is fast. So traces are cached per batch size and estimates per (batch, GPU, allocator
setting), and the widget's controls only ever ask this object.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from xmem_engine.batch_family import (BatchFamily, NotAffine, NotSymbolic, SymbolicFamily, SymbolicRegions, branches_on,
                                      same_trace, symbolic_trace)
from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.estimate import SEARCH_LIMIT, BatchSearch, Estimate, estimate_trace, max_batch, resolve_gpu
from xmem_engine.trace import Trace
from xmem_engine.tracing.shims.distributed import World

from xmem_jupyter.batching import with_batch, with_symbolic_batch
from xmem_jupyter.cellcode import compile_cell


def with_expandable(conf: str, on: bool) -> str:
    """``conf`` with ``expandable_segments`` set to ``on`` (other settings kept)."""
    parts = [p for p in (conf or "").split(",") if p.strip() and not p.strip().startswith("expandable_segments")]
    if on:
        parts.append("expandable_segments:True")
    return ",".join(parts)


def expandable_on(conf: str) -> bool:
    """Whether ``conf`` turns expandable segments on."""
    return bool(parse_alloc_conf(conf or "").expandable_segments)


@dataclass
class Session:
    """What the magic traced, and how to trace it again for another batch size."""

    source: str  # the code as traced (cell body, line numbers as in the cell)
    namespace: dict  # the user's namespace (the tracer runs in a copy of it)
    gpus: list[str]  # catalog keys, the first is the one traced for
    mode: str = "auto"
    alloc_conf: str = ""
    filename: str = "<cell>"
    batch_var: str | None = None
    batch_values: list[int] = field(default_factory=list)
    batch: int | None = None  # the batch size of the first trace
    iterations: int | None = None  # runs of the training step; None: the steady state (tracing/steady.py)
    world: World | None = None  # one rank of a distributed run (--world-size / --rank)
    compile: str | None = None  # torch.compile: "inductor" (None: as the cell asks) or "eager" (--compile)
    traces: dict[int | None, Trace] = field(default_factory=dict)
    estimates: dict[tuple, Estimate] = field(default_factory=dict)
    searches: dict[tuple[str, str], BatchSearch] = field(default_factory=dict)  # (gpu, conf) -> the search
    family: BatchFamily | None = None  # batch sizes not traced: from the first two traces (batch_family.py)
    family_note: str = ""  # why batch sizes are traced, not derived ("": no reason yet)
    derived_traces: dict[int, Trace] = field(default_factory=dict, repr=False)  # the family's, by batch size
    # batch sizes from traces with the batch as a symbol (batch_family.SymbolicRegions), before any family
    regions: SymbolicRegions | None = field(default=None, repr=False)
    symbolic_note: str = ""  # why the batch could not be a symbol ("": it could, or it was not tried)
    _setup: tuple = field(default=(), repr=False)  # what the symbolic trace being made takes (the widget's probe)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def trace(self, batch: int | None, setup: tuple[Callable, ...] = (), real: bool = False) -> Trace:
        """The trace for ``batch`` (cached). The first trace copies the plain values the cell
        assigned back into the user's namespace; traces for other batch sizes run in a
        copy, so moving the slider never changes the user's variables.

        A second batch size is traced once with the batch as a symbol (``tracing/symbolic.py``):
        that trace gives every batch size its guards allow, no code run, so the slider answers in
        milliseconds; a size outside them gets a symbolic trace of its own. Where the batch cannot
        be a symbol, once two batch sizes are traced in fake mode and their traces are one family
        (the same requests, sizes as functions of the batch, ``batch_family.py``), any other batch
        size is the family's trace. ``real``
        traces it anyway (the largest-batch search checks its answer on a real trace); a real
        trace that is not the family's ends the family, and every later size is traced."""
        with self.lock:
            if batch in self.traces:
                return self.traces[batch]
            if not real and (derived := self.derived(batch)) is not None:
                return derived
            if not real and (symbolic := self._symbolic(batch, setup)) is not None:
                return symbolic
            first = not self.traces
            tr = self._run(batch, self.namespace if first else dict(self.namespace), setup=setup)
            self.traces[batch] = tr
            if self.family is not None and not same_trace(tr, self.family.trace_at(batch) or Trace()):
                self.family_note = (f"the traces at {self.family.b0} and {self.family.b1} are not the real "
                                    f"trace at {batch}: the step changes with the batch size")
                self.family = None
                self.derived_traces.clear()
                self.estimates = {k: e for k, e in self.estimates.items() if k[0] in self.traces}
            return tr

    def derived(self, batch: int | None) -> Trace | None:
        """``batch``'s trace from the family of the first two traced batch sizes, where there is
        one (None: no family yet, none holds, a size there would be negative, or a trace is
        running in another thread: the widget then says it is busy instead of waiting)."""
        if batch is None or not self.batch_var or not self.lock.acquire(blocking=False):
            return None
        try:
            return self._derived(batch)
        finally:
            self.lock.release()

    def _derived(self, batch: int) -> Trace | None:
        if self.regions is not None:
            if batch not in self.derived_traces:
                if (tr := self.regions.known(batch)) is None:
                    return None
                self.derived_traces[batch] = tr
            return self.derived_traces[batch]
        if self.family is None and not self.family_note:
            real = [(b, t) for b, t in self.traces.items() if b is not None]
            if len(real) < 2:
                return None
            (b0, t0), (b1, t1) = real[:2]
            if where := branches_on(self.source, self.batch_var or ""):
                self.family_note = f"the cell tests {self.batch_var} for a value ({where}): each size is traced"
                return None
            if "fake" != t0.mode or "fake" != t1.mode:
                self.family_note = "the batch sizes were traced in real mode"
                return None
            try:
                self.family = BatchFamily.fit(b0, t0, b1, t1)
            except NotAffine as e:
                self.family_note = f"the traces at {b0} and {b1} are not one family ({e})"
                return None
        if self.family is None:
            return None
        if batch not in self.derived_traces:
            tr = self.family.trace_at(batch)
            if tr is None:
                return None
            self.derived_traces[batch] = tr
        return self.derived_traces[batch]

    def _symbolic(self, batch: int | None, setup: tuple[Callable, ...] = ()) -> Trace | None:
        """``batch``'s trace from a trace with the batch as a symbol, made now where none holds
        ``batch``; None where the batch cannot be a symbol (``symbolic_note`` says why)."""
        if batch is None or batch < 2 or not self.batch_var or self.symbolic_note or not self.traces \
                or self.mode == "real" or any(t.mode != "fake" for t in self.traces.values()):
            return None
        try:
            tr = self.family_at(batch, setup).trace_at(batch)
        except NotSymbolic:
            return None
        if tr is not None:
            self.derived_traces[batch] = tr
        return tr

    def family_at(self, batch: int, setup: tuple[Callable, ...] = ()) -> SymbolicFamily:
        """The symbolic trace that holds ``batch`` (made at ``batch`` where none does yet);
        raises NotSymbolic, after which the session traces each batch size as it is."""
        var = self.batch_var or ""
        if self.symbolic_note:
            raise NotSymbolic(self.symbolic_note)
        if self.regions is None:
            self.regions = SymbolicRegions(lambda b: symbolic_trace(
                var, b, lambda sb: self._run(b, dict(self.namespace), self._setup, symbolic=sb)))
        self._setup = setup
        try:
            return self.regions.family_at(batch)
        except NotSymbolic as e:
            if not self.regions.families:
                self.symbolic_note, self.regions = str(e), None
            raise

    def fresh_trace(self, batch: int | None, gpu: str | None = None) -> Trace:
        """The cell for ``batch`` traced again in a copy of the namespace, for ``gpu`` (default:
        the first), not cached: a trace under the advisor's patches must not stand in for the
        cell's own."""
        with self.lock:
            return self._run(batch, dict(self.namespace), gpu=gpu)

    def _run(self, batch: int | None, ns: dict, setup: tuple[Callable, ...] = (), gpu: str | None = None,
             symbolic: object = None) -> Trace:
        from xmem_engine.tracing import trace

        source, mode = self.source, self.mode
        if symbolic is not None:  # the batch as a symbol (tracing/symbolic.py), in fake mode
            source, ns, mode = *with_symbolic_batch(source, self.batch_var or "", symbolic, ns), "fake"
            setup = (*setup, lambda t: setattr(t, "symbolic", symbolic))
        elif batch is not None and batch != self.batch:
            source, assigned = with_batch(self.source, self.batch_var or "", batch)
            if not assigned and self.batch_var:
                ns = dict(ns) if ns is self.namespace else ns
                ns[self.batch_var] = batch
        target = resolve_gpu(gpu or self.gpus[0])
        code = compile_cell(source, self.filename, self.iterations)
        return trace(code, ns, mode=mode, device=target.properties(), filename=self.filename, setup=setup,
                     world=self.world, compile=self.compile)

    def with_compile(self, compile: str) -> "Session":
        """The same cell with ``torch.compile`` doing ``compile`` ("eager": compiled code runs
        eagerly), its own traces and estimates; it traces in a copy of the namespace, so the
        widget's compile toggle never changes the user's variables."""
        return replace(self, compile=compile, namespace=dict(self.namespace), traces={}, estimates={},
                       searches={}, family=None, family_note="", derived_traces={}, regions=None, symbolic_note="",
                       lock=threading.RLock())

    def estimate(self, batch: int | None, gpu: str, conf: str | None = None,
                 setup: tuple[Callable, ...] = (), real: bool = False) -> Estimate:
        """The estimate for ``batch`` on ``gpu`` with allocator setting ``conf`` (cached);
        ``real``: from a real trace, not the batch family's (:meth:`trace`)."""
        conf = self.alloc_conf if conf is None else conf
        key = (batch, gpu, conf)
        if key in self.estimates and real and batch not in self.traces:
            del self.estimates[key]  # the family's
        if key not in self.estimates:
            t0 = time.perf_counter()
            fresh = batch not in self.traces
            tr = self.trace(batch, setup, real=real)
            self.estimates[key] = estimate_trace(tr, gpu, conf, started=t0 if fresh else None)
        return self.estimates[key]

    @property
    def largest(self) -> dict[tuple[str, str], int]:
        """(gpu, conf) -> the largest batch found (a lower bound where the search was unbounded)."""
        return {k: s.value for k, s in self.searches.items()}

    def largest_batch(self, gpu: str, conf: str | None = None, limit: int = SEARCH_LIMIT) -> int:
        """The largest batch size that fits ``gpu``: from the cell's own batch size, doubling or
        halving, then bisection (``max_batch``); each batch size is traced once for all GPUs.
        ``searches`` keeps how the answer was found (a lower bound when the search stopped
        still fitting: memory that does not follow the batch, or the limit)."""
        conf = self.alloc_conf if conf is None else conf
        if (gpu, conf) not in self.searches:
            if not self.batch_var:
                raise ValueError("the largest batch needs --batch-var")
            build = lambda b: self.estimate(b, gpu, conf, real=True)  # noqa: E731
            start = self.batch or 1
            symbolic = None if self.mode == "real" else self.family_at  # one trace, the batch a symbol
            self.searches[(gpu, conf)] = max_batch(
                build, start=start, limit=max(limit, start), estimate_trace=lambda tr: estimate_trace(tr, gpu, conf),
                symbolic=symbolic, fit_family=not branches_on(self.source, self.batch_var))  # batch_family.py
        return self.searches[(gpu, conf)].value
