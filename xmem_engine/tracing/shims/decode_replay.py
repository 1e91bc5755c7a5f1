"""``generate()``'s decode steps made from their pattern, in fake mode (issue #31, item 5).

Why: a decode step runs the whole model for one new token per row. On a 1.2B Llama that is
about 2,000 aten ops, 0.12 s under the tracer, so 512 new tokens took 65 s and TRL's GRPO,
which generates before every optimizer step, minutes. Yet each step runs the same ops in the
same order as the one before; only the sizes that follow the sequence's length grow, by the
same amount every step (the KV cache's ``cat``, the attention's scores).

How: while ``generate()`` runs, the model's ``forward`` is wrapped (:class:`DecodeReplay`).
Every call runs for real at first and is recorded in a form (:func:`_form`) that leaves out
what only names it: its requests in order, each allocation with its role (freed in the step,
kept in the cache object the call was given, or returned), each free with what it frees (made
in the step, or the cache's tensor it replaces), the side records the tracer keeps with them
(GEMMs into given outputs, reductions' staging buffers as their launch plans), the inputs'
shapes, and the cache's tensors and counters after the call. Once three calls in a row are one
affine family in the call's number (``affine.fit``, as a batch family is in the batch size),
later calls are *made* from the family (:meth:`DecodeReplay._make`): their requests go to the
tracer in the same order, the tensors the step would keep (the cache's new keys and values)
and return (the logits) are made empty with their shapes and put where the step put them,
counters moved on, and the output built as the step built it. The next call after 4, 8, 16
and 32 made ones, then after every 32, runs for real and must equal the family's; one that
does not ends the family (a note says where: the steps made since the last check may differ
from a real run's), and a new family can be fitted on the steps that follow.

A call runs for real when its inputs are not the family's (another shape, another cache), in
real mode, under a compiler (``generate``'s own compile of a static cache's step sets the
wrapper aside), and wherever the step cannot be put back from its form: it frees something it
was not given, keeps a tensor outside its cache and output, or changes a known (shadowed)
value of the cache in place. ``XMEM_REPLAY_DECODE=0`` runs every step.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from xmem_engine.affine import NotAffine, OutOfRange, evaluate, fit, varies
from xmem_engine.trace import ALLOC, FREE, Category, TraceEvent

ENV = "XMEM_REPLAY_DECODE"
#: consecutive real calls a family is fitted on: with one line, the first two fit it and the
#: rest must be on it (an attention bias padded to a multiple of 16, ``pad_bias<16>``, shows
#: as a call off the line within any 16); else sixteen lines, one through every 16th call,
#: three calls each
FIT_CALLS = 18
PERIODS = (1, 16)
#: made calls between the real ones that check a family: 4, 8, 16, 32, then 32 each
CHECKS = (4, 8, 16, 32)
_STATE_DEPTH = 4
#: a state tensor's known value (its shadow) is a number of the state up to this many elements
KNOWN_NUMEL = 8
VALUE = "<value>"

Path = tuple


class NotReplayable(Exception):
    """A call whose step cannot be made from its form (the message says why)."""


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# ---------------------------------------------------------------------------- the state
def _walk(obj: Any, path: Path, tensors: dict, numbers: dict, seen: set, depth: int) -> None:
    """The tensors and numbers a state object (a cache) holds, by path: its attributes, lists
    and dicts, down to the transformers objects it is made of."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return
    if type(obj) in (int, float, bool):
        numbers[path] = obj
        return
    if obj is None or isinstance(obj, (str, bytes, torch.dtype, torch.device, torch.nn.Module, type)) \
            or callable(obj) or depth > _STATE_DEPTH:
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _walk(x, path + (i,), tensors, numbers, seen, depth + 1)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            if isinstance(k, (str, int)):
                _walk(x, path + (k,), tensors, numbers, seen, depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("transformers.") \
            and not type(obj).__name__.endswith("Config"):
        for k, x in vars(obj).items():
            _walk(x, path + (k,), tensors, numbers, seen, depth + 1)


def _is_state(x: Any) -> bool:
    """An argument the step may change in place (a cache object), not a value."""
    return hasattr(x, "__dict__") and not isinstance(x, (torch.Tensor, torch.nn.Module, type))


def _signature(args: tuple, kwargs: dict) -> tuple:
    """The call's inputs as a family compares them: tensors by shape, strides, dtype and
    device; state objects by type; plain values as they are; and whether autograd records
    and autocast casts (a made step records no graph)."""

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device))
        if x is None or type(x) in (int, float, bool, str):
            return x
        if _is_state(x):
            return ("O", type(x).__qualname__)
        if isinstance(x, (list, tuple)) and all(y is None or type(y) in (int, float, bool, str) for y in x):
            return tuple(x)
        raise NotReplayable(f"an argument of type {type(x).__name__}")

    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cuda"),
             str(torch.get_autocast_dtype("cuda")))
    return tuple(one(a) for a in args), tuple((k, one(kwargs[k])) for k in sorted(kwargs)), modes


