"""A cell's training step, run until the memory is the training run's (the steady state).

A cell that builds a model and an optimizer and runs one step answers for that first step:
no optimizer state while the activations live, a cold allocator cache. A training run meets
the second step, with the optimizer's state and the allocations on the first step's cache;
it peaks higher (issue #35: 14.40 GiB for one step, 16.11 GiB for the loop). So ``%%xmem``
runs the cell as a loop (:func:`steady_code`): the first pass runs every statement and
watches which ones build the model, optimizer, scheduler or data loader (they bind one to a
name) and which one starts the training step (the tracer's iteration); later passes run the
statements from the step on, so the model and optimizer are built once, as a notebook user
runs "the training loop". A cell that already runs several steps is left as it is.
"""

from __future__ import annotations

import ast
import copy
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from xmem_engine.tracing.oom_tries import mark as mark_oom_tries
from xmem_engine.tracing.user_state import is_plain

STEADY_STEPS = 2  # passes over the step by default: the second step is the steady state's

_tracer: weakref.ref | None = None


def bind(tracer: Any) -> None:
    """A trace's setup hook (``run.trace`` adds it): the passes read this trace's iterations."""
    global _tracer
    _tracer = weakref.ref(tracer)


def _builds() -> tuple[type, ...]:
    """What a cell builds once and a training loop reuses."""
    kinds: list[type] = [torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
                         torch.utils.data.DataLoader]
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if isinstance(scaler, type):
        kinds.append(scaler)
    return tuple(kinds)


@dataclass
class Pass:
    """One run over the cell's statements; the first one observes them."""

    lines: tuple[tuple[int, int], ...]  # each top-level statement's first and last line
    filename: str = ""  # the cell's (In[7]): where a later pass's error is placed
    start: int = 0  # the first statement this pass runs
    number: int = 1
    tracer: Any = None
    builds: list[bool] = field(default_factory=list)
    iteration_before: list[int] = field(default_factory=list)  # the tracer's iteration before each statement
    trained_after: list[bool] = field(default_factory=list)
    failure: str | None = None  # a later pass's error, said in the notes instead of failing the cell
    _current: int = -1
    _names: dict[str, weakref.ref] = field(default_factory=dict)  # the builds bound, weakly (ids outlive them)

    def runs(self, i: int) -> bool:
        """Whether statement ``i`` runs in this pass (called before it, in order)."""
        if self.number == 1:
            self._observe(sys._getframe(1).f_globals)
            self._current = i
            self.iteration_before.append(self._iteration())
            return True
        return i >= self.start

    def failed(self, error: BaseException) -> bool:
        """True: the error is swallowed (a repeated step failed; the notes say so). The first
        pass's errors, and the tracer's own signals, are the cell's."""
        if self.number == 1 or type(error).__module__.startswith("xmem_engine"):
            return False
        where = ""
        tb = error.__traceback__
        while tb is not None:  # the cell's line where it failed
            if tb.tb_frame.f_code.co_filename == self.filename:
                where = f" at line {tb.tb_lineno}"
            tb = tb.tb_next
        said = str(error).splitlines()[0][:160] if str(error).strip() else ""
        self.failure = f"{type(error).__name__}{where}" + (f": {said}" if said else "")
        return True

    def _observe(self, g: dict) -> None:
        """What the statement that just ran bound: a model, an optimizer, ... is a build (a new one
        at a dead one's address too: ``model = Model()`` again)."""
        kinds = _builds()
        if self._current >= 0:
            self.builds.append(any(isinstance(v, kinds) and (k not in self._names or self._names[k]() is not v)
                                   for k, v in g.items()))
            self.trained_after.append(bool(getattr(self.tracer, "trained", False)))
        self._names = {k: weakref.ref(v) for k, v in g.items() if isinstance(v, kinds)}

    def _iteration(self) -> int:
        return getattr(self.tracer, "iteration", -1)


