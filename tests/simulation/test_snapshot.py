import os
import pickle

import pytest
import torch.cuda._memory_viz as memory_viz

from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.simulation.snapshot import (
    SnapshotFormatError,
    UnsafeSnapshotError,
    dump_snapshot,
    load_snapshot,
    loads_snapshot,
    make_snapshot,
)

MiB = 1 << 20


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/xmem-pwned",))


class _Plain:
    pass


def _simulated(conf: str = "") -> tuple[CachingAllocator, dict]:
    history: list = []
    a = CachingAllocator(parse_alloc_conf(conf), history=history)
    x = a.malloc(3 * MiB)
    y = a.malloc(100)
    a.free(x)
    a.malloc(5 * MiB)
    a.free(y)
    return a, make_snapshot(a)


def test_snapshot_layout_matches_torch():
    a, snap = _simulated()
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "blocks"}
    for seg in snap["segments"]:
        assert seg_keys <= set(seg)
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert {b["state"] for b in seg["blocks"]} <= {"active_allocated", "active_pending_free", "inactive"}
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed",
                       "alloc", "free_requested", "free_completed"]
    assert sum(s["allocated_size"] for s in snap["segments"]) == a.memory_allocated() == 5 * MiB


def test_torch_memory_viz_opens_a_simulated_run(tmp_path):
    _, snap = _simulated()
    path = tmp_path / "sim.pickle"
    dump_snapshot(snap, path)
    loaded = load_snapshot(path)
    html = memory_viz.trace_plot(loaded)
    assert "<html" in html.lower() or "<!doctype" in html.lower()
    text = memory_viz.segsum(loaded)
    assert "Summary" in text or "segment" in text.lower()


def test_expandable_segments_are_reported_per_mapped_range():
    a = CachingAllocator(parse_alloc_conf("expandable_segments:True"))
    for _ in range(3):
        a.malloc(16 * MiB)
    snap = make_snapshot(a)
    large = [s for s in snap["segments"] if s["segment_type"] == "large"]
    assert len(large) == 1 and large[0]["is_expandable"]
    assert large[0]["total_size"] == 60 * MiB == a.memory_reserved()


def test_refuses_a_pickle_with_a_reduce(tmp_path):
    if os.path.exists("/tmp/xmem-pwned"):
        os.remove("/tmp/xmem-pwned")
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Evil()]]}))
    with pytest.raises(UnsafeSnapshotError, match="refusing to load posix.system|refusing to load os.system"):
        load_snapshot(path)
    assert not os.path.exists("/tmp/xmem-pwned")


def test_refuses_a_pickle_with_a_class():
    with pytest.raises(UnsafeSnapshotError, match="_Plain"):
        loads_snapshot(pickle.dumps({"segments": [_Plain()]}))


def test_rejects_plain_data_that_is_not_a_snapshot():
    with pytest.raises(SnapshotFormatError, match="no 'segments'"):
        loads_snapshot(pickle.dumps([1, 2, 3]))
    with pytest.raises(SnapshotFormatError, match="not a readable pickle"):
        loads_snapshot(b"not a pickle at all")
    with pytest.raises(FileNotFoundError):
        load_snapshot("/nonexistent/file.pickle")
    import struct  # 14 bytes claiming 1 TiB of data: a MemoryError before (issue #36 item 6)
    with pytest.raises(SnapshotFormatError, match="claims more data than its 14 bytes"):
        loads_snapshot(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc")
