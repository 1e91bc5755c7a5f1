"""A model call of ``generate()``'s loop as a form: what ``decode_replay.py`` fits and makes.

A form leaves out what only names a call: its requests in order, each allocation with its role
(freed in the step, kept in the cache object the call was given, or returned), each free with
what it frees, the records the tracer keeps beside the events (GEMMs into given outputs,
reductions' staging buffers as their launch plans, Triton launches counted), the inputs' shapes
(lists of tensors too: Unsloth passes its cache as lists of views), how its output is built
(``_output_recipe``), and the cache's
tensors, counters and small known values after the call. Two forms of the same step a token
apart differ only in integers (``affine.fit``). The state of a call is read by path from its
arguments (``("past_key_values", "layers", 3, "keys")``), without holding a tensor past the
moment the step would free it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from xmem_engine.trace import ALLOC, FREE
from xmem_engine.tracing.shims.subclasses import storage_key

_STATE_DEPTH = 4
#: a state tensor's known value (its shadow) is a number of the state up to this many elements
KNOWN_NUMEL = 8
VALUE = "<value>"

Path = tuple


class NotReplayable(Exception):
    """A call whose step cannot be made from its form (the message says why)."""


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


def _input(x: Any, top: bool = True) -> Any:
    """One input as :func:`signature` compares it. Lists, tuples and dicts may hold tensors (a
    cache passed as lists of views: Unsloth's; attention masks by layer type) and plain values,
    not state objects: a step may change those, and only the call's own arguments are read as
    state."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device))
    if x is None or type(x) in (int, float, bool, str):
        return x
    if _is_block_mask(x):
        return _block_mask(x)
    if top and _is_state(x):
        return ("O", type(x).__qualname__)
    if type(x) in (list, tuple):
        return (type(x).__name__, tuple(_input(y, False) for y in x))
    if type(x) is dict and all(type(k) is str for k in x):  # masks by layer type (transformers 5's)
        return ("dict", tuple((k, _input(x[k], False)) for k in sorted(x)))
    raise NotReplayable(f"an argument of type {type(x).__name__}" + ("" if top else " in a list"))


def _is_block_mask(x: Any) -> bool:
    return type(x).__name__ == "BlockMask" and type(x).__module__ == "torch.nn.attention.flex_attention"


def _block_mask(x: Any) -> tuple:
    """Flex attention's ``BlockMask`` as :func:`signature` compares it: a value, not state (a
    step reads it): its lengths, block size, tensors and mask function. Gemma 3's masks by layer
    type are block masks where Unsloth gives it flex attention (GPUs with bf16); the number of
    key blocks grows every ``BLOCK_SIZE`` tokens, a call off the family's line, which runs."""
    fn = x.mask_mod
    code = getattr(fn, "__code__", None)
    where = (code.co_filename, code.co_firstlineno) if code is not None else type(fn).__qualname__
    return ("BlockMask", tuple(x.seq_lengths), tuple(x.BLOCK_SIZE), where,
            tuple(_input(getattr(x, a), False) for a in x._TENSOR_ATTRS))


def signature(args: tuple, kwargs: dict) -> tuple:
    """The call's inputs as a family compares them: tensors by shape, strides, dtype and
    device; state objects by type; plain values as they are; lists of these item by item; and
    whether autograd records and autocast casts (a made step records no graph)."""
    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cuda"),
             str(torch.get_autocast_dtype("cuda")))
    return tuple(_input(a) for a in args), tuple((k, _input(kwargs[k])) for k in sorted(kwargs)), modes


