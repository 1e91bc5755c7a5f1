"""What ``.item()`` of a fake tensor returns: a number that may be printed or summed, but
that raises :class:`NeedsRealValues` once it decides control flow (``auto`` mode then
re-runs the code on real tensors)."""

from __future__ import annotations

from typing import Any

import torch

from xmem_engine.tracing.errors import NeedsRealValues
from xmem_engine.tracing.frames import user_frame


def value_needed(what: str) -> NeedsRealValues:
    return NeedsRealValues(what, "a tensor value decides control flow or a shape", user_frame(3))


class FakeFloat(float):
    """What ``.item()`` returns for a fake tensor: fine to print or add up, but using it to
    decide control flow needs the real value (``auto`` then re-runs in real mode)."""

    def __bool__(self) -> bool:
        raise value_needed("Tensor.item() in a condition")

    def _cmp(self, other: object) -> bool:
        raise value_needed("Tensor.item() in a comparison")

    __lt__ = __le__ = __gt__ = __ge__ = _cmp  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        raise value_needed("Tensor.item() in a comparison")

    __ne__ = __eq__  # type: ignore[assignment]
    __hash__ = float.__hash__

    def __int__(self) -> int:
        raise value_needed("int(Tensor.item())")

    def __index__(self) -> int:
        raise value_needed("Tensor.item() used as an index or size")

    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is None:
            raise value_needed("round(Tensor.item())")
        return float(self).__round__(ndigits)


class FakeInt(int):
    """Integer counterpart of :class:`FakeFloat`."""

    __bool__ = FakeFloat.__bool__
    __lt__ = __le__ = __gt__ = __ge__ = FakeFloat._cmp  # type: ignore[assignment]
    __eq__ = __ne__ = FakeFloat.__eq__  # type: ignore[assignment]
    __hash__ = int.__hash__
    __index__ = FakeFloat.__index__
    __int__ = FakeFloat.__int__


def placeholder(dtype: torch.dtype) -> Any:
    # 1 rather than 0 or nan: logging code divides by values, takes logs, checks isfinite.
    if dtype.is_floating_point or dtype.is_complex:
        return FakeFloat(1.0)
    return FakeInt(1)
