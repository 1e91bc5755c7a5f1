"""Guessed values for fake tensors: how fake mode keeps going when code reads a value nobody has.

Why: fake tensors carry no values. The shadows (``shadow_values.py``) know the small tensors
that come from data; a value computed from parameters or activations (a loss, a gradient
norm, Adafactor's RMS) stays unknown. Reading one used to send the whole script to real
mode: 10-100x slower, and for a billion-parameter model more host memory than the machine
has. GPU memory almost never depends on such a value (it picks a branch that logs, clips or
skips), so fake mode goes on with a guess and the trace lists each one with the line that
made it (``Trace.meta["guesses"]``, and the estimate's notes).

Two kinds of guess:

* **Values** (``bool(t)``, ``t.item()`` in a condition, ``int(t)``, ``t.tolist()``,
  ``torch.equal``): what the op chain gives when each unknown tensor at its leaves holds ones.
  Small unknown outputs remember, weakly, the op that made them, so ``isnan(loss).any()`` is
  ``isnan(1.0)``: False, the step is not skipped; Adafactor's ``max(eps, rms)`` takes the
  RMS. A small storage that an op writes unknown values into keeps its last known value
  (a GradScaler's ``found_inf`` stays 0: no overflow, the step is taken).
* **Sizes** of ops whose output shape depends on values (``nonzero``, boolean masks,
  ``unique``, ``masked_select``, ``torchvision.ops.nms``): the upper bound, every element
  selected, every value distinct, every box kept. The estimate errs on the safe side.

A guessed value that decides the same line :data:`LOOP_LIMIT` times is a loop on a value
(``while loss > target``): that is not guessed, and ``auto`` mode re-runs in real mode.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map

from xmem_engine.tracing.errors import NeedsRealValues
from xmem_engine.tracing.frames import library_frame, op_name, user_frame
from xmem_engine.tracing.fake.placeholders import in_range
from xmem_engine.tracing.fake.shadow_values import Shadows, shadowable
from xmem_engine.tracing.fake.value_rules import ONES_REDUCTIONS, UNEQUAL
from xmem_engine.tracing.symbolic import hint
from xmem_engine.tracing.ops import register

LOOP_LIMIT = 10_000  # guesses at one line before it counts as a loop on a value
DEPTH = 32  # ops followed back from a value to the leaves of its chain
MAX_OUTPUTS = 4  # ops with more outputs (foreach over parameters) are not remembered

_LONG = torch.long


@dataclass
class Guess:
    """One line's guess: what the code read, the value it got, where (the user's line, and
    the library line that read it when that is not the user's own), how many times."""

    what: str
    value: str
    where: str
    inside: str = ""
    count: int = 1
    kind: str = "value"  # "value", "size" (an upper bound on a data-dependent size) or "rule" (UNEQUAL)

    def note(self) -> str:
        inside = f" (in {self.inside})" if self.inside else ""
        times = f", {self.count:,} times" if self.count > 1 else ""
        if self.kind == "size":
            return f"guessed the size of {self.what} at {self.where or '?'}{inside}: {self.value}{times}"
        if self.kind == "rule":
            return f"guessed {self.what} at {self.where or '?'}{inside}: {self.value}{times}"
        return f"guessed {self.what} = {self.value} at {self.where or '?'}{inside}{times}"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


GUESS_HEADLINE = ("fake tensors carry no values: the guesses below stand for values computed from weights "
                  "(memory rarely depends on them; --mode real runs on real values)")


