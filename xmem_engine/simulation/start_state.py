"""The allocator's state when a recording started, rebuilt from the recording.

A recording (``torch.cuda.memory._dump_snapshot``) holds the final segments and the events
that led there. One that started late ("warm") began with segments already reserved (or,
with expandable segments, pages already mapped) and tensors already live; undoing the
events backwards from the final state gives that starting layout (:func:`rebuild_start_state`).
With expandable segments the address space each segment reserves depends on the device's
total memory, which the recording shows only indirectly (:func:`infer_device_total`).
"""

from __future__ import annotations

import bisect

from xmem_engine.simulation.alloc_conf import AllocatorConfig
from xmem_engine.simulation.allocator import (K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_SMALL_SIZE,
                                              CachingAllocator)


def snapshot_events(snapshot: dict, device: int = 0) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if len(traces) > device else []


class _Ranges:
    """A set of address ranges, kept as sorted, disjoint, merged [start, end) pairs."""

    def __init__(self) -> None:
        self.spans: list[list[int]] = []

    def add(self, start: int, end: int) -> None:
        spans = self.spans
        lo = bisect.bisect_left(spans, [start]) - 1  # the last span starting before ``start``
        if lo < 0 or spans[lo][1] < start:
            lo += 1
        hi = lo
        while hi < len(spans) and spans[hi][0] <= end:
            start, end = min(start, spans[hi][0]), max(end, spans[hi][1])
            hi += 1
        spans[lo:hi] = [[start, end]]

    def overlaps(self, start: int, end: int) -> bool:
        k = bisect.bisect_left(self.spans, [end]) - 1
        return k >= 0 and self.spans[k][1] > start

    def remove(self, start: int, end: int) -> None:
        spans = self.spans
        lo = max(bisect.bisect_left(spans, [start]) - 1, 0)
        hi = lo
        keep = []
        while hi < len(spans) and spans[hi][0] < end:
            a, b = spans[hi]
            if b <= start:
                keep.append([a, b])
            else:
                if a < start:
                    keep.append([a, start])
                if b > end:
                    keep.append([end, b])
            hi += 1
        spans[lo:hi] = keep


def _expandable_start(snapshot: dict, device: int) -> tuple[_Ranges, dict[int, dict]]:
    """The expandable address ranges mapped when the recording started (final mapped ranges,
    with every ``segment_map`` undone and every ``segment_unmap`` redone, backwards), and
    the final expandable segments by address."""
    mapped = _Ranges()
    final = {}
    for s in snapshot["segments"]:
        if s.get("device", 0) == device and s.get("is_expandable"):
            mapped.add(s["address"], s["address"] + s["total_size"])
            final[s["address"]] = s
    for e in reversed(snapshot_events(snapshot, device)):
        if e["action"] == "segment_map":
            mapped.remove(e["addr"], e["addr"] + e["size"])
        elif e["action"] == "segment_unmap":
            mapped.add(e["addr"], e["addr"] + e["size"])
    return mapped, final


def is_warm(snapshot: dict, device: int = 0) -> bool:
    """True when the recording started with segments already reserved (or pages mapped)."""
    events = snapshot_events(snapshot, device)
    segs = {s["address"] for s in snapshot["segments"]
            if s.get("device", 0) == device and not s.get("is_expandable")}
    for e in reversed(events):
        if e["action"] == "segment_alloc":
            segs.discard(e["addr"])
        elif e["action"] == "segment_free":
            segs.add(e["addr"])
    return bool(segs) or bool(_expandable_start(snapshot, device)[0].spans)


def _expandable_extents(snapshot: dict, device: int) -> list[tuple[bool, int, int, int]]:
    """(is_small, stream, start, end) of every expandable range the recording shows mapped:
    final segments (their type recorded) and segment_map / segment_unmap events (small-pool
    pages are 2 MiB, large-pool ones 20 MiB; a map is of the pool's pages)."""
    out = []
    for s in snapshot["segments"]:
        if s.get("device", 0) == device and s.get("is_expandable"):
            out.append((s.get("segment_type") == "small", s["stream"], s["address"], s["address"] + s["total_size"]))
    for e in snapshot_events(snapshot, device):
        if e["action"] in ("segment_map", "segment_unmap") and e["size"] > 0:
            inside = [x for x in out if x[1] == e["stream"] and x[2] <= e["addr"] < x[3]]
            small = inside[0][0] if inside else e["size"] % K_LARGE_BUFFER != 0
            out.append((small, e["stream"], e["addr"], e["addr"] + e["size"]))
    return out


