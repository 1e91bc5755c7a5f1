"""Replaying recorded GPU snapshots through the simulator, and checking conformance.

A recorded snapshot (``torch.cuda.memory._dump_snapshot``) holds the final allocator state
(``segments``) and the events that led there (``device_traces``). A replay feeds every
``alloc`` / ``free_completed`` to a :class:`CachingAllocator` and compares, event by event,
what the simulator decided with what the real allocator did:

* for every ``alloc``, the block address chosen;
* for every ``segment_alloc``, that the simulator also called cudaMalloc, with that size;
* at the end, the segment / block layout.

New segments take the addresses the real driver returned, so block addresses can be
compared exactly. A run of ``segment_free`` events that the simulator did not cause is an
``empty_cache()`` (or the out-of-memory release path, which frees the same segments).

"Warm" recordings started with memory already in use. Their starting state is rebuilt
from the final segments by undoing the recorded events in reverse; the live blocks then
fix the layout, because free neighbours always merge (see :func:`rebuild_start_state`).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

from xmem_engine.simulation.alloc_conf import AllocatorConfig, parse_alloc_conf
from xmem_engine.simulation.allocator import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_SMALL_SIZE, Block, CachingAllocator


@dataclass
class ReplayReport:
    """What a replay found; ``ok`` is true only when everything matched."""

    allocs: int = 0
    address_matches: int = 0
    segment_allocs: int = 0  # cudaMalloc calls in the recording
    segment_matches: int = 0  # ... that the simulator made too, with the same size
    unpredicted_segment_allocs: int = 0  # simulator called cudaMalloc, the recording did not
    segment_frees: int = 0
    segment_free_matches: int = 0
    layout_identical: bool = False
    warm_start: bool = False
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    final_allocated_bytes: int = 0
    final_reserved_bytes: int = 0
    alloc_conf: str = ""
    first_mismatch: str = ""
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.address_matches == self.allocs
            and self.segment_matches == self.segment_allocs
            and self.unpredicted_segment_allocs == 0
            and self.segment_free_matches == self.segment_frees
            and self.layout_identical
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["mismatches"] = self.mismatches[:20]
        return d

    def _miss(self, what: str) -> None:
        if not self.first_mismatch:
            self.first_mismatch = what
        if len(self.mismatches) < 100:
            self.mismatches.append(what)


def config_from_snapshot(snapshot: dict) -> AllocatorConfig:
    """The allocator settings a snapshot was recorded with (defaults when absent)."""
    s = snapshot.get("allocator_settings") or {}
    text = s.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    cfg = parse_alloc_conf(text)
    if s.get("expandable_segments"):
        cfg.expandable_segments = True
    if isinstance(s.get("max_split_size"), int) and s["max_split_size"] > 0:
        cfg.max_split_size = s["max_split_size"]
    gc = s.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and gc > 0:
        cfg.garbage_collection_threshold = float(gc)
    divs = s.get("roundup_power2_divisions")
    if isinstance(divs, dict) and len(divs) == len(cfg.roundup_power2_divisions):
        cfg.roundup_power2_divisions = [int(divs[k]) for k in sorted(divs, key=int)]
    return cfg


def _events(snapshot: dict, device: int = 0) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if len(traces) > device else []


def is_warm(snapshot: dict, device: int = 0) -> bool:
    """True when the recording started with segments already reserved."""
    events = _events(snapshot, device)
    segs = {s["address"] for s in snapshot["segments"] if s.get("device", 0) == device}
    for e in reversed(events):
        if e["action"] == "segment_alloc":
            segs.discard(e["addr"])
        elif e["action"] == "segment_free":
            segs.add(e["addr"])
    return bool(segs)


def rebuild_start_state(snapshot: dict, config: AllocatorConfig, device: int = 0) -> list[dict]:
    """The segments (with blocks) the allocator held when the recording started.

    Undo the events backwards from the final state: an ``alloc`` undone frees its address,
    a ``free_completed`` undone makes it live again (with its requested size), a
    ``segment_alloc`` undone removes the segment and a ``segment_free`` undone restores it.
    Block sizes of live blocks known only by their request are the rounded size, plus the
    unsplit remainder a large-pool block may carry (<= 1 MiB, never split off): all of a
    gap of <= 1 MiB up to the next live block, or, when free space follows, up to the
    first address the recording allocates there while the block is still live (best fit
    hands out the front of the free block that starts where the live block ends). The
    rest of each segment is free, one block per gap.
    """
    rounder = CachingAllocator(config)
    segs: dict[int, dict] = {}
    live: dict[int, tuple[int | None, int]] = {}  # addr -> (exact size or None, requested)
    for s in snapshot["segments"]:
        if s.get("device", 0) != device:
            continue
        segs[s["address"]] = {"addr": s["address"], "size": s["total_size"], "stream": s["stream"],
                              "is_small": s.get("segment_type") == "small"}
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                live[b["address"]] = (b["size"], b["requested_size"])
    events = _events(snapshot, device)
    freed_at: dict[int, int] = {}  # start-live addr -> index of the event that frees it
    first_alloc: dict[int, int] = {}  # recorded alloc addr -> index of its first alloc
    for idx in range(len(events) - 1, -1, -1):
        e = events[idx]
        action, addr = e["action"], e["addr"]
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
                          "is_small": e["size"] == K_SMALL_BUFFER}
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
                if 0 < gap < K_MIN_BLOCK_SIZE or (not s["is_small"] and 0 < gap <= K_SMALL_SIZE):
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


def replay_snapshot(snapshot: dict, config: AllocatorConfig | None = None, device: int = 0,
                    check: bool = True) -> ReplayReport:
    """Replay a recorded snapshot's requests; with ``check``, compare with the recording.

    With a ``config`` other than the recording's own, addresses cannot be compared; the
    report then carries the simulated peaks only (``check`` is ignored).
    """
    return _replay(snapshot, config, device, check, None)[0]


def simulated_snapshot(snapshot: dict, config: AllocatorConfig | None = None, device: int = 0) -> dict:
    """The replayed run as a snapshot of its own (to open in torch.cuda._memory_viz)."""
    from xmem_engine.simulation.snapshot import make_snapshot

    history: list[dict] = []
    _, alloc = _replay(snapshot, config, device, False, history)
    return make_snapshot(alloc, history)


def _replay(snapshot: dict, config: AllocatorConfig | None, device: int, check: bool,
            history: list | None) -> tuple[ReplayReport, CachingAllocator]:
    recorded_cfg = config_from_snapshot(snapshot)
    cfg = config or recorded_cfg
    check = check and config is None
    events = _events(snapshot, device)
    report = ReplayReport(alloc_conf=cfg.source)

    pending_segments: list[dict] = []  # recorded segment_alloc events not yet claimed

    def device_malloc(size: int) -> int | None:
        if check:
            if pending_segments and pending_segments[0]["size"] == size:
                e = pending_segments.pop(0)
                report.segment_matches += 1
                return e["addr"]
            report.unpredicted_segment_allocs += 1
            report._miss(f"simulator called cudaMalloc({size}) where the recording did not")
        return fallback.malloc(size)

    from xmem_engine.simulation.allocator import _VirtualAddressSpace

    fallback = _VirtualAddressSpace(top=0x100000000000)  # below any real address seen
    alloc = CachingAllocator(cfg, device_malloc=device_malloc, history=history)
    sim_frees: list[tuple[int, int]] = []
    alloc._device_free = lambda addr, size: sim_frees.append((addr, size))

    blocks: dict[int, Block] = {}  # recorded address -> simulated block
    if is_warm(snapshot, device):
        report.warm_start = True
        start = rebuild_start_state(snapshot, recorded_cfg, device)
        if config is None:
            # The recorded settings: install the starting layout exactly.
            for s in start:
                installed = alloc.add_segment(s["addr"], s["size"], s["stream"], s["is_small"], s["blocks"])
                for b, (baddr, _, allocated, _) in zip(installed, s["blocks"]):
                    if allocated:
                        blocks[baddr] = b
        else:
            # Other settings would have laid out the earlier allocations differently: make
            # the tensors live at the start again under them (in address order, since
            # their real order is not recorded).
            for s in start:
                for baddr, _, allocated, requested in s["blocks"]:
                    if allocated:
                        blocks[baddr] = alloc.malloc(requested, s["stream"])
        alloc.reset_peak_stats()

    i, n = 0, len(events)
    while i < n:
        e = events[i]
        action = e["action"]
        if action == "segment_alloc":
            report.segment_allocs += 1
            pending_segments.append(e)
        elif action == "alloc":
            report.allocs += 1
            block = alloc.malloc(e["size"], e.get("stream", 0))
            if check:
                if block.addr == e["addr"]:
                    report.address_matches += 1
                else:
                    report._miss(f"event {i}: alloc of {e['size']} B at 0x{block.addr:x}, recorded 0x{e['addr']:x}")
            if pending_segments:
                _flush_unclaimed(pending_segments, report, check)
            blocks[e["addr"]] = block
        elif action == "free_completed":
            block = blocks.pop(e["addr"], None)
            if block is None:
                report._miss(f"event {i}: free of unknown address 0x{e['addr']:x}")
            else:
                alloc.free(block)
        elif action == "segment_free":
            recorded = []
            while i < n and events[i]["action"] == "segment_free":
                recorded.append((events[i]["addr"], events[i]["size"]))
                i += 1
            i -= 1
            report.segment_frees += len(recorded)
            sim_frees.clear()
            alloc.empty_cache()
            if check:
                matched = set(recorded) & set(sim_frees)
                report.segment_free_matches += len(matched)
                if len(matched) != len(recorded) or len(sim_frees) != len(recorded):
                    report._miss(f"event {i}: empty_cache freed {len(sim_frees)} segments, "
                                 f"recorded {len(recorded)} ({len(matched)} in common)")
        elif action == "oom":
            report._miss(f"event {i}: the recording ran out of memory; the replay has no capacity limit")
        i += 1
    _flush_unclaimed(pending_segments, report, check)

    report.peak_allocated_bytes = alloc.max_memory_allocated()
    report.peak_reserved_bytes = alloc.max_memory_reserved()
    report.final_allocated_bytes = alloc.memory_allocated()
    report.final_reserved_bytes = alloc.memory_reserved()
    if check:
        report.layout_identical = _layout(snapshot, device) == _sim_layout(alloc)
        if not report.layout_identical:
            report._miss("final segment/block layout differs from the recorded one")
    return report, alloc


def _flush_unclaimed(pending: list[dict], report: ReplayReport, check: bool) -> None:
    if check:
        for e in pending:
            report._miss(f"recorded cudaMalloc({e['size']}) at 0x{e['addr']:x} that the simulator did not make")
    pending.clear()


def _layout(snapshot: dict, device: int) -> list:
    out = []
    for s in sorted(snapshot["segments"], key=lambda s: s["address"]):
        if s.get("device", 0) != device:
            continue
        out.append((s["address"], s["total_size"], tuple(
            (b["address"], b["size"], b["state"] != "inactive") for b in s["blocks"])))
    return out


def _sim_layout(alloc: CachingAllocator) -> list:
    return [(addr, total, tuple((b.addr, b.size, b.allocated or b in alloc.pending_frees) for b in blocks))
            for addr, total, _, _, _, blocks in alloc.iter_segments()]