@contextlib.contextmanager
def bare() -> Iterator[None]:
    """Real tensors, unseen: no fake mode, no dispatch or function mode records what the
    guesses compute (the tracer's modes would take it for the user's work)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
        yield


class _Maker:
    """How a small unknown storage was made: the op, its inputs held weakly, which output;
    and, once a read has run it, what it gave (``result``).

    Why the result is kept: a value read follows the chain of makers back, and in a loop the
    chain runs through every earlier step (``generate()``'s ``input_ids = cat([input_ids,
    next_tokens])`` and ``unfinished_sequences & ~is_done``: each step's tensors are made from
    the previous step's). Run afresh at each read, each dead step's maker ran once per path
    to it: a 4-layer model took 23 s for 4 new tokens and 667 s for 16. Kept, each maker runs
    once in the whole trace and a read costs the ops made since the last one."""

    __slots__ = ("func", "args", "kwargs", "index", "result")

    def __init__(self, func: Any, args: Any, kwargs: Any, index: int):
        self.func, self.args, self.kwargs, self.index = func, args, kwargs, index
        self.result: Any = None  # None: not run yet; _LEAF: the kernel refused the stand-ins


_LEAF = object()


def _leaves(args: tuple, kwargs: dict) -> Iterator[Any]:
    """The leaves of an ATen op's arguments: a Tensor[] is a list, nothing nests deeper.

    Why not pytree: ``after_op`` runs for every op, and while ``generate()`` decodes, every
    activation is small enough to be remembered; ``tree_flatten`` and ``tree_map`` were 2.2 s
    of the 2.9 s it took for 16 new tokens on a 1.2B Llama (22,000 ops)."""
    for x in (*args, *kwargs.values()):
        if type(x) in (list, tuple):
            yield from x
        else:
            yield x


def _map(fn: Callable[[Any], Any], x: Any) -> Any:
    """``tree_map`` for an op's arguments (tuples, lists and dicts of leaves), as cheap as it gets."""
    t = type(x)
    if t is tuple or t is list:
        return t([_map(fn, v) for v in x])  # (a list, not a generator: this runs for most ops)
    if t is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


class _Ref:
    """An op's tensor input, held weakly, with what is known of its value at the time
    (a known or last known storage, or the op that made it), so that a temporary
    (``isnan(loss)`` in ``isnan(loss).any()``) can still be followed once it has died."""

    __slots__ = ("ref", "size", "stride", "offset", "dtype", "nbytes", "value", "maker")

    def __init__(self, t: torch.Tensor, nbytes: int, value: torch.UntypedStorage | None, maker: _Maker | None):
        self.ref = weakref.ref(t)
        self.size, self.stride, self.offset, self.dtype = t.size(), t.stride(), t.storage_offset(), t.dtype
        self.nbytes = nbytes  # of its storage
        self.value, self.maker = value, maker


def _real_view(storage: torch.UntypedStorage, like: Any) -> torch.Tensor | None:
    """A real tensor on ``storage`` with ``like``'s dtype, sizes, strides and offset."""
    size, stride, offset, dtype = (like.size(), like.stride(), like.storage_offset(), like.dtype) \
        if isinstance(like, torch.Tensor) else (like.size, like.stride, like.offset, like.dtype)
    try:
        with bare():
            return torch.empty((0,), dtype=dtype).set_(storage, offset, size, stride)
    except RuntimeError:  # the storage is too small for that view, or of another kind
        return None


