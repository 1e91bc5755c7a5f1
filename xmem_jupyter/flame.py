"""Flame-chart data: tensor lifetimes from a trace, as stacked rectangles with level of detail.

The x axis is the index of the event in the (GPU-adapted) trace, the axis the estimate's
``Timeline`` uses, so the flame chart and the memory timeline line up. Each tensor is a bar
from its ``alloc`` to its ``free``; bars are stacked so the height at any moment is the live
(allocated) memory: block sizes are rounded to the allocator's 512-byte granularity, which is
what ``memory_allocated()`` counts for all but unsplit blocks.

Why level of detail: a training step of a large model makes 10^5 tensors, and a browser
canvas stays responsive with a few 10^4 rectangles. So only the ``max_bars`` largest tensors
are drawn one by one; the others are summed per (module, category, time bucket) into one
rectangle each. Drawn bars keep their offset while they live, except at bucket edges where
the stack is compacted after frees (a bar then continues as a new segment lower down): the
height is exact at every bucket edge and never below the live memory in between.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

import numpy as np

from xmem_engine.estimate import NO_MODULE
from xmem_engine.trace import ALLOC, FREE, TraceEvent
from xmem_jupyter.palette import CATEGORY_COLORS, CATEGORY_ORDER  # noqa: F401  (flame data uses the order)

ROUND = 512
COLUMNS = ("left", "right", "bottom", "top", "cat", "category", "module", "tip", "count")
NUMERIC = ("left", "right", "bottom", "top", "cat", "count")
#: the columns the browser gets: numbers travel as binary arrays, only the hover text as strings
DRAWN = ("left", "right", "bottom", "top", "cat", "tip")


@dataclass
class FlameData:
    """Rectangles for a Bokeh ``quad`` glyph (``columns``) plus what the chart annotates."""

    columns: dict[str, list]
    n_tensors: int  # tensors in the trace
    n_bars: int  # tensors drawn one by one
    n_aggregated: int  # small tensors summed into bucket rectangles
    threshold_bytes: int  # tensors below this are aggregated (0: none)
    x_end: int  # one past the last event
    peak_x: int  # event index where the live memory peaks
    peak_bytes: int  # live (rounded) bytes there
    scale: float  # bytes per y unit
    unit: str  # "MiB" / "GiB"
    notes: list[str] = field(default_factory=list)


def human(n: float) -> str:
    """Bytes as people read them (binary units)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def source_labeler():
    """A function that names IPython cells as the notebook shows them: the tracer records
    ``/tmp/ipykernel_1/123.py:20`` for a line of an earlier cell; readers know it as ``In[3]:20``."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        names = dict(getattr(getattr(ip, "compile", None), "_filename_map", {}) or {})
    except Exception:  # no IPython: sources stay as recorded
        names = {}
    cache: dict[str, str] = {}

    def label(src: str) -> str:
        if src not in cache:
            fn, sep, line = src.rpartition(":")
            n = names.get(fn) if sep else None
            cache[src] = f"In[{n}]:{line}" if n is not None else src
        return cache[src]

    return label


def unit_for(peak_bytes: int) -> tuple[float, str]:
    """The y unit: GiB when the peak is over 2 GiB, else MiB."""
    return (float(1 << 30), "GiB") if peak_bytes > (2 << 30) else (float(1 << 20), "MiB")


def _rounded(n: int) -> int:
    return max(ROUND, -(-n // ROUND) * ROUND)


def build_flame(events: list[TraceEvent], *, max_bars: int = 2000, n_buckets: int = 400,
                max_modules: int = 16, gap_tolerance: float = 0.05) -> FlameData:
    """Lifetimes of the ``alloc``/``free`` events -> stacked rectangles (see module docstring)."""
    n_ev = len(events)
    x_end = max(n_ev, 1)
    starts: list[int] = []
    ends: list[int] = []
    sizes: list[int] = []
    evs: list[TraceEvent] = []
    slot: dict[int, int] = {}
    for i, e in enumerate(events):
        k = e.kind
        if k == ALLOC:
            slot[e.id] = len(starts)
            starts.append(i)
            ends.append(x_end)
            sizes.append(_rounded(e.bytes))
            evs.append(e)
        elif k == FREE:
            j = slot.pop(e.id, None)
            if j is not None:
                ends[j] = i
    n = len(starts)
    start = np.asarray(starts, dtype=np.int64)
    end = np.asarray(ends, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64)

    # live memory at every event (all tensors): where the peak is, and bucket representatives
    delta = np.zeros(x_end + 1, dtype=np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, end, -size)
    live = np.cumsum(delta)[:x_end]
    peak_x = int(np.argmax(live)) if n else 0
    peak_bytes = int(live[peak_x]) if n else 0
    scale, unit = unit_for(peak_bytes)

    # which tensors get their own bar
    if n <= max_bars:
        big = np.ones(n, dtype=bool)
        threshold = 0
    else:
        order = np.argsort(-size, kind="stable")
        big = np.zeros(n, dtype=bool)
        big[order[:max_bars]] = True
        threshold = int(size[order[max_bars - 1]])
    edges = np.unique(np.linspace(0, x_end, min(n_buckets, x_end) + 1).astype(np.int64))

    cols: dict[str, list] = {c: [] for c in COLUMNS}
    tops_x, tops_v = _stack_bars(np.flatnonzero(big), start, end, size, edges, x_end, evs, cols, scale,
                                 source_labeler(), gap_tolerance)
    small = np.flatnonzero(~big)
    if small.size:
        _aggregate(small, start, end, size, edges, live, tops_x, tops_v, evs, cols, scale, threshold,
                   max_modules)
    notes = []
    if threshold:
        notes.append(f"flame chart: the {small.size:,} smallest tensors ({human(threshold)} or less each) are "
                     f"summed per module, category and time bucket")
    for c in NUMERIC:
        cols[c] = np.asarray(cols[c], dtype=np.float64 if c in ("bottom", "top") else np.int32)
    return FlameData(cols, n, int(big.sum()), int(small.size), threshold, x_end, peak_x, peak_bytes,
                     scale, unit, notes)


def _stack_bars(idx: np.ndarray, start: np.ndarray, end: np.ndarray, size: np.ndarray, edges: np.ndarray,
                x_end: int, evs: list[TraceEvent], cols: dict[str, list], scale: float,
                label=lambda s: s, gap_tolerance: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Stack the drawn tensors in allocation order; returns the stack's top over time.

    Compacting re-cuts every bar above a hole, so it is done only where the holes add up to
    more than ``gap_tolerance`` of the stack: a few thousand rectangles instead of tens of
    thousands for a model's step, the height within that fraction of the live memory."""
    seq: list[tuple[int, int, int]] = []  # (x, 1 alloc / 0 free, tensor)
    for k in idx.tolist():
        seq.append((int(start[k]), 1, k))
        if end[k] < x_end:
            seq.append((int(end[k]), 0, k))
    seq.sort()
    sz = size.tolist()
    live: dict[int, int] = {}  # tensor -> offset, in stack order
    seg0: dict[int, int] = {}
    segs: list[tuple[int, int, int, int]] = []  # (tensor, x0, x1, offset)
    top = live_sum = 0
    tops_x: list[int] = [0]
    tops_v: list[int] = [0]
    edge_list = edges.tolist()
    ei = 1

    def compact(x: int) -> int:
        off = 0
        for k, o in live.items():
            if o != off:
                if x > seg0[k]:
                    segs.append((k, seg0[k], x, o))
                seg0[k] = x
                live[k] = off
            off += sz[k]
        return off

    for x, is_alloc, k in seq:
        while ei < len(edge_list) and edge_list[ei] <= x:
            if top - live_sum > gap_tolerance * top:
                top = compact(edge_list[ei])
                tops_x.append(edge_list[ei])
                tops_v.append(top)
            ei += 1
        if is_alloc:
            live[k] = top
            seg0[k] = x
            top += sz[k]
            live_sum += sz[k]
        else:
            o = live.pop(k)
            segs.append((k, seg0.pop(k), x, o))
            live_sum -= sz[k]
            if o + sz[k] == top:
                top = o
        tops_x.append(x)
        tops_v.append(top)
    for k, o in live.items():
        segs.append((k, seg0[k], x_end, o))

    for k, x0, x1, o in segs:
        e = evs[k]
        cols["left"].append(x0)
        cols["right"].append(x1)
        cols["bottom"].append(o / scale)
        cols["top"].append((o + sz[k]) / scale)
        cat = e.category or "other"
        mod = e.module or NO_MODULE
        cols["cat"].append(CATEGORY_ORDER.index(cat) if cat in CATEGORY_ORDER else len(CATEGORY_ORDER) - 1)
        cols["category"].append(cat)
        cols["module"].append(mod)
        cols["tip"].append(_tip(f"#{e.id} {_short_op(e.op)}", human(e.bytes), cat, mod,
                                "(" + ", ".join(map(str, e.shape)) + ") " + e.dtype, e.op, label(e.source)))
        cols["count"].append(1)
    return np.asarray(tops_x, dtype=np.int64), np.asarray(tops_v, dtype=np.int64)