def infer_device_total(snapshot: dict, device: int = 0) -> int | None:
    """The device's total memory as far as an expandable-segments recording shows it, or None.

    Each expandable segment reserves address space for 1 1/8 of the device's memory, in
    whole pages (``ExpandableSegment``); the driver hands out reservations one after the
    other, so when one stream's large-pool and small-pool segments were reserved back to
    back, the distance between their first addresses is the first one's size.
    """
    ext = _expandable_extents(snapshot, device)
    if not ext or len({x[1] for x in ext}) != 1:
        return None
    large = [x for x in ext if not x[0]]
    small = [x for x in ext if x[0]]
    if not large or not small:
        return None
    lo_l, hi_l = min(x[2] for x in large), max(x[3] for x in large)
    lo_s, hi_s = min(x[2] for x in small), max(x[3] for x in small)
    if lo_s >= hi_l:
        vsize, page, used = lo_s - lo_l, K_LARGE_BUFFER, hi_l - lo_l
    elif lo_l >= hi_s:
        vsize, page, used = lo_l - lo_s, K_SMALL_BUFFER, hi_s - lo_s
    else:
        return None
    if vsize % page or vsize < used or not 1 << 30 <= vsize <= 1 << 44:
        return None
    # The largest total whose 9/8 fills exactly those pages (any total in the last page's span
    # reserves the same; the largest also fits the other pool's reservation best).
    total = vsize * 8 // 9
    while total + total // 8 > vsize:
        total -= 1
    return total


def rebuild_start_state(snapshot: dict, config: AllocatorConfig, device: int = 0,
                        device_total: int | None = None) -> list[dict]:
    """The segments (with blocks) the allocator held when the recording started.

    Undo the events backwards from the final state: an ``alloc`` undone frees its address,
    a ``free_completed`` undone makes it live again (with its requested size), a
    ``segment_alloc`` undone removes the segment and a ``segment_free`` undone restores it;
    with expandable segments a ``segment_map`` undone unmaps its pages and a
    ``segment_unmap`` undone maps them again. Each mapped range of an expandable segment is
    returned as a segment of its own (as PyTorch's snapshot reports them), with
    ``expandable`` set and its segment's ``base`` and ``virtual_size`` (the address space of
    one segment follows from ``device_total``, as in the allocator). Block sizes of live blocks known only by their request are the
    rounded size; in a non-expandable large segment, plus the unsplit remainder a
    large-pool block may carry (<= 1 MiB, never split off): all of a gap of <= 1 MiB up to
    the next live block, or, when free space follows, up to the first address the
    recording allocates there while the block is still live (best fit hands out the front
    of the free block that starts where the live block ends). An expandable segment splits
    off any remainder. The rest of each segment (or mapped range) is free, one block per gap.
    """
    rounder = CachingAllocator(config)
    segs: dict[int, dict] = {}
    live: dict[int, tuple[int | None, int]] = {}  # addr -> (exact size or None, requested)
    for s in snapshot["segments"]:
        if s.get("device", 0) != device:
            continue
        if not s.get("is_expandable"):
            segs[s["address"]] = {"addr": s["address"], "size": s["total_size"], "stream": s["stream"],
                                  "is_small": s.get("segment_type") == "small", "expandable": False}
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                live[b["address"]] = (b["size"], b["requested_size"])
    events = snapshot_events(snapshot, device)
    freed_at: dict[int, int] = {}  # start-live addr -> index of the event that frees it
    first_alloc: dict[int, int] = {}  # recorded alloc addr -> index of its first alloc
    for idx in range(len(events) - 1, -1, -1):
        e = events[idx]
        action, addr = e["action"], e.get("addr")
        if action == "alloc":
            live.pop(addr, None)
            first_alloc[addr] = idx
        elif action == "free_completed":
            live[addr] = (None, e["size"])
            freed_at[addr] = idx
        elif action == "segment_alloc":
            segs.pop(addr, None)
        elif action == "segment_free":
            segs[addr] = {"addr": addr, "size": e["size"], "stream": e["stream"],
                          "is_small": e["size"] == K_SMALL_BUFFER, "expandable": False}
    vsize = {small: CachingAllocator(config, device_total=device_total).expandable_segment_size(
        K_SMALL_BUFFER if small else K_LARGE_BUFFER) for small in (False, True)}
    for r in _expandable_start_ranges(snapshot, device, live, events, vsize):
        segs[r["addr"]] = r
    seg_list = sorted(segs.values(), key=lambda s: s["addr"])
    live_addrs = sorted(live)
    alloc_addrs = sorted(first_alloc)
    out = []
    j = 0
    for s in seg_list:
        start, end = s["addr"], s["addr"] + s["size"]
        while j < len(live_addrs) and live_addrs[j] < start:
            j += 1
        inside = []
        while j < len(live_addrs) and live_addrs[j] < end:
            inside.append(live_addrs[j])
            j += 1
        blocks = []
        cursor = start
        for k, a in enumerate(inside):
            if a > cursor:
                blocks.append((cursor, a - cursor, False, 0))
            exact, requested = live[a]
            nxt = inside[k + 1] if k + 1 < len(inside) else end
            if exact is None:
                size = rounder.round_size(requested)
                gap = nxt - (a + size)
                if s["expandable"]:
                    pass  # should_split: any remainder of >= 512 bytes is split off
                elif 0 < gap < K_MIN_BLOCK_SIZE or (not s["is_small"] and 0 < gap <= K_SMALL_SIZE):
                    size += gap
                elif not s["is_small"] and gap > K_SMALL_SIZE:
                    lo = a + size
                    k = bisect.bisect_right(alloc_addrs, lo)
                    while k < len(alloc_addrs) and alloc_addrs[k] <= lo + K_SMALL_SIZE:
                        if first_alloc[alloc_addrs[k]] < freed_at.get(a, len(events)):
                            size = alloc_addrs[k] - a
                            break
                        k += 1
            else:
                size = exact
            blocks.append((a, size, True, requested))
            cursor = a + size
        if cursor < end:
            blocks.append((cursor, end - cursor, False, 0))
        out.append({**s, "blocks": blocks})
    return out