def _roots(args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    """(name, object) of the call's state objects."""
    out = [(i, a) for i, a in enumerate(args) if _is_state(a)]
    out += [(k, v) for k, v in sorted(kwargs.items()) if _is_state(v)]
    return out


def state(args: tuple, kwargs: dict, tr: Any = None) -> tuple[dict, dict]:
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


def container(args: tuple, kwargs: dict, path: Path) -> tuple[Any, Any]:
    """The object holding ``path``'s last step, and that step."""
    head, *rest = path
    obj = kwargs[head] if isinstance(head, str) else args[head]
    for step in rest[:-1]:
        obj = obj[step] if isinstance(obj, (list, tuple, dict)) else getattr(obj, step)
    return obj, rest[-1]


def get(args: tuple, kwargs: dict, path: Path) -> Any:
    obj, last = container(args, kwargs, path)
    return obj[last] if isinstance(obj, (list, tuple, dict)) else getattr(obj, last)


def put(args: tuple, kwargs: dict, path: Path, value: Any) -> None:
    obj, last = container(args, kwargs, path)
    if isinstance(obj, (list, dict)):
        obj[last] = value
    else:
        setattr(obj, last, value)


def _version(t: torch.Tensor) -> int | None:
    """A tensor's version counter; None for an inference tensor, which keeps none (a step run
    under ``torch.inference_mode``, as Unsloth's generate() runs: its in-place changes cannot be
    seen, so a known value it holds is taken as changed)."""
    return None if t.is_inference() else t._version


# ---------------------------------------------------------------------------- a call's form
@dataclass
class Snapshot:
    """What :func:`call_form` needs of the state before a call (no tensor is held: holding one
    would keep a cache tensor alive past the moment the step frees it)."""

    ids: dict  # event id of a state tensor's storage -> its path
    versions: dict  # path -> (storage key, version, shadowed)
    events: int
    gemms: int
    groups: int
    convs: int
    sdpa: int
    launches: dict  # Triton launches by kernel


def snapshot(tr: Any, args: tuple, kwargs: dict) -> Snapshot:
    tensors, _ = state(args, kwargs)
    ids, versions = {}, {}
    for path, t in tensors.items():
        rec = tr.live.get(storage_key(t))
        if rec is not None and rec.event is not None:
            ids[rec.event.id] = path
        versions[path] = (storage_key(t), _version(t), tr.shadows is not None and tr.shadows.real(t) is not None)
    del tensors
    return Snapshot(ids, versions, len(tr.events), len(tr.gemm_into), len(tr.by_sm), len(tr.conv_calls), tr.sdpa_calls,
                    _launches(tr))


def _launches(tr: Any) -> dict:
    return tr.triton.counts() if getattr(tr, "triton", None) is not None else {}


def _argument_storages(args: tuple, kwargs: dict) -> dict[int, Path]:
    """Storage key -> the path of a tensor of the call's arguments, in them and in the lists and
    tuples they hold (a cache passed as lists of views of buffers the model keeps)."""
    out: dict[int, Path] = {}

    def walk(x: Any, path: Path, depth: int) -> None:
        if isinstance(x, torch.Tensor):
            out.setdefault(storage_key(x), path)
        elif type(x) in (list, tuple) and depth < _STATE_DEPTH:
            for i, y in enumerate(x):
                walk(y, path + (i,), depth + 1)

    for k, v in [*enumerate(args), *kwargs.items()]:
        walk(v, (k,), 0)
    del walk  # the closure calls itself: a cycle, broken here
    return out


def _output_recipe(tr: Any, out: Any, args: tuple, kwargs: dict, made: set, held: dict) -> tuple:
    """How the call's output is built again: its type and, per item, a tensor the step made
    (``("new", key, shape, strides, dtype, device)``), one of the call's arguments
    (``("arg", name)``), a tensor they hold (``("held", path)``: an encoder's output passed
    back), a view of an argument's storage (``("view", path, shape, strides, offset)``: Unsloth
    returns its keys and values as views of buffers its layers keep, and is given them back),
    a list or tuple of these (``("seq", type, items)``) or a plain value (``("value", v)``).
    A key is the item's path in the output. ``held``: id of a tensor -> its path."""
    given = {id(v): k for k, v in [*enumerate(args), *kwargs.items()]}
    storages = _argument_storages(args, kwargs)
    if not (isinstance(out, (dict, torch.Tensor)) or type(out) is tuple):
        raise NotReplayable(f"returns a {type(out).__name__}")
    seen: set = set()

    def how(key: Path, v: Any) -> tuple:
        if id(v) in given:
            return ("arg", given[id(v)])
        if isinstance(v, torch.Tensor) and id(v) in held:
            return ("held", held[id(v)])
        if isinstance(v, torch.Tensor):
            r = tr.live.get(storage_key(v))
            if r is not None and r.event is not None and r.event.id in made and v.storage_offset() == 0:
                if r.event.id in seen:
                    raise NotReplayable(f"returns one tensor twice ({key})")
                seen.add(r.event.id)
                return ("new", key, tuple(v.shape), tuple(v.stride()), str(v.dtype).removeprefix("torch."),
                        str(v.device))
            if storage_key(v) in storages and (r is None or r.event is None or r.event.id not in made):
                return ("view", storages[storage_key(v)], tuple(v.shape), tuple(v.stride()), v.storage_offset())
            raise NotReplayable(f"returns a tensor ({key}) it did not make")
        if v is None or type(v) in (int, float, bool, str):
            return ("value", v)
        if type(v) in (list, tuple) and len(key) < _STATE_DEPTH:
            return ("seq", type(v), tuple(how(key + (i,), y) for i, y in enumerate(v)))
        raise NotReplayable(f"returns a {type(v).__name__} ({key})")

    parts = tuple((key, how((key,), v)) for key, v in items(out))
    del how  # the closure calls itself: a cycle, broken here
    cls = torch.Tensor if isinstance(out, torch.Tensor) else type(out)
    return (cls, parts)


def recipe_leaves(recipe: tuple, kind: str) -> Iterator[tuple]:
    """The items of an output's recipe of one kind (``"new"``, ``"view"``), in lists too."""
    stack = [how for _, how in recipe[1]]
    while stack:
        how = stack.pop()
        if how[0] == "seq":
            stack.extend(how[2])
        elif how[0] == kind:
            yield how


def leaf(out: Any, key: Path) -> Any:
    """The item of a call's output at ``key`` (its path in the output)."""
    v = dict(items(out))[key[0]]
    for i in key[1:]:
        v = v[i]
    return v


def call_form(tr: Any, snap: Snapshot, args: tuple, kwargs: dict, out: Any) -> tuple:
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
    tensors, numbers = state(args, kwargs, tr)
    kept: dict[int, tuple] = {}  # event id -> (path, tensor) of the cache after the call
    for path, t in tensors.items():
        r = tr.live.get(storage_key(t))
        if r is not None and r.event is not None and r.event.id in made:
            if r.event.id in kept:  # (a view at an offset is kept: a full sliding window's last tokens)
                raise NotReplayable(f"keeps two views of one storage at {path}")
            kept[r.event.id] = (path, t)
    recipe = _output_recipe(tr, out, args, kwargs, set(made) - set(kept),
                            {id(t): path for path, t in tensors.items()})
    returned = {tr.live[storage_key(leaf(out, how[1]))].event.id: how[1] for how in recipe_leaves(recipe, "new")}
    for event_id, row in made.items():
        holder = kept[event_id][1] if event_id in kept else leaf(out, returned[event_id]) if event_id in returned \
            else None
        if holder is not None and not _fits(rows[row][1], holder):
            raise NotReplayable(f"keeps a tensor its storage cannot be made for ({rows[row][4]})")
        del holder
        if event_id in kept:
            path, t = kept[event_id]
            rows[row][-1] = ("state", path, tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."),
                             str(t.device), t.storage_offset())
        elif event_id in returned:
            rows[row][-1] = ("out", returned[event_id])
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
    state_meta = []
    for path, t in tensors.items():
        key, version, shadowed = snap.versions.get(path, (None, None, False))
        changed = version is None or _version(t) != version
        if key == storage_key(t) and shadowed and path + (VALUE,) not in numbers and changed:
            raise NotReplayable(f"changes a known value in place ({path})")
        state_meta.append(tensor_meta(path, t))
    del tensors
    launched = tuple(sorted((key, n - snap.launches.get(key, 0)) for key, n in _launches(tr).items()
                            if n != snap.launches.get(key, 0)))
    return (tuple(tuple(r) for r in rows), signature(args, kwargs), tuple(state_meta), numbers_of(numbers), recipe,
            tr.sdpa_calls - snap.sdpa, launched)


def extent(shape: tuple, stride: tuple) -> int:
    """Elements a storage needs for a tensor of ``shape`` and ``stride`` at offset 0."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _fits(nbytes: int, t: torch.Tensor) -> bool:
    """Whether ``t`` can be made again as a view at its offset of a storage of ``nbytes``."""
    size = t.element_size()
    return nbytes % size == 0 and (t.storage_offset() + extent(tuple(t.shape), tuple(t.stride()))) * size <= nbytes


def tensor_meta(path: Path, t: torch.Tensor) -> tuple:
    return (path, tuple(t.shape), tuple(t.stride()), str(t.dtype))


def numbers_of(numbers: dict) -> tuple:
    return tuple(sorted(numbers.items(), key=repr))


def items(out: Any) -> list[tuple[Any, Any]]:
    """(key, value) of a call's output: a ModelOutput's items, a tuple's, or the tensor."""
    if isinstance(out, dict):
        return list(out.items())
    if type(out) is tuple:
        return list(enumerate(out))
    return [(0, out)]
