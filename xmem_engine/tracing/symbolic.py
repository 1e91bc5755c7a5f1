"""The batch size as a symbol: one trace that holds every batch size (issue #34).

Why: every batch size the slider, ``--max-batch`` or a sweep asks for cost a trace, then two
(``batch_family.py`` fits a family on two). Here the batch variable's value is a ``SymInt`` of
PyTorch's ``ShapeEnv``, as ``torch.compile``'s dynamic shapes have it, and the fake tensors made
from it carry sizes that are expressions in one symbol ``B``: so does every request the trace
records. Where the program decides something by the size (a branch, a kernel chosen by size)
the ``ShapeEnv`` records a guard; :class:`SymbolicBatch` keeps each with the line that made it,
and a batch size that breaks one is not answered from this trace.

Two things make it work on eager code. The Python dispatcher is on while tracing
(``torch._dispatch.python.enable_python_dispatcher``): without it C++ composite ops (``pad`` in
Hugging Face's causal-LM loss) take concrete sizes and pin ``B`` to its value. And the tracer's
own bookkeeping (its running allocator, live bytes) takes the symbol's value at the traced
size (:func:`hint`) where it must have a number; the reductions' launch plans, sized the same
way, are kept symbolic in ``meta["by_sm"]`` and made again at each size (``batch_family.py``).
A size turned into a plain ``int`` anywhere else pins ``B`` (an ``Eq`` guard): the trace then
holds one batch size only, and :meth:`SymbolicBatch.pinned` says where.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.frames import user_frame

#: the name the symbolic value has in the traced code's namespace (the assignment's new value)
NAME = "__xmem_symbolic_batch__"


class SymbolPinned(BaseException):
    """The code fixed the symbol at its value (:meth:`SymbolicBatch.pinned` says where): the
    trace stops there, as it holds that one size only. A BaseException, so that the code's own
    ``except Exception`` does not carry on past it."""


def _is_pin(g: Any, symbol: Any) -> bool:
    import sympy

    return isinstance(g, sympy.Eq) and symbol in (g.lhs, g.rhs) and (g.lhs.is_number or g.rhs.is_number)


@functools.lru_cache(maxsize=1)
def _shape_env_class() -> type:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class GuardedShapeEnv(ShapeEnv):
        """A ShapeEnv that tells its :class:`SymbolicBatch` (``xmem_batch``) each guard and
        where it came from (outside Dynamo its own source locations are empty)."""

        xmem_batch: "SymbolicBatch | None" = None

        def _log_guard(self, prefix: str, g: Any, forcing_spec: bool) -> None:
            super()._log_guard(prefix, g, forcing_spec)
            batch = self.xmem_batch
            if prefix == "eval" and batch is not None:
                batch.guards.append((g, user_frame(2)))
                if _is_pin(g, batch.symbol):
                    raise SymbolPinned(g)

    return GuardedShapeEnv


@dataclass
class SymbolicBatch:
    """A symbol for one top-level integer of the traced code, and the guards on it."""

    variable: str
    value: int
    env: Any  # torch.fx.experimental.symbolic_shapes.ShapeEnv
    symbol: Any  # its sympy Symbol
    sym: torch.SymInt
    guards: list = field(default_factory=list)  # (sympy relation, where the code made it)
    pins: list = field(default_factory=list)  # where the code fixed it otherwise (:meth:`pin`)

    @classmethod
    def make(cls, variable: str, value: int) -> "SymbolicBatch":
        """``value`` >= 2: PyTorch specialises sizes 0 and 1 (broadcasting), so a symbol's
        range starts at 2."""
        from torch._dynamo.source import ConstantSource

        if value < 2:
            raise ValueError(f"a symbolic {variable} needs a value of 2 or more, not {value}")
        # .item() and nonzero() raise as without a ShapeEnv: the tracer guesses them as always
        env = _shape_env_class()(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)
        symbol = env.create_symbol(value, ConstantSource(variable))
        env.xmem_batch = batch = cls(variable, value, env, symbol, env.create_symintnode(symbol, hint=value))
        return batch

    def pinned(self) -> str | None:
        """Where the code fixed the symbol to one value (``int(size)``, a size used as a
        dictionary key...), None where it did not."""
        if self.pins:
            return self.pins[0]
        for g, where in self.guards:
            if _is_pin(g, self.symbol):
                return f"{where or 'in library code'}: {self.shown(g)}"
        if self.env.replacements.get(self.symbol) is not None and not self.env.replacements[self.symbol].free_symbols:
            return f"{self.variable} was fixed at {self.env.replacements[self.symbol]}"
        return None

    def shown(self, g: Any) -> str:
        """A guard as the code's variable reads it: ``batch_size <= 600``, not ``s44 <= 600``."""
        import sympy

        return str(g.xreplace({self.symbol: sympy.Symbol(self.variable, integer=True, positive=True)}))

    def pin(self, why: str) -> None:
        """Fix the symbol here (``why``: where, and what needs the size as a number), and stop the
        trace (:class:`SymbolPinned`): for code that must not be entered with a symbol at all."""
        self.pins.append(why)
        raise SymbolPinned(why)

    def reading(self, what: str, value: int) -> int:
        """``value`` (a figure of the virtual GPU's memory, ``what``) as the code reads it: the
        traced size's, printable and summable, but fixing the symbol where it decides control
        flow (``if torch.cuda.memory_allocated() > limit``: another size could go the other way)."""
        from xmem_engine.tracing.fake.placeholders import FakeInt

        n = FakeInt(value)
        n.on_use = lambda use, result: self.pin(f"{user_frame(3) or 'in library code'}: {what} decided control "
                                                "flow (its figure is the traced size's)")
        return n

    def broken_at(self, b: int) -> str | None:
        """The first guard that does not hold at ``b`` (and where it was made), or None."""
        import sympy

        if b < 2:
            return f"{self.variable} = {b}: sizes 0 and 1 are traced for themselves"
        sub = {self.symbol: sympy.Integer(b)}
        for g, where in self.guards:
            if not bool(g.xreplace(sub)):
                return f"{where or 'in library code'}: {self.shown(g)}"
        return None


