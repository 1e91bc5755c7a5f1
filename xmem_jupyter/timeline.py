"""Memory-timeline data: allocated and reserved bytes over the trace's event axis.

The estimate's ``Timeline`` has one sample per allocation or free (10^5 and more for large
steps); a line that long is slow to draw and no more readable than its envelope. ``thin``
keeps, per bucket, the sample where allocated memory is highest and the one where reserved
memory is highest, so every local peak keeps its height.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xmem_engine.estimate import Estimate

from xmem_jupyter.figures import figures


@dataclass
class TimelineData:
    """Columns for the step lines, plus the limits drawn as horizontal lines (bytes / scale)."""

    columns: dict[str, list]
    capacity: float  # the GPU's memory
    allocator_limit: float  # what the allocator may reserve: capacity - context - libraries
    peak_x: int
    oom_x: int | None  # where the simulated run on this GPU runs out of memory (None: it does not)
    top: float  # the y range's end: the capacity and the highest line, whichever is higher
    phases: list[tuple[int, int, str]]  # (start, end, phase)
    unit: str
    iterations: list[int]
    # the calibrated range of the reserved peak (the estimate's range less context and libraries)
    range_low: float = float("nan")
    range_high: float = float("nan")
    # each named figure as the charts' labels print it (figures.py: the same words everywhere)
    labels: dict[str, str] = field(default_factory=dict)


def thin(x: np.ndarray, a: np.ndarray, r: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: each bucket's allocated maximum and reserved maximum, in order."""
    n = len(x)
    if n <= max_points:
        return np.arange(n)
    nb = max_points // 2
    edges = np.linspace(0, n, nb + 1).astype(np.int64)
    keep = [0, n - 1]
    for b in range(nb):
        lo, hi = int(edges[b]), int(edges[b + 1])
        if hi > lo:
            keep.append(lo + int(np.argmax(a[lo:hi])))
            keep.append(lo + int(np.argmax(r[lo:hi])))
    return np.unique(np.asarray(keep, dtype=np.int64))


def build_timeline(est: Estimate, x_end: int, max_points: int = 4000) -> TimelineData:
    """The estimate's timeline in one unit for the axis and the limits: GiB once the chart
    reaches 2 GiB (the capacity is always on it), MiB below."""
    tl = est.timeline
    rng = est.peak_range
    fixed = est.context_bytes + est.outside_allocator_bytes
    band = (rng.low_bytes - fixed, rng.high_bytes - fixed) if rng is not None else None
    high = max([est.capacity_bytes, est.allocator_limit_bytes, *tl.reserved, *tl.allocated, 1,
                *(band or ())])
    scale, unit = (float(1 << 30), "GiB") if high > (2 << 30) else (float(1 << 20), "MiB")
    x = np.asarray(tl.event, dtype=np.int64)
    a = np.asarray(tl.allocated, dtype=np.int64)
    r = np.asarray(tl.reserved, dtype=np.int64)
    keep = thin(x, a, r, max_points) if len(x) else np.arange(0)
    peak_x = int(x[int(np.argmax(a))]) if len(x) else 0
    phases = []
    for k, (start, name) in enumerate(tl.phases):
        stop = tl.phases[k + 1][0] if k + 1 < len(tl.phases) else x_end
        if stop > start:
            phases.append((int(start), int(stop), name))
    return TimelineData(
        columns={"x": x[keep].tolist(), "allocated": (a[keep] / scale).tolist(),
                 "reserved": (r[keep] / scale).tolist()},
        capacity=est.capacity_bytes / scale,
        allocator_limit=est.allocator_limit_bytes / scale,
        peak_x=peak_x,
        oom_x=est.oom_event if est.oom else None,
        top=high * 1.05 / scale,
        phases=phases,
        unit=unit,
        iterations=[int(i) for i in tl.iterations],
        range_low=band[0] / scale if band else float("nan"),
        range_high=band[1] / scale if band else float("nan"),
        labels={k: f.text for k, f in figures(est).items()},
    )
