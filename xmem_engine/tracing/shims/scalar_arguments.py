"""A one-element tensor passed where an operator's schema wants a number, in fake mode.

Why: ``torch.ops.<library>.<op>(...)`` checks its arguments against the op's schema in C++.
Given a 0-dim tensor for a ``float``, ``int``, ``bool`` or ``Scalar`` argument it reads the
tensor's value (``item()``: on a GPU a copy to the host and a wait), so code written that way
runs on a GPU. bitsandbytes does it whenever an optimizer clips its update by the weight's norm
(``max_unorm``: ``bnb.optim.LAMB`` and ``LARS`` by default, GaLore's ``AdamW8bit``):
``param_norm = torch.norm(p.data.float())`` goes into ``optimizer_update_32bit``'s ``float
param_norm``. A fake tensor has no value for C++ to read ("cannot extract float from tensor
with meta storage"), and the script stopped there.

How: while tracing in fake mode, ``OpOverloadPacket.__call__`` and ``OpOverload.__call__``
retry such a call once with each number-typed argument that holds a 0-dim tensor replaced by
its ``item()``: the read a GPU makes, guessed and noted as every value read in fake mode is.
Calls that do not fail take the original path (one more Python frame).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.patches import patched_attr

#: C++'s refusal to read a fake (meta-storage) tensor as a number, in ``toIValue``
REFUSAL = "from tensor with meta storage"
_NUMBERS = {"FloatType": float, "IntType": int, "BoolType": bool, "NumberType": None,
            "SymIntType": int, "SymFloatType": float, "SymBoolType": bool}


def _number_kind(t: Any) -> tuple[bool, Callable[[Any], Any] | None]:
    """Whether a schema type is a number (or an optional one), and the Python type it reads as
    (``None``: a ``Scalar``, whatever ``item()`` gives)."""
    if t.kind() == "OptionalType":
        t = t.getElementType()
    kind = t.kind()
    return kind in _NUMBERS, _NUMBERS.get(kind)


def _as_number(t: Any, value: Any) -> Any:
    if not (isinstance(value, torch.Tensor) and value.dim() == 0):
        return value
    is_number, cast = _number_kind(t)
    if not is_number:
        return value
    read = value.item()  # under the tracer: a guessed value, noted where it was read
    return read if cast is None or isinstance(read, cast) else cast(read)


def numbers_read(schema: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``args``/``kwargs`` with every 0-dim tensor in a number-typed slot of ``schema`` read as
    the number; ``None`` when there is none (the failure was not this)."""
    params = schema.arguments
    new_args = tuple(_as_number(p.type, v) for p, v in zip(params, args)) + tuple(args[len(params):])
    by_name = {p.name: p for p in params}
    new_kwargs = {k: _as_number(by_name[k].type, v) if k in by_name else v for k, v in kwargs.items()}
    changed = any(a is not b for a, b in zip(new_args, args)) or any(new_kwargs[k] is not kwargs[k] for k in kwargs)
    return (new_args, new_kwargs) if changed else None


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and REFUSAL in str(exc)


def _retrying(orig: Callable[..., Any], overloads: Callable[[Any], list], call: Callable[..., Any]) -> Callable[..., Any]:
    """``orig`` (an op's ``__call__``), retried on C++'s refusal with each overload of
    ``overloads(self)`` whose schema reads a number from a tensor, called by ``call``."""

    @functools.wraps(orig)
    def __call__(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, *args, **kwargs)
        except RuntimeError as exc:
            if not _refused(exc):
                raise
            refusal = str(exc)  # (the message: the exception's traceback would hold the call's tensors)
        return _each_overload(overloads(self), call, args, kwargs, refusal)

    return __call__


def _each_overload(overloads: list, call: Callable[..., Any], args: tuple, kwargs: dict, refusal: str) -> Any:
    """Each overload whose schema reads a number from a tensor, in turn (a packet's own choice
    failed before it chose). No exception is kept past the call: an exception's traceback holds
    the frames, and so the tensors, of the call, which would be freed late."""
    errors: list[BaseException] = []
    for overload in overloads:
        read = numbers_read(overload._schema, args, kwargs)
        if read is None:
            continue
        try:
            result = call(overload, *read[0], **read[1])
        except (RuntimeError, TypeError) as exc:  # another overload's schema, or the op's own error
            errors.append(exc)
            continue
        errors.clear()
        return result
    if len(errors) == 1:
        raise errors[0]
    raise RuntimeError(refusal + "".join(f"\n{type(e).__name__}: {e}" for e in errors))


@contextlib.contextmanager
def numbers_from_fake_tensors() -> Iterator[None]:
    """For the duration of a fake trace: ops given a 0-dim tensor for a number read it."""
    from torch._ops import OpOverload, OpOverloadPacket

    packet_call, overload_call = OpOverloadPacket.__call__, OpOverload.__call__
    packet = _retrying(packet_call, lambda p: [getattr(p, name) for name in p.overloads()],
                       lambda ov, *a, **k: ov(*a, **k))
    overload = _retrying(overload_call, lambda ov: [ov], overload_call)
    with patched_attr(OpOverloadPacket, "__call__", packet), patched_attr(OpOverload, "__call__", overload):
        yield