_PY_KERNELS: list | None = None


def _python_kernels() -> list:
    """The aten ops with Python kernels other than their meta ones (``torch._decomp``'s
    decompositions registered for the Python dispatcher: batch norm, matmul, LSTM...), and
    their keys."""
    global _PY_KERNELS
    if _PY_KERNELS is None:
        import torch._decomp  # noqa: F401 - registers them
        from torch._C import DispatchKey
        from torch._ops import OpOverloadPacket

        found = []
        for name in dir(torch.ops.aten):
            packet = getattr(torch.ops.aten, name, None)
            if isinstance(packet, OpOverloadPacket):
                for overload in packet.overloads():
                    op = getattr(packet, overload)
                    keys = [k for k in op.py_kernels if isinstance(k, DispatchKey) and k != DispatchKey.Meta]
                    if keys:
                        found.append((op, keys))
        _PY_KERNELS = found
    return _PY_KERNELS


@contextlib.contextmanager
def symbolic_tracing(batch: SymbolicBatch) -> Iterator[None]:
    """What a trace with a symbolic batch needs around it.

    The Python dispatcher on, so that C++ composite ops keep sizes symbolic, but without the
    Python decompositions registered for it: those change eager ops (``native_batch_norm``
    becomes ``_native_batch_norm_legit``, an LSTM its cells), and the trace must hold the ops
    a GPU run makes. And FakeTensor's choice of a CPU convolution backend (for its output's
    layout, which the tracer replaces with CUDA's: ``kernels/conv_layout.py``) makes no guards:
    it tests the batch against CPU kernels' thresholds (``s < 16``)."""
    from torch._dispatch.python import enable_python_dispatcher

    from xmem_engine.tracing.patches import patched_attr

    taken = [(op, k, op.py_kernels.pop(k)) for op, keys in _python_kernels() for k in keys if k in op.py_kernels]
    for op, _, _ in taken:
        op._dispatch_cache.clear()
    select = torch._C._select_conv_backend

    def unguarded_select(*args: Any, **kwargs: Any) -> Any:
        with batch.env.suppress_guards():
            return select(*args, **kwargs)

    try:
        with enable_python_dispatcher(), patched_attr(torch._C, "_select_conv_backend", unguarded_select):
            yield
    finally:
        for op, k, fn in taken:
            op.py_kernels[k] = fn
            op._dispatch_cache.clear()


