"""Conformance: replaying real GPU recordings must reproduce every allocator decision."""

import pickle

import pytest

from conftest import needs_shared_traces, recorded_traces
from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.simulation.replay import is_warm, rebuild_start_state, replay_snapshot
from xmem_engine.simulation.snapshot import load_snapshot, loads_snapshot, make_snapshot

MiB = 1 << 20


def _devices() -> list[tuple]:
    """(recording, device) for every device each recording has."""
    out = []
    for path in recorded_traces():
        snap = load_snapshot(path)
        out += [(path, d) for d, events in enumerate(snap["device_traces"]) if events]
    return out


@needs_shared_traces
@pytest.mark.parametrize("path, device", _devices(), ids=lambda x: getattr(x, "name", str(x)))
def test_real_gpu_trace_replays_exactly(path, device):
    report = replay_snapshot(load_snapshot(path), device=device)
    assert report.allocs > 0
    assert report.address_matches == report.allocs, report.first_mismatch
    assert report.segment_matches == report.segment_allocs, report.first_mismatch
    assert report.unpredicted_segment_allocs == 0, report.first_mismatch
    assert report.segment_free_matches == report.segment_frees, report.first_mismatch
    assert report.layout_identical, report.first_mismatch
    assert report.ok


@needs_shared_traces
def test_all_30_recordings_are_there():
    # 29 with default settings, 1 with expandable segments (3 devices): 32 replays in all
    assert len(recorded_traces()) == 30 and len(_devices()) == 32


def _record(program, conf: str = "") -> dict:
    """A simulated 'recording' of a program (list of ('m', id, size) / ('f', id))."""
    history: list = []
    a = CachingAllocator(parse_alloc_conf(conf), history=history)
    live = {}
    for step in program:
        if step[0] == "m":
            live[step[1]] = a.malloc(step[2])
        elif step[0] == "f":
            a.free(live.pop(step[1]))
        elif step[0] == "e":
            a.empty_cache()
    return make_snapshot(a, history)


PROGRAM = [("m", 0, 5 * MiB), ("m", 1, 700), ("m", 2, 30 * MiB), ("f", 0), ("m", 3, 4 * MiB),
           ("m", 4, 3 * MiB), ("f", 2), ("e",), ("m", 5, 12 * MiB), ("f", 3), ("m", 6, 200)]


def test_cold_replay_of_a_simulated_recording_matches():
    report = replay_snapshot(_record(PROGRAM))
    assert not report.warm_start and report.ok
    assert report.allocs == 7 and report.segment_frees == 1


def test_warm_replay_rebuilds_the_start_state():
    snap = _record(PROGRAM)
    # Drop the first half of the events, as if recording started late.
    events = snap["device_traces"][0]
    cut = next(i for i, e in enumerate(events) if e["action"] == "free_completed")
    late = dict(snap, device_traces=[events[cut + 1:]])
    assert is_warm(late)
    start = rebuild_start_state(late, parse_alloc_conf(""))
    live = [b for s in start for b in s["blocks"] if b[2]]
    assert sorted(b[3] for b in live) == [700, 30 * MiB]  # ids 1 and 2 were live at the cut
    report = replay_snapshot(late)
    assert report.warm_start and report.ok, report.mismatches


def test_a_wrong_recording_is_reported():
    snap = _record(PROGRAM)
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc" and e["size"] == 4 * MiB:
            e["addr"] += 512
    report = replay_snapshot(snap)
    assert not report.ok
    assert report.address_matches == report.allocs - 1
    assert "recorded" in report.first_mismatch


def test_what_if_config_reports_peaks_only():
    snap = _record([("m", i, 16 * MiB) for i in range(8)])
    base = replay_snapshot(snap)
    exp = replay_snapshot(snap, config=parse_alloc_conf("expandable_segments:True"))
    assert base.peak_reserved_bytes == 8 * 16 * MiB  # >= 10 MiB: a segment of its own size each
    assert exp.peak_reserved_bytes == 7 * 20 * MiB  # seven 20 MiB pages (allocator-spec.md)
    assert exp.allocs == 8 and exp.address_matches == 0  # addresses are not compared


def test_snapshot_round_trips_through_the_safe_loader():
    snap = _record(PROGRAM)
    assert loads_snapshot(pickle.dumps(snap)) == snap
