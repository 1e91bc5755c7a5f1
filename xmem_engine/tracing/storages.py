"""What the tracer keeps of each storage the traced code holds on the GPU (``tracer.py``)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from xmem_engine.trace import TraceEvent

#: the op name of a storage's resize in the trace (``UntypedStorage.resize_``)
STORAGE_RESIZE = "UntypedStorage.resize_"


@dataclass(slots=True)
class LiveStorage:
    """A storage alive on the virtual GPU: its allocation event, the simulated allocator's
    block, a weak reference whose callback frees it, and its size."""

    event: TraceEvent | None  # None for zero-byte storages (no device allocation)
    block: Any
    ref: weakref.ref
    nbytes: int


@dataclass(frozen=True)
class ResizedBytes:
    """What a resized storage's event records of it: bytes (it has no dtype or shape)."""

    n: int
    dtype: torch.dtype = torch.uint8

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)
