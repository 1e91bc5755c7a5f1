"""Memory snapshots: loading recorded ones safely, and writing simulated ones.

The layout is the one ``torch.cuda.memory._snapshot()`` returns, so PyTorch's
``torch.cuda._memory_viz`` and pytorch.org/memory_viz open a simulated run:
``{"segments": [...], "device_traces": [[event, ...]], "allocator_settings": {...}}``.

Recorded snapshots are pickles from other people's machines. They hold only dicts, lists,
strings and numbers, so they are read with an unpickler that refuses every class: a file
with a class or a reduce in it is rejected before anything in it can run.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from xmem_engine.simulation.alloc_conf import AllocatorConfig
from xmem_engine.simulation.allocator import CachingAllocator


class UnsafeSnapshotError(ValueError):
    """The pickle names a class or callable: it is not a plain memory snapshot."""


class SnapshotFormatError(ValueError):
    """The file is a pickle of plain data but not a memory snapshot."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeSnapshotError(
            f"refusing to load {module}.{name}: a memory snapshot holds only plain data "
            "(dicts, lists, strings, numbers), so this file was not made by "
            "torch.cuda.memory._dump_snapshot() or has been tampered with"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeSnapshotError("refusing a pickle with persistent ids: not a memory snapshot")


def loads_snapshot(data: bytes, name: str = "<bytes>") -> dict:
    """Unpickle plain data only, and check it looks like a snapshot."""
    try:
        snap = _PlainDataUnpickler(io.BytesIO(data)).load()
    except UnsafeSnapshotError as e:
        raise UnsafeSnapshotError(f"{name}: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
        raise SnapshotFormatError(f"{name}: not a readable pickle ({e})") from None
    if not isinstance(snap, dict) or "segments" not in snap:
        raise SnapshotFormatError(f"{name}: a pickle, but not a memory snapshot (no 'segments' key)")
    traces = snap.get("device_traces", [])
    if not isinstance(snap["segments"], list) or not isinstance(traces, list):
        raise SnapshotFormatError(f"{name}: 'segments' and 'device_traces' must be lists")
    return snap


def load_snapshot(path: str | Path) -> dict:
    """Read a ``_dump_snapshot`` pickle safely (see :func:`loads_snapshot`)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FileNotFoundError(f"cannot read snapshot {p}: {e.strerror}") from None
    return loads_snapshot(data, str(p))


def allocator_settings(config: AllocatorConfig) -> dict:
    """``allocator_settings`` as PyTorch writes it into a snapshot."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": config.source,
        "max_split_size": -1 if config.max_split_size >= 2**64 - 1 else config.max_split_size,
        "garbage_collection_threshold": config.garbage_collection_threshold,
        "expandable_segments": config.expandable_segments,
        "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(config.roundup_power2_divisions)},
    }


def make_snapshot(alloc: CachingAllocator, device_trace: list[dict] | None = None) -> dict:
    """The simulated allocator's state in ``torch.cuda.memory._snapshot()`` layout."""
    segments = []
    for addr, total, stream, is_small, expandable, blocks in alloc.iter_segments():
        out_blocks = []
        allocated = active = requested = 0
        for b in blocks:
            pending = b in alloc.pending_frees
            state = "active_allocated" if b.allocated else ("active_pending_free" if pending else "inactive")
            out_blocks.append({
                "address": b.addr,
                "size": b.size,
                "requested_size": b.requested if (b.allocated or pending) else 0,
                "state": state,
                "frames": [],
            })
            if b.allocated:
                allocated += b.size
                requested += b.requested
            if b.allocated or pending:
                active += b.size
        segments.append({
            "device": 0,
            "address": addr,
            "total_size": total,
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": stream,
            "segment_type": "small" if is_small else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": expandable,
            "frames": [],
            "blocks": out_blocks,
        })
    trace = device_trace if device_trace is not None else (alloc.history or [])
    events = [{**e, "frames": e.get("frames", [])} for e in trace]
    return {
        "segments": segments,
        "device_traces": [events],
        "allocator_settings": allocator_settings(alloc.config),
    }


def dump_snapshot(snapshot: dict, path: str | Path) -> None:
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
