"""What ``.item()`` of a fake tensor returns: a number that may be printed or summed freely,
and whose use in control flow is a *guess* that the trace records (``guesses.py``).

Its value is the guessed value of the tensor (1 for an unknown loss, 0 for a GradScaler's
``found_inf``); ``f"{loss.item():.3f}"`` and ``total += loss.item()`` cost nothing. Once the
number decides control flow (``if``, a comparison, ``int()``, an index) the guess is
reported to ``on_use``, which notes it with the line that made it, or (with no ``on_use``)
raises :class:`NeedsRealValues`.
"""

from __future__ import annotations

import math
import operator
import os
import sys
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


def _plain(base: type) -> Callable[[Any], Any]:
    """The number itself, as a plain ``base`` (``int(self)`` would call the overridden
    ``__int__``)."""
    return int.__int__ if base is int else float.__float__


#: where a comparison only formats the number: ``json``'s encoder asks ``o != o`` and ``o == inf``
#: to spell NaN and Infinity (a Trainer's ``trainer_state.json`` holds the logged losses)
_FORMATTING = (os.path.join("json", "encoder.py"),)


def _compare(op: Callable[[Any, Any], Any], base: type) -> Callable[[Any, object], Any]:
    plain = _plain(base)

    def cmp(self: Any, other: object) -> Any:
        if isinstance(other, (float, int)) and type(other) not in (float, int, bool):  # another guess:
            other = float.__float__(other) if isinstance(other, float) else int.__int__(other)  # noted once
        result = op(plain(self), other)
        if result is NotImplemented or sys._getframe(1).f_code.co_filename.endswith(_FORMATTING):
            return result
        return _use(self, "Tensor.item() in a comparison", result)

    return cmp


def _guessed(base: type) -> type:
    """A ``base`` (float or int) whose use in control flow goes through :func:`_use`."""

    plain = _plain(base)

    class Guessed(base):  # type: ignore[valid-type, misc]
        def __bool__(self) -> bool:
            return _use(self, "Tensor.item() in a condition", plain(self) != 0)

        __lt__ = _compare(operator.lt, base)
        __le__ = _compare(operator.le, base)
        __gt__ = _compare(operator.gt, base)
        __ge__ = _compare(operator.ge, base)
        __eq__ = _compare(operator.eq, base)  # type: ignore[assignment]
        __ne__ = _compare(operator.ne, base)  # type: ignore[assignment]
        __hash__ = base.__hash__

        def __int__(self) -> int:
            return _use(self, "int(Tensor.item())", int(plain(self)))

        def __index__(self) -> int:
            return _use(self, "Tensor.item() used as an index or size", int(plain(self)))

        # A number is immutable: copies are the number itself. Why: ``on_use`` is bound to the
        # trace's guesses, which hold the FakeTensorMode; ``copy.deepcopy`` (as
        # ``dataclasses.asdict`` does on a Trainer's ``log_history`` at every checkpoint) would
        # copy all of it, StorageWeakRefs included, whose copies free one weak reference twice
        # (a crash at garbage collection).
        def __copy__(self) -> Any:
            return self

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            return self

        def __reduce__(self) -> tuple[type, tuple[Any]]:
            return base, (plain(self),)  # pickled (torch.save of a log): the plain number

    return Guessed


class FakeFloat(_guessed(float)):  # type: ignore[misc]
    """What ``.item()`` returns for a fake tensor whose value is guessed."""

    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is None:
            return _use(self, "round(Tensor.item())", round(float(self)))
        return float(self).__round__(ndigits)


class FakeInt(_guessed(int)):  # type: ignore[misc]
    """Integer counterpart of :class:`FakeFloat`."""


def in_range(value: Any, dtype: torch.dtype) -> Any:
    """``value``, a guess, brought into what ``dtype`` holds: finite and within its range.

    Why: a guess is made from ones (``guesses.py``), so a sum over 65,536 fp16 elements
    guesses 65,536, which fp16 cannot hold (its largest is 65,504; int8's 127, float8
    e4m3's 448). Writing that into a tensor is an error on the real kernel
    (``value cannot be converted to type c10::Half without overflow``), and an infinite
    guess would send ``isfinite`` checks (GradScaler's, a guarded step) down the path a
    GPU takes only on overflow. The guess saturates instead: the largest finite value
    (or the smallest), a bool for bool. NaN and complex values are left as they are."""
    if isinstance(value, complex) or dtype.is_complex:
        return value
    v = float.__float__(value) if isinstance(value, float) else int.__int__(value)  # no use noted
    if dtype == torch.bool:
        return v != 0
    if isinstance(v, float) and math.isnan(v):
        return v if dtype.is_floating_point else 0
    info: Any = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return v if info.min <= v <= info.max else (info.max if v > 0 else info.min)


def placeholder(dtype: torch.dtype, value: Any = 1, on_use: OnUse | None = None) -> Any:
    """The number ``.item()`` gives for a fake tensor of ``dtype`` whose value is guessed to be
    ``value``; a plain bool for bool tensors (a guess made at once, through ``on_use``)."""
    value = in_range(value, dtype)
    if dtype.is_floating_point or dtype.is_complex:
        n: Any = FakeFloat(float(value.real if isinstance(value, complex) else value))
    elif dtype == torch.bool and on_use is not None:
        return on_use("Tensor.item() of a bool tensor", bool(value))
    else:
        n = FakeInt(int(value))
    if on_use is not None:
        n.on_use = on_use
    return n