def _inside(spans: list[tuple[int, int]], x: int) -> bool:
    """Whether ``x`` lies strictly inside one of the sorted, disjoint ``spans``."""
    k = bisect.bisect_left(spans, (x, x)) - 1
    return k >= 0 and spans[k][0] < x < spans[k][1]


def _expandable_owners(spans: list[list[int]], live: dict, events: list[dict],
                       final: dict[int, dict]) -> list[tuple[int, bool]]:
    """(stream, is_small) of each expandable range mapped at the start. An address range may
    belong to another segment later (a segment whose pages are all unmapped is released, and
    its addresses may be reserved again), so they come from the first event that touches
    the range (it still belongs to the segment that held it at the start: the segment can go
    only after that range is unmapped, an event that touches it), else from the final
    segment holding it. The pool also shows in sizes: small-pool blocks are <= 1 MiB, and
    its pages 2 MiB, large-pool pages 20 MiB."""
    starts = [a for a, _ in spans]
    first: list[dict | None] = [None] * len(spans)
    for e in events:
        addr = e.get("addr")
        if addr is None:
            continue
        k = max(bisect.bisect_right(starts, addr) - 1, 0)
        while k < len(spans) and spans[k][0] < addr + max(e["size"], 1):
            if addr < spans[k][1] and first[k] is None:
                first[k] = e
            k += 1
    finals = sorted(final)
    out = []
    for k, (start, end) in enumerate(spans):
        e = first[k]
        j = bisect.bisect_right(finals, start) - 1
        seg = final[finals[j]] if j >= 0 and start < finals[j] + final[finals[j]]["total_size"] else None
        stream = e["stream"] if e is not None else (seg["stream"] if seg is not None else 0)
        inside = [v for a, v in live.items() if start <= a < end]
        if inside:
            is_small = all(v[0] <= K_SMALL_SIZE if v[0] is not None else v[1] <= K_SMALL_SIZE for v in inside)
        elif e is not None and e["action"] in ("alloc", "free_requested", "free_completed"):
            is_small = e["size"] <= K_SMALL_SIZE
        elif (end - start) % K_LARGE_BUFFER or (e is not None and e["size"] % K_LARGE_BUFFER):
            is_small = True
        elif seg is not None:
            is_small = seg.get("segment_type") == "small"
        else:
            is_small = False
        out.append((stream, is_small))
    return out


