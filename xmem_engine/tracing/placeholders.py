"""What ``.item()`` of a fake tensor returns: a number that may be printed or summed freely,
and whose use in control flow is a *guess* that the trace records (``guesses.py``).

Its value is the guessed value of the tensor (1 for an unknown loss, 0 for a GradScaler's
``found_inf``); ``f"{loss.item():.3f}"`` and ``total += loss.item()`` cost nothing. Once the
number decides control flow (``if``, a comparison, ``int()``, an index) the guess is
reported to ``on_use``, which notes it with the line that made it, or (with no ``on_use``)
raises :class:`NeedsRealValues`.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from xmem_engine.tracing.errors import NeedsRealValues
from xmem_engine.tracing.frames import user_frame

# (what the code did with the number, the value it got) -> that value, once noted
OnUse = Callable[[str, Any], Any]


def value_needed(what: str) -> NeedsRealValues:
    return NeedsRealValues(what, "a tensor value decides control flow or a shape", user_frame(3))


def _use(self: Any, what: str, result: Any) -> Any:
    on_use = self.__dict__.get("on_use")
    if on_use is None:
        raise value_needed(what)
    return on_use(what, result)


def _compare(op: Callable[[Any, Any], Any], base: type) -> Callable[[Any, object], Any]:
    def cmp(self: Any, other: object) -> Any:
        result = op(base(self), other)
        if result is NotImplemented:
            return result
        return _use(self, "Tensor.item() in a comparison", result)

    return cmp


class FakeFloat(float):
    """What ``.item()`` returns for a fake tensor whose value is guessed."""

    def __bool__(self) -> bool:
        return _use(self, "Tensor.item() in a condition", float(self) != 0.0)

    __lt__ = _compare(operator.lt, float)
    __le__ = _compare(operator.le, float)
    __gt__ = _compare(operator.gt, float)
    __ge__ = _compare(operator.ge, float)
    __eq__ = _compare(operator.eq, float)  # type: ignore[assignment]
    __ne__ = _compare(operator.ne, float)  # type: ignore[assignment]
    __hash__ = float.__hash__

    def __int__(self) -> int:
        return _use(self, "int(Tensor.item())", int(float(self)))

    def __index__(self) -> int:
        return _use(self, "Tensor.item() used as an index or size", int(float(self)))

    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is None:
            return _use(self, "round(Tensor.item())", round(float(self)))
        return float(self).__round__(ndigits)


class FakeInt(int):
    """Integer counterpart of :class:`FakeFloat`."""

    def __bool__(self) -> bool:
        return _use(self, "Tensor.item() in a condition", int(self) != 0)

    __lt__ = _compare(operator.lt, int)
    __le__ = _compare(operator.le, int)
    __gt__ = _compare(operator.gt, int)
    __ge__ = _compare(operator.ge, int)
    __eq__ = _compare(operator.eq, int)  # type: ignore[assignment]
    __ne__ = _compare(operator.ne, int)  # type: ignore[assignment]
    __hash__ = int.__hash__

    def __int__(self) -> int:
        return _use(self, "int(Tensor.item())", int.__int__(self))

    def __index__(self) -> int:
        return _use(self, "Tensor.item() used as an index or size", int.__int__(self))


def placeholder(dtype: torch.dtype, value: Any = 1, on_use: OnUse | None = None) -> Any:
    """The number ``.item()`` gives for a fake tensor of ``dtype`` whose value is guessed to be
    ``value``; a plain bool for bool tensors (a guess made at once, through ``on_use``)."""
    if dtype.is_floating_point or dtype.is_complex:
        n: Any = FakeFloat(float(value.real if isinstance(value, complex) else value))
    elif dtype == torch.bool and on_use is not None:
        return on_use("Tensor.item() of a bool tensor", bool(value))
    else:
        n = FakeInt(int(value))
    if on_use is not None:
        n.on_use = on_use
    return n