def _ones(like: Any, nbytes: int) -> torch.Tensor | None:
    dtype = like.dtype
    with bare():
        itemsize = torch.empty((), dtype=dtype).element_size()
        storage = torch.ones(max(nbytes // itemsize, 1), dtype=dtype).untyped_storage()
    return _real_view(storage, like)


class Guesses:
    """The guesses of one fake-mode trace, and what they are made from."""

    def __init__(self, shadows: Shadows, fake_mode: Any):
        self.shadows = shadows
        self.fake_mode = fake_mode
        self._fake = shadows._fake
        # storage -> how a small unknown storage was made
        self.producers: dict[int, _Maker] = {}
        # storage -> its last known value, before an op wrote unknown values into it
        self.stale: dict[int, torch.UntypedStorage] = {}
        self._watched: set[int] = set()
        self.made: dict[tuple[str, str, str], Guess] = {}
        self.defer = 0  # >0 while Tensor.item() & co. guess for themselves (DeviceMode)
        self._ops: dict[Any, bool] = {}  # op -> worth remembering (not mutable, not random)
        self.from_symbol: set[int] = set()  # storages whose guess follows a symbolic batch (symbolic.py)
        self._symbol_read = False  # a surrogate read one of them
        shadows.on_forget = self._forgotten

    # ------------------------------------------------------------------ bookkeeping
    def _watch(self, st: torch.UntypedStorage, key: int) -> None:
        if key not in self._watched:
            self._watched.add(key)
            weakref.finalize(st, self._died, key)

    def _died(self, key: int) -> None:
        """Forget a dead storage: its key, an address, may be the next storage's."""
        self._watched.discard(key)
        self.overwritten(key)

    def overwritten(self, key: int) -> None:
        """Unknown values were written into the storage (a Triton kernel's): nothing is known of it."""
        self.producers.pop(key, None)
        self.stale.pop(key, None)
        self.from_symbol.discard(key)

    def _keep(self, st: torch.UntypedStorage, key: int, value: torch.UntypedStorage, symbolic: bool = False) -> None:
        """Keep ``value`` as the guess of what ``st`` holds now; ``symbolic``: a guess that
        holds at the traced batch size only."""
        self.stale[key] = value
        (self.from_symbol.add if symbolic else self.from_symbol.discard)(key)
        self._watch(st, key)

    def _forgotten(self, t: torch.Tensor, storage: torch.UntypedStorage) -> None:
        """Shadows dropped ``t``'s known value (unknown values were written into it): keep it
        as the guess of what it holds now."""
        st = t.untyped_storage()
        self._keep(st, st._cdata, storage)

    def after_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Remember how a small unknown output was made, if its tensor inputs are small too.
        Runs for every fake op: most return at the first test (a big output)."""
        fake = self._fake
        if type(out) is fake:
            outs: Any = (out,)
        elif type(out) in (tuple, list) and 0 < len(out) <= MAX_OUTPUTS:
            outs = out
        else:
            return
        keys = []
        for o in outs:
            if type(o) is not fake or o.layout is not torch.strided:  # (a sparse tensor: no storage)
                return
            st = o.untyped_storage()
            if not shadowable(st.nbytes()):
                return
            keys.append(st._cdata)
        worth = self._ops.get(func)
        if worth is None:
            schema = getattr(func, "_schema", None)
            worth = self._ops[func] = bool(schema is not None and not schema.is_mutable and
                                          torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()))
        if not worth:
            return
        known = self.shadows.by_storage
        if any(k in known or k in self.producers for k in keys):
            return  # known, or a view of a storage whose maker is remembered
        seen: dict[int, tuple[int, int]] = {}  # id(input) -> its storage's key and bytes
        for x in _leaves(args, kwargs):
            if isinstance(x, torch.Tensor):
                if x.layout is not torch.strided:
                    return
                st = x.untyped_storage()
                k, nbytes = st._cdata, st.nbytes()
                if k in keys:
                    return  # a view
                if not shadowable(nbytes):  # made from something big: a reduction of ones, or ones
                    if len(outs) == 1:
                        self._reduced_ones(func, args, kwargs, outs[0], keys[0])
                    return
                seen[id(x)] = (k, nbytes)
        if len(outs) == 1 and self._unequal(func, args, kwargs, outs[0], keys[0]):
            return
        stale, producers = self.stale, self.producers

        def weak(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            k, nbytes = seen.get(id(x)) or (x.untyped_storage()._cdata, x.untyped_storage().nbytes())
            return _Ref(x, nbytes, known.get(k) or stale.get(k), producers.get(k))

        weak_args, weak_kwargs = _map(weak, args), _map(weak, kwargs) if kwargs else {}
        for i, (o, key) in enumerate(zip(outs, keys)):
            self.producers[key] = _Maker(func, weak_args, weak_kwargs, i)
            self._watch(o.untyped_storage(), key)

    def _unequal(self, func: Any, args: tuple, kwargs: dict, out: torch.Tensor, key: int) -> bool:
        """``isin`` of unknown integers against known ones (:data:`UNEQUAL`):
        no match, so that generation runs to ``max_new_tokens``.

        Why: generated tokens (``argmax``, ``multinomial`` of logits) are unknown. Taken as
        ones, or as the argmax of ones (0), they would be a stop token wherever eos is 0 or
        1, and ``generate()`` would stop after one step. A GPU allocates the most when no
        sequence stops early (the KV cache grows to the last token): that is the guess."""
        rule = UNEQUAL.get(op_name(func))
        if rule is None or out.dtype != torch.bool:
            return False
        a = args[0] if args else None
        b = args[1] if len(args) > 1 else kwargs.get("test_elements", kwargs.get("other"))
        known = self.shadows.by_storage

        def unknown_ids(x: Any) -> bool:
            return (isinstance(x, self._fake) and not x.dtype.is_floating_point and x.dtype != torch.bool
                    and x.untyped_storage()._cdata not in known)

        def is_known(x: Any) -> bool:
            return (isinstance(x, (int, float)) or not isinstance(x, self._fake)
                    or x.untyped_storage()._cdata in known)

        if not ((unknown_ids(a) and is_known(b)) or (unknown_ids(b) and is_known(a))):
            return False
        value = rule(args, kwargs)
        with bare():
            guess = torch.full((out.untyped_storage().nbytes(),), value, dtype=torch.bool).untyped_storage()
        self._keep(out.untyped_storage(), key, guess)
        self.decide(f"{_short(func)} of unknown ids with known ones", f"{value} everywhere (no id matches: "
                    "no early stop, generation runs to max_new_tokens)", kind="rule")
        return True

    def _reduced_ones(self, func: Any, args: tuple, kwargs: dict, out: torch.Tensor, key: int) -> None:
        """A reduction of a big unknown tensor (``p.norm()``, ``loss.sum()``): its value were
        the tensor all ones, so that Adafactor's RMS of a weight is 1, not 1/sqrt(numel)."""
        rule = ONES_REDUCTIONS.get(op_name(func))
        x = args[0] if args else None
        if rule is None or not isinstance(x, torch.Tensor) or not shadowable(out.untyped_storage().nbytes()) \
                or out.numel() == 0:
            return  # (an output sized by a symbolic batch has no values at every size: symbolic.py)
        n = x.numel()
        value = in_range(rule(hint(n) / out.numel(), args, kwargs), out.dtype)  # fp16: at most 65,504
        # a sum over the batch: its guess is the traced size's only
        symbolic = type(n) is torch.SymInt and rule(hint(n) + 1, args, kwargs) != rule(hint(n), args, kwargs)
        with bare():
            storage = torch.full((out.untyped_storage().nbytes() // out.element_size(),), value,
                                 dtype=out.dtype).untyped_storage()
        self._keep(out.untyped_storage(), key, storage, symbolic)

    # ------------------------------------------------------------------ values
    def surrogate(self, t: torch.Tensor, depth: int = 0, memo: dict | None = None) -> torch.Tensor | None:
        """A real tensor standing for fake ``t``: its shadow, its last known value, its maker
        run on surrogates of its inputs, or ones; None for a big tensor with none of these."""
        if not isinstance(t, self._fake):
            return t
        real = self.shadows.real(t)
        if real is not None:
            return real
        st = t.untyped_storage()
        key = st._cdata
        memo = {} if memo is None else memo
        if key in memo:
            return _real_view(memo[key], t) if memo[key] is not None else None
        storage = self.stale.get(key)
        if storage is not None and key in self.from_symbol:
            self._symbol_read = True
        if storage is None and depth < DEPTH and key in self.producers:
            storage = self._run_producer(key, depth, memo)
        if storage is None and shadowable(st.nbytes()):
            leaf = _ones(t, st.nbytes())
            storage = leaf.untyped_storage() if leaf is not None else None
        memo[key] = storage
        return _real_view(storage, t) if storage is not None else None

    def _run_producer(self, key: int, depth: int, memo: dict) -> torch.UntypedStorage | None:
        memo[key] = None  # a cycle ends in ones
        return self._run(self.producers[key], depth, memo)

    def _run(self, maker: _Maker, depth: int, memo: dict) -> torch.UntypedStorage | None:
        if maker.result is not None:
            return None if maker.result is _LEAF else maker.result

        def resolve(x: Any) -> Any:
            if not isinstance(x, _Ref):
                return x
            t = x.ref()
            if t is not None:  # alive: what is known of it now
                r = self.surrogate(t, depth + 1, memo)
                if r is not None:
                    return r
            storage = x.value
            if storage is None and x.maker is not None and depth + 1 < DEPTH:
                storage = self._run(x.maker, depth + 1, memo)
            r = _real_view(storage, x) if storage is not None else None
            return r if r is not None else _ones(x, x.nbytes)

        try:
            args, kwargs = _map(resolve, maker.args), _map(resolve, maker.kwargs)
            with bare():
                out = maker.func(*args, **kwargs)
        except Exception:  # the real kernel refuses the stand-ins: the value is a leaf
            maker.result = _LEAF
            return None
        outs = tree_flatten(out)[0]
        index = maker.index
        if index >= len(outs) or not isinstance(outs[index], torch.Tensor):
            maker.result = _LEAF
            return None
        maker.result = outs[index].untyped_storage()
        return maker.result

    def scalar(self, t: torch.Tensor) -> Any:
        """The guessed value of a one-element tensor (1 when nothing better is known)."""
        r = self._surrogate_read(t)
        if r is None or r.numel() != 1:
            return 1
        with bare():
            value = r.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.shadows.guessed.add(value)
        return value

    def read(self, what: str, fn: Callable[[torch.Tensor], Any], t: torch.Tensor) -> Any:
        """``fn`` (``bool``, ``int``, ``Tensor.tolist``...) of ``t``'s surrogate, noted as a
        guess; NeedsRealValues if ``t`` is too big to stand in for."""
        r = self._surrogate_read(t)
        if r is None:
            raise NeedsRealValues(what, "a value of a large tensor decides control flow", user_frame(3))
        with bare():
            value = fn(r)
        return self.decide(what, value)

    def host_array(self, what: str, t: torch.Tensor) -> Any:
        """``t.numpy()`` for a large host tensor nothing is known of (a Trainer's predictions,
        gathered for ``compute_metrics``): zeros, noted. ``np.zeros`` maps pages lazily, so
        code that reads the array (an ``argmax`` over the logits) costs the host no memory
        for it; before, such a read sent the whole script to real mode."""
        import numpy as np

        if not all(type(s) is int for s in t.shape):  # sized by a symbolic batch: read at the traced size
            batch = getattr(getattr(self.fake_mode, "shape_env", None), "xmem_batch", None)
            if batch is not None:
                batch.pin(f"{user_frame(3) or library_frame(3)}: {what} of a tensor sized by the batch")
        shape = tuple(int(hint(s)) for s in t.shape)
        with bare():
            dtype = torch.empty((), dtype=t.dtype).numpy().dtype
        self.decide(what, f"zeros ({' x '.join(map(str, shape)) or 'scalar'}, {dtype}: the values of a large "
                          "tensor, in host memory only as they are written)", kind="rule")
        return np.zeros(shape, dtype=dtype)

    def _surrogate_read(self, t: torch.Tensor) -> torch.Tensor | None:
        """:meth:`surrogate` for a value the code reads: one guessed from a symbolic batch's
        size (a sum over it) holds at the traced size only, so the symbol is pinned there
        (``symbolic.SymbolicBatch.pinned``)."""
        self._symbol_read = False
        r = self.surrogate(t)
        if self._symbol_read:
            batch = getattr(getattr(self.fake_mode, "shape_env", None), "xmem_batch", None)
            if batch is not None:
                where, inside = user_frame(3), library_frame(3)
                batch.pin(f"{where or inside}{f' ({inside})' if where and inside != where else ''}: "
                          "a value read from a sum over the batch")
        return r

    def decide(self, what: str, value: Any, kind: str = "value") -> Any:
        """Note that ``value``, a guess, decided something at the current user line."""
        where, inside = user_frame(2), library_frame(2)
        if inside and where and inside == where:
            inside = ""
        key = (what, where, inside)
        g = self.made.get(key)
        if g is None:
            shown = value if kind in ("size", "rule") else _show(value)
            g = self.made[key] = Guess(what, shown, where, inside, kind=kind)
        else:
            g.count += 1
            if g.count > LOOP_LIMIT and kind == "value":
                raise NeedsRealValues(what, f"a guessed value decided it {LOOP_LIMIT:,} times: a loop on a value "
                                      "that fake tensors do not have", where)
        return value

    # ------------------------------------------------------------------ sizes
    def data_dependent(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Outputs (fake) of an op whose result depends on values fake tensors lack: an upper
        bound for the sizes of the ops in :data:`BOUNDS`, else the op run on surrogates of
        small inputs; NotImplemented when neither applies."""
        bound = BOUNDS.get(op_name(func))
        if bound is not None:
            out, what = _index(args, kwargs, self.shadows.real) if bound is _index else bound(args, kwargs)
            if out is not NotImplemented:
                if what is not None:  # None: the sizes are exact, nothing was guessed
                    self.decide(f"{_short(func)}'s output", what, kind="size")
                return out
        if _is_value_read(func):
            return self._value_op(func, args, kwargs)
        return self._run_on_surrogates(func, args, kwargs)

    def _value_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op that returns a Python value (``_local_scalar_dense`` called from C++,
        ``equal``, ``is_nonzero``): its value on the surrogates, noted."""
        if func is torch.ops.aten._local_scalar_dense.default:
            return self.decide("a tensor's value", self.scalar(args[0]))
        real = self._real_args(args, kwargs)
        if real is None:
            return NotImplemented
        with bare():
            value = func(*real[0], **real[1])
        return self.decide(_short(func), value)

    def _real_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        missing = False
        memo: dict = {}

        def swap(x: Any) -> Any:
            nonlocal missing
            if isinstance(x, self._fake):
                r = self.surrogate(x, 0, memo)
                if r is None:
                    missing = True
                return r
            return x

        real = tree_map(swap, args), tree_map(swap, kwargs)
        return None if missing else real

    def _run_on_surrogates(self, func: Any, args: tuple, kwargs: dict) -> Any:
        real = self._real_args(args, kwargs)
        if real is None:
            return NotImplemented
        try:
            with bare():
                out = func(*real[0], **real[1])
        except Exception:
            return NotImplemented
        shapes = [tuple(t.shape) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.decide(f"{_short(func)}'s output", f"{shapes} (run on guessed inputs)", kind="size")
        return tree_map(lambda r: self.fake_mode.from_tensor(r) if isinstance(r, torch.Tensor) else r, out)

    # ------------------------------------------------------------------ results
    def guesses(self) -> list[Guess]:
        return list(self.made.values())


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _short(func: Any) -> str:
    name = str(func)
    for prefix in ("aten.", "torchvision."):
        if name.startswith(prefix):
            name = ("torchvision.ops." if prefix == "torchvision." else "") + name[len(prefix):]
            break
    return name.removesuffix(".default").removesuffix(".Tensor")


_VALUE_READS = ("aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::allclose")


def _is_value_read(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and schema.name in _VALUE_READS


# --------------------------------------------------------------------------- upper bounds
def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    # Called inside the dispatch mode's handler: FakeTensorMode, next on the stack, makes it.
    return torch.ops.aten.empty.memory_format(list(shape), dtype=dtype, device=torch.device("cpu"))


def _nonzero(args: tuple, kwargs: dict) -> tuple[Any, str]:
    x = args[0]
    return _empty((x.numel(), x.dim()), _LONG), f"{hint(x.numel()):,} rows (every element nonzero)"


def _index(args: tuple, kwargs: dict, real: Callable[[Any], Any] | None = None) -> tuple[Any, str | None]:
    """``x[mask]``: a mask whose values are known (``real`` gives them: labels != -100 of a batch
    from the host) selects what it selects, exactly, whatever ``x`` holds; else every element."""
    x, indices = args[0], list(args[1])
    new: list[Any] = []
    selected, guessed = 0, False
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            known = real(i) if real is not None else None
            if known is not None:
                with bare():
                    selected = int(known.count_nonzero())
            else:
                selected, guessed = i.numel(), True
            # CUDA's index takes nonzero() of a mask: one (n, k) index tensor, its columns used
            rows = _empty((selected, i.dim()), _LONG)
            new.extend(torch.ops.aten.unbind.int(rows, 1))
        else:
            new.append(i)
    out = torch.ops.aten.index.Tensor(x, new)
    return out, f"{hint(selected):,} elements selected (every mask element true)" if guessed else None


def _masked_select(args: tuple, kwargs: dict) -> tuple[Any, str]:
    x, mask = args[0], args[1]
    n = torch.broadcast_shapes(x.shape, mask.shape).numel()
    return _empty((n,), x.dtype), f"{hint(n):,} elements (every mask element true)"


def _unique(args: tuple, kwargs: dict, *, flags: tuple[int, int]) -> tuple[Any, str]:
    x = args[0]
    get = lambda i, name: bool(args[i]) if len(args) > i else bool(kwargs.get(name, False))  # noqa: E731
    inverse, counts = get(flags[0], "return_inverse"), get(flags[1], "return_counts")
    n = x.numel()
    out = (_empty((n,), x.dtype), _empty(tuple(x.shape) if inverse else (0,), _LONG),
           _empty((n,) if counts else (0,), _LONG))
    return out, f"{hint(n):,} values (all distinct)"


def _unique_one(args: tuple, kwargs: dict) -> tuple[Any, str]:  # aten::_unique: two outputs
    out, what = _unique(args, kwargs, flags=(2, 99))
    return out[:2], what


def _unique_dim(args: tuple, kwargs: dict) -> tuple[Any, str]:
    x, dim = args[0], args[1]
    n = x.size(dim)
    return (_empty(tuple(x.shape), x.dtype), _empty((n,), _LONG), _empty((n,), _LONG)), f"{hint(n):,} slices (all distinct)"


def _pack_padded(args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """``pack_padded_sequence``: its sizes come from ``lengths``, a host tensor with real
    values; ``batch_sizes`` stays a real host tensor (the RNN kernels read its memory)."""
    x, lengths, batch_first = args[0], args[1], bool(args[2]) if len(args) > 2 else bool(kwargs.get("batch_first"))
    if _is_fake(lengths):
        return NotImplemented, None
    with bare():
        counts = [int(n) for n in lengths.tolist()]
        if not counts or min(counts) <= 0:
            return NotImplemented, None  # the real kernel's own error, raised by the caller
        steps = max(counts)
        batch_sizes = torch.tensor([sum(1 for n in counts if n > t) for t in range(steps)], dtype=_LONG)
    feature = tuple(x.shape[2:])
    return (_empty((sum(counts), *feature), x.dtype), batch_sizes), None


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _nms(args: tuple, kwargs: dict) -> tuple[Any, str]:
    scores = args[1]
    return _empty((scores.numel(),), _LONG), f"{hint(scores.numel()):,} boxes (all kept)"


# by op name (``str(op)``): torchvision's op need not be loaded for its entry to exist
BOUNDS: dict[str, Callable[[tuple, dict], tuple[Any, str]]] = {
    "aten.nonzero.default": _nonzero,
    "aten.index.Tensor": _index,
    "aten.masked_select.default": _masked_select,
    "aten._unique2.default": lambda a, k: _unique(a, k, flags=(2, 3)),
    "aten.unique_consecutive.default": lambda a, k: _unique(a, k, flags=(1, 2)),
    "aten._unique.default": _unique_one,
    "aten.unique_dim.default": _unique_dim,
    "aten.unique_dim_consecutive.default": _unique_dim,
    "torchvision.nms.default": _nms,
    "aten._pack_padded_sequence.default": _pack_padded,
}

# Ops whose fake kernel would touch real memory (their CPU kernels read index tensors'
# data directly): their rule runs before it, not after it fails.
BEFORE_FAKE = frozenset({torch.ops.aten._pack_padded_sequence.default})


register("size bound", BOUNDS, __name__)