def _roots(args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    """(name, object) of the call's state objects."""
    out = [(i, a) for i, a in enumerate(args) if _is_state(a)]
    out += [(k, v) for k, v in sorted(kwargs.items()) if _is_state(v)]
    return out


def _state(args: tuple, kwargs: dict, tr: Any = None) -> tuple[dict, dict]:
    """The state objects' tensors and numbers by path; with the tracer, the known values of
    their small tensors too (a static cache's length: a count kept on the device), as numbers
    at ``path + (VALUE,)``."""
    tensors: dict = {}
    numbers: dict = {}
    seen: set = set()
    for name, obj in _roots(args, kwargs):
        _walk(obj, (name,), tensors, numbers, seen, 0)
    shadows = tr.shadows if tr is not None else None
    if shadows is not None and len(shadows):
        for path, t in tensors.items():
            if t.numel() <= KNOWN_NUMEL:
                real = shadows.real(t)
                if real is not None:
                    with torch._C._DisableTorchDispatch():
                        numbers[path + (VALUE,)] = tuple(real.reshape(-1).tolist())
    return tensors, numbers


def _container(args: tuple, kwargs: dict, path: Path) -> tuple[Any, Any]:
    """The object holding ``path``'s last step, and that step."""
    head, *rest = path
    obj = kwargs[head] if isinstance(head, str) else args[head]
    for step in rest[:-1]:
        obj = obj[step] if isinstance(obj, (list, tuple, dict)) else getattr(obj, step)
    return obj, rest[-1]


def _put(args: tuple, kwargs: dict, path: Path, value: Any) -> None:
    obj, last = _container(args, kwargs, path)
    if isinstance(obj, (list, dict)):
        obj[last] = value
    else:
        setattr(obj, last, value)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


# ---------------------------------------------------------------------------- a call's form
@dataclass
class _Snapshot:
    """What :func:`_form` needs of the state before a call (no tensor is held: holding one
    would keep a cache tensor alive past the moment the step frees it)."""

    ids: dict  # event id of a state tensor's storage -> its path
    versions: dict  # path -> (storage key, version, shadowed)
    events: int
    gemms: int
    groups: int
    convs: int
    sdpa: int


def _snapshot(tr: Any, args: tuple, kwargs: dict) -> _Snapshot:
    tensors, _ = _state(args, kwargs)
    ids, versions = {}, {}
    for path, t in tensors.items():
        rec = tr.live.get(_storage_key(t))
        if rec is not None and rec.event is not None:
            ids[rec.event.id] = path
        versions[path] = (_storage_key(t), t._version, tr.shadows is not None and tr.shadows.real(t) is not None)
    del tensors
    return _Snapshot(ids, versions, len(tr.events), len(tr.gemm_into), len(tr.by_sm), len(tr.conv_calls), tr.sdpa_calls)


def _output_recipe(tr: Any, out: Any, args: tuple, kwargs: dict, made: set, held: dict) -> tuple:
    """How the call's output is built again: its type and, per item, a tensor the step made
    (``("new", key, shape, strides, dtype, device)``), one of the call's arguments
    (``("arg", name)``), a tensor they hold (``("held", path)``: an encoder's output passed
    back) or a plain value (``("value", v)``). ``held``: id of a tensor -> its path."""
    given = {id(v): k for k, v in [*enumerate(args), *kwargs.items()]}
    if not (isinstance(out, (dict, torch.Tensor)) or type(out) is tuple):
        raise NotReplayable(f"returns a {type(out).__name__}")
    items, seen = [], set()
    for key, v in _items(out):
        if isinstance(v, torch.Tensor) and id(v) in held:
            how = ("held", held[id(v)])
        elif isinstance(v, torch.Tensor):
            r = tr.live.get(_storage_key(v))
            if r is None or r.event is None or r.event.id not in made or v.storage_offset() != 0:
                raise NotReplayable(f"returns a tensor ({key}) it did not make")
            if r.event.id in seen:
                raise NotReplayable(f"returns one tensor twice ({key})")
            seen.add(r.event.id)
            how = ("new", key, tuple(v.shape), tuple(v.stride()), str(v.dtype).removeprefix("torch."), str(v.device))
        elif id(v) in given:
            how = ("arg", given[id(v)])
        elif v is None or type(v) in (int, float, bool, str):
            how = ("value", v)
        else:
            raise NotReplayable(f"returns a {type(v).__name__} ({key})")
        items.append((key, how))
    cls = torch.Tensor if isinstance(out, torch.Tensor) else type(out)
    return (cls, tuple(items))


def _form(tr: Any, snap: _Snapshot, args: tuple, kwargs: dict, out: Any) -> tuple:
    """The call just made, as a family compares and makes it (module docstring). Raises
    :class:`NotReplayable` where the step cannot be made again from it."""
    if len(tr.conv_calls) != snap.convs:
        raise NotReplayable("it ran convolutions")
    events = tr.events
    end = len(events)
    groups: dict[int, list] = {}
    for g in tr.by_sm[snap.groups:]:
        groups.setdefault(g[0], []).append(g)
    gemms: dict[int, list] = {}
    for g in tr.gemm_into[snap.gemms:]:
        gemms.setdefault(g[0], []).append(g)
    rows: list = []
    made: dict[int, int] = {}  # alloc id -> its row
    skip_to = snap.events
    for i in range(snap.events, end + 1):
        for g in gemms.get(i, ()):
            rows.append(("M", *g[1:]))
        for g in groups.get(i, ()):
            rows.append(("G", *g[2:]))
            skip_to = max(skip_to, i + g[1])
        if i == end:
            break
        if i < skip_to:
            continue
        e = events[i]
        if e.kind == ALLOC:
            made[e.id] = len(rows)
            rows.append(["A", e.bytes, e.stream, e.category, e.op, e.module, e.phase, e.dtype, tuple(e.shape or ()),
                         e.source, e.iteration, ("local",)])
        elif e.kind == FREE:
            if e.id in made:
                ref = ("local", made.pop(e.id))
            elif e.id in snap.ids:
                ref = ("state", snap.ids[e.id])
            else:
                raise NotReplayable(f"it frees a tensor it was not given ({e.op})")
            rows.append(("F", ref, e.module, e.phase, e.iteration))
        else:
            raise NotReplayable(f"a {e.kind} event in the step")
    # what the step keeps: the cache's new tensors and the output
    tensors, numbers = _state(args, kwargs, tr)
    kept: dict[int, tuple] = {}  # event id -> (path, tensor) of the cache after the call
    for path, t in tensors.items():
        r = tr.live.get(_storage_key(t))
        if r is not None and r.event is not None and r.event.id in made:
            if r.event.id in kept or t.storage_offset() != 0:
                raise NotReplayable(f"keeps a view at {path}")
            kept[r.event.id] = (path, t)
    recipe = _output_recipe(tr, out, args, kwargs, set(made) - set(kept),
                            {id(t): path for path, t in tensors.items()})
    returned = {how[1]: how for _, how in recipe[1] if how[0] == "new"}
    returned_ids = {}
    values = dict(_items(out))
    for key, how in recipe[1]:
        if how[0] == "new":
            returned_ids[tr.live[_storage_key(values[key])].event.id] = key
    del values
    for event_id, row in made.items():
        holder = kept.get(event_id, (None, None))[1]
        if holder is None and event_id in returned_ids:
            holder = dict(_items(out))[returned_ids[event_id]]
        if holder is not None and not _fits(rows[row][1], holder):
            raise NotReplayable(f"keeps a tensor its storage cannot be made for ({rows[row][4]})")
        del holder
        if event_id in kept:
            path, t = kept[event_id]
            rows[row][-1] = ("state", path, tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."),
                             str(t.device))
        elif event_id in returned_ids and returned_ids[event_id] in returned:
            rows[row][-1] = ("out", returned_ids[event_id])
        else:
            raise NotReplayable(f"keeps a tensor outside its cache and output ({rows[row][4]})")
    kept.clear()
    # a replaced cache tensor is freed only once its replacement exists
    placed = set()
    for r in rows:
        if r[0] == "A" and r[-1][0] == "state":
            placed.add(r[-1][1])
        elif r[0] == "F" and r[1][0] == "state" and r[1][1] not in placed:
            raise NotReplayable(f"frees the cache's {r[1][1]} before making its replacement")
    state = []
    for path, t in tensors.items():
        key, version, shadowed = snap.versions.get(path, (None, None, False))
        if key == _storage_key(t) and t._version != version and shadowed and path + (VALUE,) not in numbers:
            raise NotReplayable(f"changes a known value in place ({path})")
        state.append(_tensor_meta(path, t))
    del tensors
    return (tuple(tuple(r) for r in rows), _signature(args, kwargs), tuple(state), _numbers(numbers), recipe,
            tr.sdpa_calls - snap.sdpa)


def _extent(shape: tuple, stride: tuple) -> int:
    """Elements a storage needs for a tensor of ``shape`` and ``stride`` at offset 0."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _fits(nbytes: int, t: torch.Tensor) -> bool:
    """Whether ``t`` can be made again as a view at offset 0 of a storage of ``nbytes``."""
    size = t.element_size()
    return nbytes % size == 0 and _extent(tuple(t.shape), tuple(t.stride())) * size <= nbytes


def _tensor_meta(path: Path, t: torch.Tensor) -> tuple:
    return (path, tuple(t.shape), tuple(t.stride()), str(t.dtype))


def _numbers(numbers: dict) -> tuple:
    return tuple(sorted(numbers.items(), key=repr))


def _items(out: Any) -> list[tuple[Any, Any]]:
    """(key, value) of a call's output: a ModelOutput's items, a tuple's, or the tensor."""
    if isinstance(out, dict):
        return list(out.items())
    if type(out) is tuple:
        return list(enumerate(out))
    return [(0, out)]


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


# ---------------------------------------------------------------------------- the wrapper
@dataclass
class _Family:
    """Calls as lines in their number: one template per residue of the call's number modulo
    ``period`` (a size padded to a multiple of 16 changes the step at every 16th token:
    sixteen lines, each through every 16th call)."""

    templates: list  # per residue: a call's form with its sizes as lines
    varies: list  # per residue, per row: whether it holds a fitted value
    period: int
    first: int  # the number of the first call it was fitted on
    last_real: int  # the last real call that matched it
    next_check: int
    checks: int = 0
    made: int = 0  # calls made since the last real one that matched

    def at(self, n: int) -> tuple[tuple, int]:
        """The template for call ``n`` and where on its line ``n`` is."""
        return self.templates[(n - self.first) % self.period], (n - self.first) // self.period

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


def _family(recent: list[tuple[int, tuple]], period: int) -> _Family | None:
    """A family of ``period`` lines through the consecutive calls ``recent`` (at least three
    calls a line), each line fitted on its first two calls and holding for every later one;
    None if there is none."""
    if len(recent) < 3 * period:
        return None
    forms = [f for _, f in recent]
    templates = []
    try:
        for r in range(period):
            line = forms[r::period]
            template = fit(line[0], line[1], 1, "call")
            if any(evaluate(template, k) != f for k, f in enumerate(line[2:], 2)):
                return None
            templates.append(template)
    except (NotAffine, OutOfRange):
        return None
    n0, last = recent[0][0], recent[-1][0]
    return _Family(templates, [[varies(row) for row in t[0]] for t in templates], period, n0, last,
                   last + CHECKS[0] + 1)


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
            snap = _snapshot(tr, args, kwargs)
        except Exception:  # noqa: BLE001 - a state this cannot read: the call runs, as every call would
            snap = None
        out = self.forward(*args, **kwargs)
        try:
            if snap is None:
                raise NotReplayable("its state could not be read")
            form = _form(tr, snap, args, kwargs, out)
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
            if fam is not None:
                self.family = fam
                return
            if period > 1:  # a step that is no family of that period: not tried again for a period
                self.next_fit[period] = n + period

    def _check(self, fam: _Family, n: int, form: tuple | None) -> None:
        """A real call while a family holds: it must be the family's (None: a call that
        cannot be made from a form at all)."""
        try:
            expected = fam.form(n)
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
            signature, numbers_after, recipe, sdpa = (fam.part(n, i) for i in (1, 3, 4, 5))
            state_before, numbers_before = (fam.part(n - 1, i) for i in (2, 3))
            if _signature(args, kwargs) != signature:
                return NotImplemented
            tensors, numbers = _state(args, kwargs, self.tr)
        except Exception:  # noqa: BLE001 - OutOfRange, NotReplayable, or inputs this cannot read: run it
            return NotImplemented
        same = tuple(_tensor_meta(p, t) for p, t in tensors.items()) == state_before and \
            _numbers(numbers) == numbers_before
        del tensors
        try:
            if not same or _near_a_limit(state_before, fam.part(n, 2), numbers_before, numbers_after):
                return NotImplemented
            rows = fam.rows(n)
        except OutOfRange:
            return NotImplemented
        out = self._make(rows, recipe, numbers_after, sdpa, args, kwargs)
        self.made += 1
        fam.made += 1
        return out

    # ------------------------------------------------------------------ making a step
    def _make(self, rows: list, recipe: tuple, numbers: tuple, sdpa: int, args: tuple, kwargs: dict) -> Any:
        """The step's requests, in order, to the tracer; the tensors it keeps made and put in
        place; its output built (module docstring)."""
        from xmem_engine.tracing.kernels.cuda_temporaries import BySM

        tr = self.tr
        allocs: dict[int, TraceEvent] = {}
        new: dict[tuple, torch.Tensor] = {}
        made_by_key = {how[1]: how for _, how in recipe[1] if how[0] == "new"}
        for i, row in enumerate(rows):
            kind = row[0]
            if kind == "A":
                _, nbytes, stream, category, op, module, phase, dtype, shape, source, iteration, role = row
                ev = TraceEvent(ALLOC, bytes=nbytes, stream=stream, category=category, op=op, module=module,
                                phase=phase, dtype=dtype, shape=shape, source=source, iteration=iteration)
                if role[0] == "local":
                    allocs[i] = tr.add_event(ev)
                else:
                    _, key, t_shape, t_stride, t_dtype, device = role if role[0] == "state" else made_by_key[role[1]]
                    new[(role[0], key)] = self._tensor(ev, t_shape, t_stride, t_dtype, device)
            elif kind == "F":
                _, ref, module, phase, iteration = row
                if ref[0] == "local":
                    a = allocs.pop(ref[1])
                    tr.add_event(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=a.stream, category=a.category,
                                            op=a.op, module=module, phase=phase, dtype=a.dtype, shape=a.shape,
                                            iteration=iteration))
                else:  # the cache's tensor replaced: it dies as its replacement takes its place
                    before = len(tr.events)
                    _put(args, kwargs, ref[1], new.pop(("state", ref[1])))
                    for e in tr.events[before:]:  # freed here, not in the module that replaced it
                        e.module, e.phase, e.iteration = module, phase, iteration
            elif kind == "G":  # a reduction's staging buffers, from its launch plan
                _, plan_args, stream, op, module, phase, source, iteration = row
                at, slots = len(tr.events), {}
                for action, slot, nbytes in BySM(tuple(plan_args)).steps(tr.cuda_device):
                    if action == "alloc":
                        slots[slot] = tr.add_event(TraceEvent(
                            ALLOC, bytes=nbytes, stream=stream, category=Category.TEMPORARY, op=op, module=module,
                            phase=phase, dtype="uint8", shape=(nbytes,), source=source))
                    else:
                        a = slots.pop(slot)
                        tr.add_event(TraceEvent(FREE, id=a.id, bytes=a.bytes, stream=stream, category=a.category,
                                                op=op, module=module, phase=phase, dtype=a.dtype, shape=a.shape,
                                                iteration=iteration))
                tr.by_sm.append([at, len(tr.events) - at, plan_args, stream, op, module, phase, source, iteration])
            elif kind == "M":  # a GEMM into a given tensor (its cuBLAS workspace)
                tr.gemm_into.append([len(tr.events), *row[1:]])
        for key in [k for k in new if k[0] == "state"]:
            _put(args, kwargs, key[1], new.pop(key))
        for path, value in numbers:
            if path[-1] == VALUE:  # a known value kept on the device: the shadow takes the step's
                obj, last = _container(args, kwargs, path[:-1])
                t = obj[last] if isinstance(obj, (list, tuple, dict)) else getattr(obj, last)
                real = tr.shadows.real(t)
                with torch._C._DisableTorchDispatch():  # a host tensor's value, not an op of the step
                    real.copy_(torch.tensor(value, dtype=real.dtype).reshape(real.shape))
                del t, real
            else:
                _put(args, kwargs, path, value)
        tr.sdpa_calls += sdpa
        cls, how_items = recipe
        items = {}
        for key, how in how_items:
            if how[0] == "new":
                items[key] = new.pop(("out", key))
            elif how[0] == "arg":
                items[key] = kwargs[how[1]] if isinstance(how[1], str) else args[how[1]]
            elif how[0] == "held":
                obj, last = _container(args, kwargs, how[1])
                items[key] = obj[last] if isinstance(obj, (list, tuple, dict)) else getattr(obj, last)
            else:
                items[key] = how[1]
        if cls is torch.Tensor:
            return items[0]
        if cls is tuple:
            return tuple(items[i] for i in range(len(items)))
        return cls(**items)

    def _tensor(self, ev: TraceEvent, shape: tuple, stride: tuple, dtype: str, device: str) -> torch.Tensor:
        """An empty tensor the step would keep, allocated through the tracer (its event then
        says what the step's said): a storage of the step's bytes, viewed as the tensor it
        kept (Inductor returns the logits as a view of a padded buffer)."""
        torch_dtype = getattr(torch, dtype)
        if _extent(shape, stride) * torch_dtype.itemsize == ev.bytes:  # the usual case: the tensor is its storage
            t = torch.empty_strided(shape, stride, dtype=torch_dtype, device=device)
        else:
            base = torch.empty_strided((ev.bytes // torch_dtype.itemsize,), (1,), dtype=torch_dtype, device=device)
            t = base.as_strided(shape, stride, 0)
            del base
        rec = self.tr.live.get(_storage_key(t))
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
        # nothing of the model outlives the call (the wrapper and its closure are a cycle, left
        # to the garbage collector: it must not keep the model's tensors alive until then)
        replay.forward = replay.__wrapped__ = replay.set_aside = None  # type: ignore[attr-defined]