def _len(x: Any) -> Any:
    """``len`` as the traced code sees it: a tensor's first size as it is (``len()`` itself must
    give a plain int, which would fix a symbolic batch at its value: ``len(images)``)."""
    if isinstance(x, torch.Tensor) and x.dim() and type(x.shape[0]) is torch.SymInt:
        return x.shape[0]
    return len(x)


def names(batch: SymbolicBatch) -> dict[str, Any]:
    """What the traced code's namespace holds for a symbolic batch: the symbol, under
    :data:`NAME` (the assignment's new value), and ``len`` for tensors sized by it."""
    return {NAME: batch.sym, "len": _len}


def full_slices(x: torch.Tensor, index: Any) -> Any:
    """``index`` with each ``:`` over a symbolic size written ``:size``.

    Why: indexing skips a slice that takes a whole dimension (``x[:, 0]`` is one ``select``),
    but only where it can tell the slice is whole: ``:`` ends at the largest integer, which
    it cannot compare with a symbolic size without a guard, so it slices, and the backward
    then allocates the slice's full gradient (``slice_backward``) where the GPU run did not.
    Ending the slice at the size itself makes it whole as written."""
    items = index if type(index) is tuple else (index,)
    if not any(type(i) is slice for i in items) or not x._has_symbolic_sizes_strides:
        return index
    consumed = [0 if i is None or i is Ellipsis else (i.dim() if isinstance(i, torch.Tensor) and i.dtype in
                                                      (torch.bool, torch.uint8) else 1) for i in items]
    out, d = [], 0
    for i, n in zip(items, consumed):
        if i is Ellipsis:
            d = x.dim() - sum(consumed[len(out) + 1:])
        elif type(i) is slice and i == slice(None) and d < x.dim() and type(x.shape[d]) is torch.SymInt:
            i = slice(None, x.shape[d])
        out.append(i)
        d += n
    return tuple(out) if type(index) is tuple else out[0]


def hint(x: Any) -> Any:
    """``x`` at the traced size: a SymInt's value (no guard made), tuples and lists item by item."""
    if isinstance(x, torch.SymInt):
        return x.node.hint
    if isinstance(x, (tuple, list)) and any(isinstance(v, (torch.SymInt, tuple, list)) for v in x):
        return type(x)(hint(v) for v in x)
    return x


@dataclass(frozen=True)
class Deferred:
    """A value made from sizes, made again at each batch size: ``make(*args)`` with the args
    evaluated (a cuDNN problem's text key, its input's sizes in it)."""

    make: Callable[..., Any]
    args: tuple


def deferred(make: Callable[..., Any], *args: Any) -> Any:
    """``make(*args)`` now, or a :class:`Deferred` where ``args`` hold a SymInt."""
    return Deferred(make, args) if is_symbolic(args) else make(*args)


class Evaluator:
    """Every SymInt in a structure (tuples, lists, dicts, dataclass rows) as its value at one
    size; expressions evaluated once each."""

    def __init__(self, symbol: Any, b: int) -> None:
        import sympy

        self._sub = {symbol: sympy.Integer(b)}
        self._seen: dict[Any, int] = {}

    def __call__(self, x: Any) -> Any:
        t = type(x)
        if t is int or t is str or x is None or t is float or t is bool:
            return x
        if t is torch.SymInt:
            expr = x.node.expr
            v = self._seen.get(expr)
            if v is None:
                v = self._seen[expr] = int(expr.xreplace(self._sub))
            return v
        if t is tuple or t is list:
            return t(self(v) for v in x)
        if t is dict:
            return {k: self(v) for k, v in x.items()}
        if t is Deferred:
            return x.make(*self(x.args))
        return x


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` (a structure as :class:`Evaluator` walks it) holds a SymInt."""
    t = type(x)
    if t is torch.SymInt or t is Deferred:
        return True
    if t is tuple or t is list:
        return any(is_symbolic(v) for v in x)
    if t is dict:
        return any(is_symbolic(v) for v in x.values())
    return False
