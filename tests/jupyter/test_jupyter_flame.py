"""The flame chart's data: bars from the trace's lifetimes, stacked to the live memory."""

from __future__ import annotations


import numpy as np
import pytest

from xmem_engine.trace import Trace, TraceEvent
from xmem_jupyter.flame import ROUND, build_flame
from xmem_jupyter.timeline import thin


def _ev(kind, i, nbytes=0, cat="activation", module="m"):
    return TraceEvent(kind, id=i, bytes=nbytes, category=cat, module=module, op="aten.mm.default",
                      dtype="float32", shape=(nbytes // 4,), source="In[1]:3")


def _live_at(events, x):
    live, sizes = 0, {}
    for e in events[:x + 1]:
        if e.kind == "alloc":
            sizes[e.id] = max(ROUND, -(-e.bytes // ROUND) * ROUND)
            live += sizes[e.id]
        elif e.kind == "free":
            live -= sizes.pop(e.id)
    return live


def _height_at(fl, x):
    c = fl.columns
    mask = (c["left"] <= x) & (c["right"] > x)
    return float(np.max(c["top"][mask], initial=0.0)) * fl.scale


def test_each_tensor_is_a_bar_from_alloc_to_free():
    ev = [_ev("alloc", 1, 4096, "parameter"), _ev("alloc", 2, 1 << 20), _ev("alloc", 3, 1000, "temporary"),
          _ev("free", 3), _ev("free", 2)]
    fl = build_flame(ev)
    assert fl.n_tensors == 3 and fl.n_bars == 3 and fl.threshold_bytes == 0
    c = fl.columns
    bars = sorted(zip(c["left"].tolist(), c["right"].tolist(), c["category"]))
    assert bars == [(0, 5, "parameter"), (1, 4, "activation"), (2, 3, "temporary")]
    assert fl.peak_x == 2 and fl.peak_bytes == 4096 + (1 << 20) + 1024
    assert "In[1]:3" in c["tip"][0] and "aten.mm.default" in c["tip"][0]


def test_hover_text_is_escaped():
    ev = [TraceEvent("alloc", id=1, bytes=512, category="activation", module="<script>x</script>", op="op")]
    tip = build_flame(ev).columns["tip"][0]
    assert "<script>" not in tip and "&lt;script&gt;" in tip


def test_stack_height_is_live_memory_at_bucket_edges():
    rng = np.random.default_rng(0)
    ev, live, k = [], [], 0
    for step in range(3000):
        if live and rng.random() < 0.45:
            ev.append(_ev("free", live.pop(int(rng.integers(len(live))))))
        else:
            k += 1
            ev.append(_ev("alloc", k, int(rng.choice([512, 5000, 1 << 16, 1 << 20]))))
            live.append(k)
    fl = build_flame(ev, max_bars=200, n_buckets=50)
    assert fl.n_bars == 200 and fl.n_aggregated == k - 200
    edges = np.unique(np.linspace(0, fl.x_end, 51).astype(int))[:-1]
    for x in edges[1:]:
        # at an edge the stack is compact: drawn height == live memory at the bucket's
        # representative event, never below the live memory at the edge itself
        assert _height_at(fl, x) >= _live_at(ev, x - 1) * 0.98 - 1, x
    assert fl.peak_bytes <= _height_at(fl, fl.peak_x) <= 1.06 * fl.peak_bytes
    exact = build_flame(ev, max_bars=200, n_buckets=50, gap_tolerance=0.0)
    assert _height_at(exact, exact.peak_x) == pytest.approx(exact.peak_bytes, rel=1e-6)


def test_100k_tensors_stay_fast_and_small():
    from benchmarks.widget_speed import synthetic_trace

    tr: Trace = synthetic_trace(100_000)
    fl = build_flame(tr.events)  # how fast: benchmarks/widget_speed.py
    assert fl.n_tensors >= 99_000
    assert len(fl.columns["left"]) < 40_000  # what the browser draws


def test_thin_keeps_peaks():
    x = np.arange(100_000)
    a = np.sin(x / 500.0) * 100 + 100
    a[54_321] = 1_000
    keep = thin(x, a, a, 1000)
    assert len(keep) <= 1002 and 54_321 in keep
