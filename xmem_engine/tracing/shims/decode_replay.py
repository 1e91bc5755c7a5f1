"""``generate()``'s decode steps made from their pattern, in fake mode (issue #31, item 5).

Why: a decode step runs the whole model for one new token per row. On a 1.2B Llama that is
about 2,000 aten ops, 0.12 s under the tracer, so 512 new tokens took 65 s and TRL's GRPO,
which generates before every optimizer step, minutes. Yet each step runs the same ops in the
same order as the one before; only the sizes that follow the sequence's length grow, by the
same amount every step (the KV cache's ``cat``, the attention's scores).

How: while ``generate()`` runs, the model's ``forward`` is wrapped (:class:`DecodeReplay`).
Every call runs for real at first and is recorded in a form (``decode_forms.call_form``) that leaves out
what only names it: its requests in order, each allocation with its role (freed in the step,
kept in the cache object the call was given, or returned), each free with what it frees (made
in the step, or the cache's tensor it replaces), the side records the tracer keeps with them
(GEMMs into given outputs, reductions' staging buffers as their launch plans), the inputs'
shapes, and the cache's tensors, counters and small known values after the call. Once 18
calls in a row are one affine family in the call's number (``affine.fit``, as a batch family
is in the batch size), or sixteen families over 48 calls, one per residue modulo 16 (an
attention bias padded to a multiple of 16 changes every 16th step), later calls are *made* from
it (:meth:`DecodeReplay._make`): their requests go to the tracer in the same order, the tensors
the step would keep (the cache's new keys and values) and return (the logits) are made empty
with their shapes and put where the step put them, counters and known values moved on, and the
output built as the step built it. The next call after 4, 8, 16 and 32 made ones, then after
every 32, runs for real and must equal the family's; one that does not ends the family (a note
says where: the steps made since the last check may differ from a real run's), and a new
family can be fitted on the steps that follow. Steps near a count the cache holds (a sliding
window) run for real. A model that keeps its keys and values in buffers of its own and passes
them as lists of views (Unsloth's fast decoding) gets its views made again on those buffers;
the steps near the buffers' end, where the model grows them, run for real.

A call runs for real when its inputs are not the family's (another shape, another cache), in
real mode, while a compiler traces it (``generate``'s own compile of a static cache's step
sees the model's ``forward``; the compiled call is wrapped in turn), and wherever the step
cannot be put back from its form: it frees something it was not given, keeps a tensor outside
its cache and output, or changes a larger known (shadowed) value of the cache in place.
``XMEM_REPLAY_DECODE=0`` runs every step.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from xmem_engine.affine import NotAffine, OutOfRange, anchored, evaluate, fit, rebase, steps, varies
from xmem_engine.trace import ALLOC, FREE, TraceEvent
from xmem_engine.tracing.shims.decode_forms import (VALUE, NotReplayable, call_form, extent, get, numbers_of, put,
                                                    recipe_leaves, signature, snapshot, state, tensor_meta)
from xmem_engine.tracing.shims.subclasses import storage_key

ENV = "XMEM_REPLAY_DECODE"
#: consecutive real calls a family is fitted on: with one line, the first two fit it and the
#: rest must be on it (an attention bias padded to a multiple of 16, ``pad_bias<16>``, shows
#: as a call off the line within any 16); else sixteen lines, one through every 16th call,
#: three calls each
FIT_CALLS = 18
PERIODS = (1, 16)
#: made calls between the real ones that check a family: 4, 8, 16, 32, then 32 each
CHECKS = (4, 8, 16, 32)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _near_a_limit(state_before: tuple, state_after: tuple, numbers_before: tuple, numbers_after: tuple) -> bool:
    """Whether a size or count of the cache that grows step by step is within 2 of a number
    of the cache that does not (a sliding window's length): where the step may change its
    course (the window fills and the layer keeps a slice from then on), it runs for real."""
    limits = {v for (_, v), (_, w) in zip(numbers_before, numbers_after) if type(v) is int and v == w and v > 2}
    if not limits:
        return False
    growing = [w for (_, v), (_, w) in zip(numbers_before, numbers_after) if type(v) is int and v != w]
    for a, b in zip(state_before, state_after):
        growing += [y for x, y in zip(a[1], b[1]) if x != y]
    return any(abs(g - c) <= 2 for g in growing for c in limits)


def _build(how: tuple, new: dict, args: tuple, kwargs: dict) -> Any:
    """An item of a made step's output from its recipe (``decode_forms._output_recipe``).
    (A function of the module, not a closure: a closure calling itself is a reference cycle,
    and would keep the call's arguments alive until the garbage collector frees them, in a
    later step.)"""
    kind = how[0]
    if kind == "new":
        return new.pop(("out", how[1]))
    if kind == "arg":
        return kwargs[how[1]] if isinstance(how[1], str) else args[how[1]]
    if kind == "held":
        return get(args, kwargs, how[1])
    if kind == "view":  # a view of a buffer the model keeps, reached through an argument
        _, path, shape, stride, offset = how
        return get(args, kwargs, path).as_strided(shape, stride, offset)
    if kind == "seq":
        return how[1](_build(h, new, args, kwargs) for h in how[2])
    return how[1]


def _views_fit(recipe: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether the views of buffers the model keeps that a step returns (Unsloth's keys and
    values) fit in those buffers as they are, for the recipe of a step two calls on: a step that
    outgrows its buffer grows it first (Unsloth's ``resize_`` a step before it is full), which its
    form does not hold, so the steps near that run for real."""
    for _, path, shape, stride, offset in recipe_leaves(recipe, "view"):
        t = get(args, kwargs, path)
        if (offset + extent(shape, stride)) * t.element_size() > t.untyped_storage().nbytes():
            return False
    return True


# ---------------------------------------------------------------------------- the wrapper
class _Unknown(OutOfRange):
    """A call whose residue has no line yet (too few of its calls seen): it runs for real."""


@dataclass
class _Family:
    """Calls as lines in their number: one template per residue of the call's number modulo
    ``period`` (a size padded to a multiple of 16 changes the step at every 16th token:
    sixteen lines, each through every 16th call). A residue with no line yet (``None``: a
    step of a structure no other residue has) runs for real until three of its calls give it
    one (:meth:`learn`)."""

    templates: list  # per residue: a call's form with its sizes as lines (None: not yet known)
    varies: list  # per residue, per row: whether it holds a fitted value
    period: int
    first: int  # the number of the first call it was fitted on
    last_real: int  # the last real call that matched it
    next_check: int
    checks: int = 0
    made: int = 0  # calls made since the last real one that matched
    pending: dict = field(default_factory=dict)  # residue with no line -> its real calls [(n, form)]

    def at(self, n: int) -> tuple[tuple, int]:
        """The template for call ``n`` and where on its line ``n`` is."""
        r = (n - self.first) % self.period
        if self.templates[r] is None:
            raise _Unknown
        return self.templates[r], (n - self.first) // self.period

    def part(self, n: int, i: int) -> Any:
        template, k = self.at(n)
        return evaluate(template[i], k)

    def rows(self, n: int) -> list:
        template, k = self.at(n)
        varies = self.varies[(n - self.first) % self.period]
        return [evaluate(r, k) if v else r for r, v in zip(template[0], varies)]

    def form(self, n: int) -> tuple:
        template, k = self.at(n)
        return evaluate(template, k)

    def learn(self, n: int, form: tuple) -> None:
        """A real call of a residue not yet known: its line once three such calls are on one
        (fitted on two, held by the third, as every line is)."""
        r = (n - self.first) % self.period
        calls = self.pending.setdefault(r, [])
        calls.append((n, form))
        if len(calls) < 3:
            return
        template = _line(calls[-3:], self.first, self.period)
        if template is not None:
            self.templates[r], self.varies[r] = template, [varies(row) for row in template[0]]
            del self.pending[r]


def _family(recent: list[tuple[int, tuple]], period: int) -> _Family | None:
    """A family of ``period`` lines through the consecutive calls ``recent`` (at least three
    calls a line), each line fitted on its first two calls and holding for every later one;
    None if there is none."""
    if len(recent) < 3 * period:
        return None
    n0, last = recent[0][0], recent[-1][0]
    templates = []
    for r in range(period):
        template = _line(recent[r::period], n0, period)
        if template is None:
            return None
        templates.append(template)
    return _Family(templates, [[varies(row) for row in t[0]] for t in templates], period, n0, last,
                   last + CHECKS[0] + 1)


def _on(template: Any, k: int, form: tuple) -> bool:
    try:
        return evaluate(template, k) == form
    except OutOfRange:
        return False


def _line(calls: list[tuple[int, tuple]], first: int, period: int) -> Any:
    """The line through one residue's real calls ``[(n, form)]``, fitted on the first two and
    held by the rest, its steps counted in periods from call ``first``; None if they are on none."""
    (a, fa), (b, fb) = calls[:2]
    try:
        line = fit(fa, fb, (b - a) // period, "call")
    except NotAffine:
        return None
    if not all(_on(line, (c - a) // period, fc) for c, fc in calls[2:]):
        return None
    shift = (a - first) // period
    return rebase(line, -shift, 1) if shift else line


def _family_in_one_period(recent: list[tuple[int, tuple]], period: int = 16) -> _Family | None:
    """``period`` lines from a period and two calls (``FIT_CALLS``) rather than three periods: a
    residue seen twice is fitted on its own calls; one seen once takes the steps of a fitted
    line whose calls have its structure (sizes linear in the call's number, or padded to a
    multiple of 8 or 16, move by the same amount every 16 calls, whatever the residue); one of a
    structure no line has runs for real until it has a line of its own (:meth:`_Family.learn`).
    Real calls at intervals check every line made so."""
    n0 = recent[0][0]
    by_residue: dict[int, list] = {}
    for n, f in recent:
        by_residue.setdefault((n - n0) % period, []).append((n, f))
    if len(by_residue) < period:
        return None
    own: dict[int, tuple] = {}  # residue -> (its line, which of its rows vary)
    for r, calls in by_residue.items():
        if len(calls) >= 2:
            line = _line(calls, n0, period)
            if line is None:
                return None
            own[r] = (line, [varies(row) for row in line[0]])
    if not own:
        return None
    moves: dict[int, list[int]] = {}  # lines of one structure (as many slopes) move alike, or none is a line
    for line, _ in own.values():
        if moves.setdefault(len(s := steps(line)), s) != s:
            return None
    templates: list = [own[r][0] if r in own else None for r in range(period)]
    rows_vary: list = [own[r][1] if r in own else None for r in range(period)]
    for r in range(period):
        if templates[r] is not None:
            continue
        n, f = by_residue[r][0]
        for line, line_varies in own.values():
            try:  # (its rows vary where the line's do)
                templates[r], rows_vary[r] = anchored(line, f, (n - n0) // period, "call"), line_varies
                break
            except NotAffine:
                continue
    last = recent[-1][0]
    fam = _Family(templates, rows_vary, period, n0, last, last + CHECKS[0] + 1)
    for r in range(period):
        if templates[r] is None:
            for n, f in by_residue[r]:
                fam.learn(n, f)
    return fam


class DecodeReplay:
    """The wrapper of one ``generate()``'s model ``forward`` (module docstring)."""

    def __init__(self, tracer: Any, forward: Callable[..., Any]):
        self.tr = tracer
        self.forward = forward
        self.calls = 0
        self.recent: list[tuple[int, Any]] = []  # (call number, form) of the last real calls in a row
        self.family: _Family | None = None
        self.off = False
        self.made = 0
        self.diverged: list[str] = []  # "first-last" call numbers made before a check that differed
        self.next_fit: dict[int, int] = {}  # period -> the first call number to try it at again
        functools.update_wrapper(self, forward, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.off or torch.compiler.is_compiling():
            return self.forward(*args, **kwargs)
        self.calls += 1
        n = self.calls
        fam = self.family
        if fam is not None and n < fam.next_check:
            out = self._try_make(fam, n, args, kwargs)
            if out is not NotImplemented:
                return out
        tr = self.tr
        try:
            snap = snapshot(tr, args, kwargs)
        except Exception:  # noqa: BLE001 - a state this cannot read: the call runs, as every call would
            snap = None
        out = self.forward(*args, **kwargs)
        try:
            if snap is None:
                raise NotReplayable("its state could not be read")
            form = call_form(tr, snap, args, kwargs, out)
        except Exception:  # noqa: BLE001 - NotReplayable, or a step this form cannot read: the call ran, for real
            if fam is not None:
                self._check(fam, n, None)
            self.recent.clear()
            self.family = None
            return out
        if fam is not None:
            self._check(fam, n, form)
        if self.recent and self.recent[-1][0] != n - 1:
            self.recent.clear()
        self.recent = [*self.recent[-(3 * max(PERIODS) - 1):], (n, form)]
        if self.family is None:
            self._fit()
        return out

    # ------------------------------------------------------------------ families
    def _fit(self) -> None:
        n = self.recent[-1][0]
        for period in PERIODS:
            size = FIT_CALLS if period == 1 else 3 * period
            if len(self.recent) < size:
                return
            if n < self.next_fit.get(period, 0):
                continue
            fam = _family(self.recent[-size:], period)
            if fam is None and period == 1:
                fam = _family_in_one_period(self.recent[-size:])
            if fam is not None:
                self.family = fam
                return
            if period > 1:  # a step that is no family of that period: not tried again for a period
                self.next_fit[period] = n + period

    def _check(self, fam: _Family, n: int, form: tuple | None) -> None:
        """A real call while a family holds: it must be the family's (None: a call that
        cannot be made from a form at all), or it teaches the family a residue not yet known."""
        try:
            expected = fam.form(n)
        except _Unknown:
            if form is not None:
                fam.learn(n, form)
                return
            expected = None
        except OutOfRange:
            expected = None
        if expected == form:
            fam.checks += 1
            fam.last_real = n
            fam.made = 0
            fam.next_check = n + CHECKS[min(fam.checks, len(CHECKS) - 1)] + 1
            return
        if fam.made:  # made calls since the last real one that matched: they may be wrong
            self.diverged.append(f"{fam.last_real + 1}-{n - 1}")
        self.family = None
        self.recent.clear()

    def _try_make(self, fam: _Family, n: int, args: tuple, kwargs: dict) -> Any:
        try:
            inputs, numbers_after, recipe, sdpa, launched = (fam.part(n, i) for i in (1, 3, 4, 5, 6))
            state_before, numbers_before = (fam.part(n - 1, i) for i in (2, 3))
            if signature(args, kwargs) != inputs:
                return NotImplemented
            tensors, numbers = state(args, kwargs, self.tr)
        except Exception:  # noqa: BLE001 - OutOfRange, NotReplayable, or inputs this cannot read: run it
            return NotImplemented
        same = tuple(tensor_meta(p, t) for p, t in tensors.items()) == state_before and \
            numbers_of(numbers) == numbers_before
        del tensors
        try:
            if not same or _near_a_limit(state_before, fam.part(n, 2), numbers_before, numbers_after) \
                    or not _views_fit(fam.part(n + 2, 4), args, kwargs):
                return NotImplemented
            rows = fam.rows(n)
        except OutOfRange:
            return NotImplemented
        out = self._make(rows, recipe, numbers_after, sdpa, launched, args, kwargs)
        self.made += 1
        fam.made += 1
        return out

    # ------------------------------------------------------------------ making a step
    def _make(self, rows: list, recipe: tuple, numbers: tuple, sdpa: int, launched: tuple, args: tuple,
              kwargs: dict) -> Any:
        """The step's requests, in order, to the tracer; the tensors it keeps made and put in
        place; its output built (module docstring)."""
        from xmem_engine.tracing.kernels.cuda_temporaries import BySM

        tr = self.tr
        allocs: dict[int, TraceEvent] = {}
        new: dict[tuple, torch.Tensor] = {}
        made_by_key = {how[1]: how for how in recipe_leaves(recipe, "new")}
        for i, row in enumerate(rows):
            kind = row[0]
            if kind == "A":
                _, nbytes, stream, category, op, module, phase, dtype, shape, source, iteration, role = row
                ev = TraceEvent(ALLOC, bytes=nbytes, stream=stream, category=category, op=op, module=module,
                                phase=phase, dtype=dtype, shape=shape, source=source, iteration=iteration)
                if role[0] == "local":
                    allocs[i] = tr.add_event(ev)
                else:
                    _, key, t_shape, t_stride, t_dtype, device, *offset = role if role[0] == "state" \
                        else made_by_key[role[1]]
                    new[(role[0], key)] = self._tensor(ev, t_shape, t_stride, t_dtype, device, *offset)
            elif kind == "F":
                _, ref, module, phase, iteration = row
                if ref[0] == "local":
                    a = allocs.pop(ref[1])
                    tr.add_event(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=a.stream, category=a.category,
                                            op=a.op, module=module, phase=phase, dtype=a.dtype, shape=a.shape,
                                            iteration=iteration))
                else:  # the cache's tensor replaced: it dies as its replacement takes its place
                    before = len(tr.events)
                    put(args, kwargs, ref[1], new.pop(("state", ref[1])))
                    for e in tr.events[before:]:  # freed here, not in the module that replaced it
                        e.module, e.phase, e.iteration = module, phase, iteration
            elif kind == "G":  # a reduction's staging buffers, from its launch plan
                _, plan_args, stream, op, module, _phase, source, _iteration = row
                tr.labelled_transients(BySM(tuple(plan_args)).steps(tr.cuda_device), op, module, source, stream,
                                       plan_args)
            elif kind == "M":  # a GEMM into a given tensor (its cuBLAS workspace)
                tr.gemm_into.append([len(tr.events), *row[1:]])
        for key in [k for k in new if k[0] == "state"]:
            put(args, kwargs, key[1], new.pop(key))
        for path, value in numbers:
            if path[-1] == VALUE:  # a known value kept on the device: the shadow takes the step's
                t = get(args, kwargs, path[:-1])
                real = tr.shadows.real(t)
                with torch._C._DisableTorchDispatch():  # a host tensor's value, not an op of the step
                    real.copy_(torch.tensor(value, dtype=real.dtype).reshape(real.shape))
                del t, real
            else:
                put(args, kwargs, path, value)
        tr.sdpa_calls += sdpa
        for key, count in launched:  # the step's Triton launches, counted as if run
            tr.triton.add(key, count)
        cls, how_items = recipe
        items = {key: _build(how, new, args, kwargs) for key, how in how_items}
        if cls is torch.Tensor:
            return items[0]
        if cls is tuple:
            return tuple(items[i] for i in range(len(items)))
        return cls(**items)

    def release(self) -> None:
        """Let go of the wrapped call once its ``generate()`` is over: nothing of the model may
        outlive it here (a wrapper in a reference cycle waits for the garbage collector, and
        would keep the model's tensors alive until then)."""
        self.forward = self.__wrapped__ = None  # type: ignore[assignment]

    def _tensor(self, ev: TraceEvent, shape: tuple, stride: tuple, dtype: str, device: str,
                offset: int = 0) -> torch.Tensor:
        """An empty tensor the step would keep, allocated through the tracer (its event then
        says what the step's said): a storage of the step's bytes, viewed as the tensor it
        kept (Inductor returns the logits as a view of a padded buffer; a full sliding window
        keeps its last tokens, a view at an offset)."""
        torch_dtype = getattr(torch, dtype)
        if not offset and extent(shape, stride) * torch_dtype.itemsize == ev.bytes:  # the tensor is its storage
            t = torch.empty_strided(shape, stride, dtype=torch_dtype, device=device)
        else:
            base = torch.empty_strided((ev.bytes // torch_dtype.itemsize,), (1,), dtype=torch_dtype, device=device)
            t = base.as_strided(shape, stride, offset)
            del base
        rec = self.tr.live.get(storage_key(t))
        if rec is None or rec.event is None or rec.event.bytes != ev.bytes:
            raise RuntimeError(f"xmem: a made decode step's tensor of shape {shape} took "
                               f"{rec.event.bytes if rec and rec.event else 0} bytes where its step's took {ev.bytes}")
        e = rec.event
        for name in ("category", "op", "module", "phase", "dtype", "shape", "source", "iteration"):
            setattr(e, name, getattr(ev, name))
        return t


@contextlib.contextmanager
def wrapped_forward(tracer: Any, model: Any) -> Iterator[DecodeReplay]:
    """``model.forward`` replaced by a :class:`DecodeReplay` while the block runs, and put back
    as it was after (an attribute of its own, as accelerate's wrappers are, or the class's).
    :meth:`DecodeReplay.set_aside` puts it back early (before a compiler sees it)."""
    own = "forward" in vars(model)
    before = vars(model).get("forward")
    replay = DecodeReplay(tracer, model.forward)

    def restore() -> None:
        if vars(model).get("forward") is replay:
            if own:
                object.__setattr__(model, "forward", before)
            else:
                del vars(model)["forward"]
        replay.off = True

    replay.set_aside = restore  # type: ignore[attr-defined]
    object.__setattr__(model, "forward", replay)
    try:
        yield replay
    finally:
        restore()
        replay.set_aside = None  # type: ignore[attr-defined]
        replay.release()