def _expandable_start_ranges(snapshot: dict, device: int, live: dict, events: list[dict],
                             vsize: dict[bool, int]) -> list[dict]:
    """The expandable ranges mapped at the start, each with its pool, stream and segment.

    Each segment reserves ``vsize`` of address space. What lay below a segment's lowest
    range mapped at the start is not known; that range is taken to be its base, and the
    ranges of the same pool and stream that follow within that size share it. Ranges are
    first cut wherever the recording shows a boundary (final segments, maps, unmaps), since
    two segments reserved back to back may both be mapped where they meet; the pieces of
    one segment are joined again. A segment's address space ends where the next begins.
    """
    mapped, final = _expandable_start(snapshot, device)
    cuts = set()
    for a, seg in final.items():
        cuts.update((a, a + seg["total_size"]))
    for e in events:
        if e["action"] in ("segment_map", "segment_unmap") and e["size"] > 0:
            cuts.update((e["addr"], e["addr"] + e["size"]))
    # (a block never crosses from one segment into the next: no cut inside one live at the start)
    spans_live = sorted((a, a + (v[0] if v[0] is not None else v[1])) for a, v in live.items())
    cuts_sorted = sorted(c for c in cuts if not _inside(spans_live, c))
    pieces = []
    for a, b in mapped.spans:
        lo = bisect.bisect_right(cuts_sorted, a)
        hi = bisect.bisect_left(cuts_sorted, b)
        points = [a] + cuts_sorted[lo:hi] + [b]
        pieces += [[x, y] for x, y in zip(points, points[1:]) if y > x]
    owners = _expandable_owners(pieces, live, events, final)
    # Ranges known to lie in one segment: those pieces, and the ranges the recording maps
    # (a small-pool map is one 2 MiB page, a large-pool one 20 MiB pages), unless the same
    # addresses show up in another pool or stream too (reserved again after a release).
    atoms = [(a, b, stream, small, k) for k, ((a, b), (stream, small)) in enumerate(zip(pieces, owners))]
    maps = [(e["addr"], e["addr"] + e["size"], e["stream"], e["size"] % K_LARGE_BUFFER != 0, -1)
            for e in events if e["action"] == "segment_map" and e["size"] > 0]
    by_key: dict[tuple[int, bool], _Ranges] = {}
    for a, b, stream, small, _ in atoms + maps:
        by_key.setdefault((stream, small), _Ranges()).add(a, b)
    for m in maps:
        if not any(key != (m[2], m[3]) and r.overlaps(m[0], m[1]) for key, r in by_key.items()):
            atoms.append(m)
    # In address order, the ranges of one segment come together (segments do not overlap): a
    # range starts a segment unless it belongs to the one started last (same pool and stream,
    # within its size, a whole number of pages from its base). What lay below a segment's
    # lowest known range is not known: that range is taken to be its base.
    segs: list[list] = []  # [base, stream, small]
    base_of: dict[int, int] = {}  # piece index -> its segment's base
    for a, b, stream, small, k in sorted(atoms):
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        last = segs[-1] if segs else None
        if last is None or (last[1], last[2]) != (stream, small) or b > last[0] + vsize[small] \
                or (a - last[0]) % page:
            last = [a, stream, small]
            segs.append(last)
        if k >= 0:
            base_of[k] = last[0]
    bases = sorted({sg[0] for sg in segs})
    out: list[dict] = []
    for k, ((a, b), (stream, small)) in enumerate(zip(pieces, owners)):
        base = base_of[k]
        prev = out[-1] if out else None
        if prev is not None and prev["base"] == base and prev["addr"] + prev["size"] == a:
            prev["size"] = b - prev["addr"]
            continue
        # A segment's address space ends where the next begins, if that comes first.
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        size = vsize[small]
        j = bisect.bisect_right(bases, base)
        if j < len(bases):
            size = min(size, (bases[j] - base) // page * page)
        out.append({"addr": a, "size": b - a, "stream": stream, "is_small": small, "expandable": True,
                    "base": base, "virtual_size": size})
    return out