def _aggregate(idx: np.ndarray, start: np.ndarray, end: np.ndarray, size: np.ndarray, edges: np.ndarray,
               live: np.ndarray, tops_x: np.ndarray, tops_v: np.ndarray, evs: list[TraceEvent],
               cols: dict[str, list], scale: float, threshold: int, max_modules: int) -> None:
    """Sum the small tensors per (module, category) at one representative event per bucket
    (the bucket's highest live memory, so the peak is drawn at its true height)."""
    nb = len(edges) - 1
    reps = np.array([int(edges[b]) + int(np.argmax(live[edges[b]:max(edges[b + 1], edges[b] + 1)]))
                     for b in range(nb)], dtype=np.int64)
    picked = [evs[k] for k in idx.tolist()]
    mods = [e.module or NO_MODULE for e in picked]
    cats = [e.category or "other" for e in picked]
    # keep the modules with the most bytes x time; the rest share one label
    weight: dict[str, int] = {}
    dur = (end[idx] - start[idx]) * size[idx]
    for m, w in zip(mods, dur.tolist()):
        weight[m] = weight.get(m, 0) + w
    kept = sorted(weight, key=weight.__getitem__, reverse=True)[:max_modules]
    mod_names = sorted(kept) + ["(other modules)"]
    mod_ix = {m: i for i, m in enumerate(mod_names[:-1])}
    cat_ix = {c: i for i, c in enumerate(CATEGORY_ORDER)}
    nm = len(mod_names)
    g = np.array([cat_ix.get(c, len(CATEGORY_ORDER) - 1) * nm + mod_ix.get(m, nm - 1)
                  for c, m in zip(cats, mods)], dtype=np.int64)
    n_groups = len(CATEGORY_ORDER) * nm
    ia = np.searchsorted(reps, start[idx], "left")
    ib = np.searchsorted(reps, end[idx], "left")
    mat = np.zeros((n_groups, nb + 1), dtype=np.int64)
    cnt = np.zeros((n_groups, nb + 1), dtype=np.int64)
    np.add.at(mat, (g, ia), size[idx])
    np.add.at(mat, (g, ib), -size[idx])
    np.add.at(cnt, (g, ia), 1)
    np.add.at(cnt, (g, ib), -1)
    val = np.cumsum(mat, axis=1)[:, :nb]
    num = np.cumsum(cnt, axis=1)[:, :nb]
    stack = np.cumsum(val, axis=0)
    base = tops_v[np.searchsorted(tops_x, reps, "right") - 1]
    gi, bi = np.nonzero(val > 0)
    lo = (base[bi] + stack[gi, bi] - val[gi, bi]) / scale
    hi = (base[bi] + stack[gi, bi]) / scale
    under = escape(human(threshold))
    group_tip = [_tip("", "", CATEGORY_ORDER[k // nm], mod_names[k % nm], "",
                      "(summed per module, category and time bucket)", "") for k in range(n_groups)]
    for gg, b, y0, y1 in zip(gi.tolist(), bi.tolist(), lo.tolist(), hi.tolist()):
        cols["left"].append(int(edges[b]))
        cols["right"].append(int(edges[b + 1]))
        cols["bottom"].append(y0)
        cols["top"].append(y1)
        cols["cat"].append(gg // nm)
        cols["category"].append(CATEGORY_ORDER[gg // nm])
        cols["module"].append(mod_names[gg % nm])
        k = int(num[gg, b])
        cols["tip"].append(f"<b>tensors</b> {k}, each {under} or less<br><b>size</b> {human(int(val[gg, b]))}<br>"
                           + group_tip[gg])
        cols["count"].append(k)


def _tip(name: str, size: str, cat: str, module: str, shape: str, op: str, source: str) -> str:
    """The hover text, one pre-escaped HTML string: one column serialises far faster than seven."""
    rows = [("tensor", name), ("size", size), ("category", cat), ("module", module), ("shape", shape),
            ("op", op), ("line", source)]
    return "<br>".join(f"<b>{k}</b> {escape(v)}" for k, v in rows if v)


def _short_op(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else op


#: the saved report's flame chart: few enough rectangles for a notebook file and an SVG
REPORT_BARS, REPORT_BUCKETS, REPORT_MODULES, REPORT_MAX_RECTS = 300, 120, 6, 3000
_REPORT_CACHE: dict[int, tuple[object, dict]] = {}


def _plain(tip: str) -> str:
    """A hover text as plain text (the report's renderer sets it with textContent)."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", tip.replace("<br>", "\n")))


def flame_report(est) -> dict | None:
    """The flame chart as the saved report carries it (``flame``): the largest tensors as bars,
    the rest summed per module, category and time bucket, each rectangle with its category
    (an index into ``categories``) and a plain-text label; None without simulated events.
    Cached per estimate's events: a GPU switch re-sends the report."""
    events = est.simulated_events
    if not events:
        return None
    hit = _REPORT_CACHE.get(id(events))
    if hit is not None and hit[0] is events:
        return hit[1]
    buckets = REPORT_BUCKETS
    while True:
        fl = build_flame(events, max_bars=REPORT_BARS, n_buckets=buckets, max_modules=REPORT_MODULES)
        if len(fl.columns["left"]) <= REPORT_MAX_RECTS or buckets <= 15:
            break
        buckets //= 2
    c = fl.columns
    # one label per tensor (a bar cut at bucket edges is several rectangles) and per summed
    # group: labels are stored once, each rectangle points at its own
    labels: list[str] = []
    index: dict[str, int] = {}
    label_ix = []
    for tip, count, cat, module in zip(c["tip"], c["count"], c["category"], c["module"]):
        text = _plain(tip) if count == 1 and not tip.startswith("<b>tensors</b>") else \
            f"tensors of {human(fl.threshold_bytes)} or less, summed\ncategory {cat}\nmodule {module}"
        if text not in index:
            index[text] = len(labels)
            labels.append(text)
        label_ix.append(index[text])
    out = {
        "unit": fl.unit, "scale": fl.scale, "x_end": fl.x_end, "n_tensors": fl.n_tensors, "n_bars": fl.n_bars,
        "n_aggregated": fl.n_aggregated, "peak_event": fl.peak_x, "peak_bytes": fl.peak_bytes,
        "categories": list(CATEGORY_ORDER),
        "left": [int(v) for v in c["left"]], "right": [int(v) for v in c["right"]],
        "bottom": [round(float(v), 4) for v in c["bottom"]], "top": [round(float(v), 4) for v in c["top"]],
        "cat": [int(v) for v in c["cat"]], "label": label_ix, "labels": labels,
        "notes": list(fl.notes),
    }
    if len(_REPORT_CACHE) > 8:
        _REPORT_CACHE.clear()
    _REPORT_CACHE[id(events)] = (events, out)
    return out
