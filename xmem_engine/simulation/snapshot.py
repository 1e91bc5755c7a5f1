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
from xmem_engine.trace import MAX_REQUEST_BYTES


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
    except (MemoryError, OverflowError, RecursionError):  # a length field claiming far more than the file holds
        raise SnapshotFormatError(f"{name}: not a readable pickle (it claims more data than its "
                                  f"{len(data):,} bytes, or nests too deeply)") from None
    if not isinstance(snap, dict) or "segments" not in snap:
        raise SnapshotFormatError(f"{name}: a pickle, but not a memory snapshot (no 'segments' key)")
    check_snapshot(snap, name)
    return snap


# What the replay reads, field by field (the rest of a recording is carried along unread).
_TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                  "segment_map", "segment_unmap", "oom", "snapshot")


def check_snapshot(snap: dict, name: str = "<snapshot>") -> None:
    """Every field the replay reads has the type and range PyTorch writes: SnapshotFormatError
    naming the first that does not (``segments[3].total_size: ...``)."""

    def fail(where: str, what: str, got: Any) -> None:
        raise SnapshotFormatError(f"{name}: {where}: {what}, got {got!r:.80}")

    def whole(where: str, v: Any, lo: int = 0, hi: int = 1 << 64) -> None:
        if type(v) is not int or not lo <= v <= hi:
            fail(where, f"expected a whole number from {lo} to {hi:,}", v)

    if not isinstance(snap["segments"], list):
        fail("segments", "expected a list of segments", type(snap["segments"]).__name__)
    for i, seg in enumerate(snap["segments"]):
        at = f"segments[{i}]"
        if not isinstance(seg, dict):
            fail(at, "expected a segment (a dict)", seg)
        for k in ("address", "total_size", "stream"):
            if k not in seg:
                fail(at, f"no {k!r}", sorted(seg)[:8])
            whole(f"{at}.{k}", seg[k], *((1, MAX_REQUEST_BYTES) if k == "total_size" else (0,)))
        if "device" in seg:
            whole(f"{at}.device", seg["device"])
        if not isinstance(seg.get("segment_type", ""), str):
            fail(f"{at}.segment_type", "expected 'small' or 'large'", seg["segment_type"])
        if not isinstance(seg.get("blocks"), list):
            fail(f"{at}.blocks", "expected a list of blocks", seg.get("blocks"))
        for j, b in enumerate(seg["blocks"]):
            bat = f"{at}.blocks[{j}]"
            if not isinstance(b, dict):
                fail(bat, "expected a block (a dict)", b)
            whole(f"{bat}.address", b.get("address"))
            whole(f"{bat}.size", b.get("size"), 0, MAX_REQUEST_BYTES)
            if not isinstance(b.get("state"), str):
                fail(f"{bat}.state", "expected a state such as 'active_allocated'", b.get("state"))
            if b["state"] in ("active_allocated", "active_pending_free"):
                whole(f"{bat}.requested_size", b.get("requested_size"))
    traces = snap.get("device_traces", [])
    if not isinstance(traces, list):
        fail("device_traces", "expected a list (one list of events per device)", type(traces).__name__)
    for d, events in enumerate(traces):
        if not isinstance(events, list):
            fail(f"device_traces[{d}]", "expected a list of events", type(events).__name__)
        for i, e in enumerate(events):
            at = f"device_traces[{d}][{i}]"
            if not isinstance(e, dict):
                fail(at, "expected an event (a dict)", e)
            if e.get("action") not in _TRACE_ACTIONS:
                fail(f"{at}.action", f"expected one of {', '.join(_TRACE_ACTIONS)}", e.get("action"))
            if e["action"] == "snapshot":
                continue
            if e["action"] != "oom":
                whole(f"{at}.addr", e.get("addr"))
            whole(f"{at}.size", e.get("size"), 0, MAX_REQUEST_BYTES)
            whole(f"{at}.stream", e.get("stream"))
    settings = snap.get("allocator_settings")
    if settings is not None and not isinstance(settings, dict):
        fail("allocator_settings", "expected a dict", type(settings).__name__)
    if isinstance(settings, dict):
        if not isinstance(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "", str):
            fail("allocator_settings.PYTORCH_CUDA_ALLOC_CONF", "expected a string", settings["PYTORCH_CUDA_ALLOC_CONF"])
        divs = settings.get("roundup_power2_divisions")
        if divs is not None and not (isinstance(divs, dict) and all(
                isinstance(k, (str, int)) and str(k).isdigit() and type(v) is int for k, v in divs.items())):
            fail("allocator_settings.roundup_power2_divisions", "expected {interval: divisions} of whole numbers",
                 divs)


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
            "segment_pool_id": alloc.segments[addr].pool_id if not expandable else (0, 0),
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