def passes(lines: tuple[tuple[int, int], ...], steps: int | None, filename: str = "") -> Iterator[Pass]:
    """The passes over a cell of ``len(lines)`` statements. ``steps``: how many times the
    step runs (None: steady state, twice where the cell runs one training step)."""
    tracer = _tracer() if _tracer is not None else None
    first = Pass(lines, filename, tracer=tracer)
    yield first
    g = sys._getframe(1).f_globals
    first._observe(g)
    start, why = _step_start(first, steps)
    notes = getattr(tracer, "notes", None)
    if start is None:
        if why and notes is not None:
            notes.append(why)
        return
    total = STEADY_STEPS if steps is None else steps
    span = _span(lines[start][0], lines[-1][1])
    # The plain values (a step counter, a list of losses) are handed back as one run of the
    # cell leaves them: the repeats measure memory, they do not train further.
    plain = {k: copy.deepcopy(v) for k, v in g.items() if not k.startswith("__") and is_plain(v)}
    last = first
    events = getattr(tracer, "events", None)
    for n in range(2, total + 1):
        last = Pass(lines, filename, start=start, number=n, tracer=tracer)
        begin = len(events) if events is not None else 0
        yield last
        if last.failure:
            break
        if steps is None and events is not None and n == total:
            # the last pass's events: the estimate repeats them until the cache settles
            # (simulation/settle.py); not where -n asked for a number of steps
            tracer.repeat_span = (begin, len(events))
    for k in [k for k, v in g.items() if not k.startswith("__") and is_plain(v) and k not in plain]:
        del g[k]  # first bound by a repeat (cannot be: every step statement ran in the first pass)
    g.update(plain)
    if notes is not None:
        how = "steady state: " if steps is None else ""
        on = f" on a model and optimizer built once ({_span(lines[0][0], lines[start - 1][1])})" if start else ""
        if last.failure:
            done = last.number - 1
            notes.append(f"{how}the cell's training step ({span}) ran {done} time{'s' if done > 1 else ''}{on}; "
                         f"run {last.number} failed ({last.failure}), so the estimate covers it until then")
        else:
            tail = "; -n 1 estimates the first step alone" if steps is None else ""
            notes.append(f"{how}the cell's training step ({span}) ran {total} times{on}{tail}")


def _span(a: int, b: int) -> str:
    return f"line {a}" if a == b else f"lines {a}-{b}"


def _step_start(first: Pass, steps: int | None) -> tuple[int | None, str | None]:
    """The first statement of the training step, or None (and why, for the notes) when the
    cell is not repeated."""
    n = len(first.lines)
    tracer = first.tracer
    if tracer is None:  # not under a trace: repeat the whole cell when asked to
        return (0 if steps and steps > 1 else None), None
    iterations = tracer.iteration + 1
    trained = next((i for i, t in enumerate(first.trained_after) if t), None)
    if steps is None and (iterations != 1 or trained is None):
        return None, None  # no training step, or a loop of its own: as written
    began = next((i for i, it in enumerate(first.iteration_before) if it < 0 and
                  (i + 1 < n and first.iteration_before[i + 1] >= 0 or i + 1 == n)), None)
    end = trained if trained is not None else n
    start = max((j + 1 for j in range(end) if first.builds[j]), default=0)
    if began is not None and start > began:
        return None, ("the cell's training step could not be told from the model's construction (the model ran "
                      f"before line {first.lines[start - 1][0]} built something): estimated as one pass over the cell")
    if start >= n:
        return None, None
    return start, None


def steady_code(source: str, filename: str, steps: int | None) -> types.CodeType:
    """``source`` compiled to run its training step ``steps`` times (:func:`passes`): 1 as
    written; None the steady state; N the step N times. Every statement keeps its lines."""
    tree = mark_oom_tries(ast.parse(source, filename))  # the code's own batch-size searches
    future = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    body = [s for s in tree.body if s not in future]
    if steps == 1 or not body:
        return compile(tree, filename, "exec", dont_inherit=True)
    module = ast.Module(body=[*future, _as_passes(body, steps, filename)], type_ignores=[])
    ast.fix_missing_locations(module)
    return compile(module, filename, "exec", dont_inherit=True)


def _as_passes(body: list[ast.stmt], steps: int | None, filename: str) -> ast.For:
    """``for __xmem_pass__ in passes(...): try: if __xmem_pass__.runs(i): <statement i> ...``:
    the pass decides which statements run; the names are dunders, never handed back."""
    def name(store: bool = False) -> ast.Name:
        return ast.Name("__xmem_pass__", ast.Store() if store else ast.Load())

    guarded = []
    for i, stmt in enumerate(body):
        test = ast.Call(ast.Attribute(name(), "runs", ast.Load()), [ast.Constant(i)], [])
        guarded.append(ast.copy_location(ast.If(test, [stmt], []), stmt))
    reraise = ast.If(ast.UnaryOp(ast.Not(), ast.Call(ast.Attribute(name(), "failed", ast.Load()),
                                                     [ast.Name("__xmem_error__", ast.Load())], [])),
                     [ast.Raise()], [])
    handler = ast.ExceptHandler(ast.Name("Exception", ast.Load()), "__xmem_error__", [reraise])
    guarded_try = ast.Try(guarded, [handler], [], [])
    lines = tuple((s.lineno, s.end_lineno or s.lineno) for s in body)
    module = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant(__name__)],
                      [ast.keyword("fromlist", ast.List([ast.Constant("passes")], ast.Load()))])
    passes_call = ast.Call(ast.Attribute(module, "passes", ast.Load()),
                           [ast.Constant(lines), ast.Constant(steps), ast.Constant(filename)], [])
    loop = ast.For(name(store=True), passes_call, [guarded_try], [])
    for node in (loop, guarded_try, handler, reraise):
        ast.copy_location(node, body[0])
    loop.end_lineno, loop.end_col_offset = body[-1].end_lineno, body[-1].end_col_offset
    return loop
