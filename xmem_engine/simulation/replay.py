"""Replaying recorded GPU snapshots through the simulator, and checking conformance.

A recorded snapshot (``torch.cuda.memory._dump_snapshot``) holds the final allocator state
(``segments``) and the events that led there (``device_traces``, one list per device). A
replay feeds one device's ``alloc`` / ``free_completed`` to a :class:`CachingAllocator` and
compares, event by event, what the simulator decided with what the real allocator did:

* for every ``alloc``, the block address chosen;
* for every ``segment_alloc`` (cudaMalloc), that the simulator also called cudaMalloc, with
  that size; with expandable segments, for every ``segment_map``, that it mapped the same
  pages (``map_block``);
* for every ``segment_free`` / ``segment_unmap``, that it released the same memory;
* for every ``oom``, that the same request ran out of memory in the simulator too;
* at the end, the segment / block layout.

The recording is the device: new segments (and new expandable segments) take the addresses
the real driver returned, and a cudaMalloc or a map fails where the real one did, which the
recording shows by what follows: the allocator releasing its cache (``release_cached_blocks``,
then a retry), or an ``oom``. A run of releases just before an allocation the cache cannot
serve is that allocation's out-of-memory path; any other is an ``empty_cache()``.

"Warm" recordings started with memory already in use. Their starting state is rebuilt
from the final segments by undoing the recorded events in reverse (:mod:`start_state`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from xmem_engine.simulation.alloc_conf import AllocatorConfig, parse_alloc_conf
from xmem_engine.simulation.allocator import (K_LARGE_BUFFER, Block, CachingAllocator, OutOfMemoryError,
                                              VirtualAddressSpace)
from xmem_engine.simulation.start_state import (snapshot_events, infer_device_total, is_warm,  # noqa: F401 (re-exported)
                                                rebuild_start_state)


@dataclass
class ReplayReport:
    """What a replay found; ``ok`` is true only when everything matched."""

    device: int = 0
    allocs: int = 0
    address_matches: int = 0
    segment_allocs: int = 0  # cudaMalloc calls in the recording
    segment_matches: int = 0  # ... that the simulator made too, with the same size
    unpredicted_segment_allocs: int = 0  # simulator called cudaMalloc, the recording did not
    segment_frees: int = 0  # cudaFree calls in the recording
    segment_free_matches: int = 0  # ... that the simulator made too
    unpredicted_segment_frees: int = 0  # simulator called cudaFree, the recording did not
    segment_maps: int = 0  # expandable segments: pages mapped in the recording
    segment_map_matches: int = 0  # ... that the simulator mapped too (same address and size)
    unpredicted_segment_maps: int = 0
    segment_unmaps: int = 0  # expandable segments: pages unmapped in the recording
    segment_unmap_matches: int = 0
    unpredicted_segment_unmaps: int = 0
    ooms: int = 0  # out-of-memory errors in the recording
    oom_matches: int = 0  # ... where the simulator ran out of memory too
    layout_identical: bool = False
    warm_start: bool = False
    device_total_bytes: int = 0  # sizes expandable segments' address space (0: not known)
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
            and self.unpredicted_segment_frees == 0
            and self.segment_map_matches == self.segment_maps
            and self.unpredicted_segment_maps == 0
            and self.segment_unmap_matches == self.segment_unmaps
            and self.unpredicted_segment_unmaps == 0
            and self.oom_matches == self.ooms
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


def recorded_devices(snapshot: dict) -> list[int]:
    """The devices a snapshot has events or segments for, in order."""
    traces = snapshot.get("device_traces") or []
    found = {d for d, events in enumerate(traces) if events}
    found.update(s.get("device", 0) for s in snapshot["segments"])
    return sorted(found)


_DEVICE_ALLOCS = ("segment_alloc", "segment_map")  # the allocator obtained device memory
_RELEASES = ("segment_free", "segment_unmap")  # ... and gave it back


def replay_snapshot(snapshot: dict, config: AllocatorConfig | None = None, device: int = 0,
                    check: bool = True, device_total: int | None = None) -> ReplayReport:
    """Replay a recorded snapshot's requests; with ``check``, compare with the recording.

    With a ``config`` other than the recording's own, addresses cannot be compared; the
    report then carries the simulated peaks only (``check`` is ignored). ``device_total``:
    the GPU's total memory, which sizes expandable segments' address space (default:
    :func:`infer_device_total`, else 1 TiB).
    """
    return _replay(snapshot, config, device, check, None, device_total)[0]


def simulated_snapshot(snapshot: dict, config: AllocatorConfig | None = None, device: int = 0) -> dict:
    """The replayed run as a snapshot of its own (to open in torch.cuda._memory_viz)."""
    from xmem_engine.simulation.snapshot import make_snapshot

    history: list[dict] = []
    _, alloc = _replay(snapshot, config, device, False, history)
    return make_snapshot(alloc, history)


def _replay(snapshot: dict, config: AllocatorConfig | None, device: int, check: bool,
            history: list | None, device_total: int | None = None) -> tuple[ReplayReport, CachingAllocator]:
    recorded_cfg = config_from_snapshot(snapshot)
    cfg = config or recorded_cfg
    check = check and config is None
    events = snapshot_events(snapshot, device)
    report = ReplayReport(alloc_conf=cfg.source, device=device)
    if device_total is None:
        device_total = infer_device_total(snapshot, device)
    report.device_total_bytes = device_total or 0

    # Recorded segment_alloc / segment_map / segment_free / segment_unmap events not yet
    # matched by the simulator. The allocator records a cudaMalloc (or a map) before the alloc
    # it serves, so those of an alloc are all here when it is replayed; releases are here
    # when they belong to the malloc being replayed (its out-of-memory path) or to an
    # empty_cache() being replayed.
    pending: list[dict] = []
    mode = {"oom": False, "force": False}  # replaying a recorded oom / a request that must succeed

    def device_fails() -> bool:
        """The recording says the device had no memory for what the simulator asks now: the
        real allocator went on to release its cache (a release is next), or the request
        being replayed ended in an out-of-memory error with nothing more obtained."""
        if mode["force"]:
            return False
        if pending and pending[0]["action"] in _RELEASES:
            return True
        return mode["oom"] and not any(p["action"] in _DEVICE_ALLOCS for p in pending)

    def device_malloc(size: int) -> int | None:
        if pending and pending[0]["action"] == "segment_alloc" and pending[0]["size"] == size:
            report.segment_matches += 1
            return pending.pop(0)["addr"]
        if device_fails():
            return None
        report.unpredicted_segment_allocs += 1
        report._miss(f"simulator called cudaMalloc({size}) where the recording did not")
        return fallback.malloc(size)

    def device_map(addr: int, size: int) -> bool:
        if pending and pending[0]["action"] == "segment_map" and (pending[0]["addr"], pending[0]["size"]) == (addr, size):
            pending.pop(0)
            report.segment_map_matches += 1
            return True
        if device_fails():
            return False
        report.unpredicted_segment_maps += 1
        report._miss(f"simulator mapped {size} B at 0x{addr:x} where the recording did not")
        return True

    def device_reserve(size: int, stream: int, is_small: bool) -> int | None:
        # A new expandable segment maps its first page at once, so it starts where the
        # recording maps next: now, or, if the allocator is about to release its cache (the
        # segment was reserved by an attempt that fails), on the retry after the releases. A
        # segment reserved by a request that fails for good keeps its address space, unmapped,
        # and is where the next new segment of its stream and pool appears in the recording.
        # Not where a segment of the same pool and stream lies, nor on a page already mapped.
        def free_at(e: dict) -> bool:
            addr = e["addr"]
            trim = []
            for es in alloc.expandable_segments:
                if es.placeholder or not es.base <= addr < es.base + es.virtual_size:
                    continue  # (a placeholder holds no address of the recording's)
                keep = (addr - es.base) // es.page_size * es.page_size  # whole pages before addr
                if (es.stream == stream and es.pool.is_small == is_small) or keep == 0 \
                        or not alloc.unmapped_from(es, es.base + keep):
                    return False
                trim.append((es, keep))
            # The segments whose address space was taken to reach here end where this one starts
            # (the device's total memory was not known, or not exactly).
            for es, keep in trim:
                alloc.trim_expandable_segment(es, keep)
            return True

        k = 0
        while k < len(pending) and pending[k]["action"] in _RELEASES:
            k += 1
        if k < len(pending):
            if pending[k]["action"] == "segment_map" and free_at(pending[k]):
                return pending[k]["addr"]
            return None
        for e in events[cursor[0] + 1:]:
            if e["action"] == "segment_map" and e["stream"] == stream \
                    and (e["size"] % K_LARGE_BUFFER != 0) == is_small and free_at(e):
                return e["addr"]
        return None  # not known yet: asked again when the segment maps its first page

    def released(action: str, addr: int, size: int) -> None:
        for k, p in enumerate(pending):
            if p["action"] == action and p["addr"] == addr and p["size"] == size:
                del pending[k]
                if action == "segment_free":
                    report.segment_free_matches += 1
                else:
                    report.segment_unmap_matches += 1
                return
        if action == "segment_free":
            report.unpredicted_segment_frees += 1
            report._miss(f"simulator freed the segment at 0x{addr:x} ({size} B) where the recording did not")
        else:
            report.unpredicted_segment_unmaps += 1
            report._miss(f"simulator unmapped {size} B at 0x{addr:x} where the recording did not")

    fallback = VirtualAddressSpace(top=0x100000000000)  # below any real address seen
    if check:
        alloc = CachingAllocator(cfg, device_total=device_total, device_malloc=device_malloc, history=history,
                                 device_reserve=device_reserve, device_map=device_map,
                                 device_unmap=lambda addr, size: released("segment_unmap", addr, size))
        alloc._device_free = lambda addr, size: released("segment_free", addr, size)
    else:
        alloc = CachingAllocator(cfg, device_total=device_total, device_malloc=fallback.malloc,
                                 device_free=fallback.free, history=history,
                                 device_reserve=lambda size, stream, is_small: fallback.reserve(size))

    blocks: dict[int, Block] = {}  # recorded address -> simulated block
    if is_warm(snapshot, device):
        report.warm_start = True
        start = rebuild_start_state(snapshot, recorded_cfg, device, device_total)
        if config is None:
            # The recorded settings: install the starting layout exactly.
            by_es: dict[tuple, list] = {}
            for s in start:
                if s["expandable"]:
                    by_es.setdefault((s["base"], s["virtual_size"], s["stream"], s["is_small"]), []).append(s)
                    continue
                installed = alloc.add_segment(s["addr"], s["size"], s["stream"], s["is_small"], s["blocks"])
                for b, (baddr, _, allocated, _) in zip(installed, s["blocks"]):
                    if allocated:
                        blocks[baddr] = b
            for (base, size, stream, is_small), ranges in sorted(by_es.items()):
                installed = alloc.add_expandable_segment(
                    base, size, stream, is_small, [(r["addr"], r["size"], r["blocks"]) for r in ranges])
                for b in installed:
                    if b.allocated:
                        blocks[b.addr] = b
        else:
            # Other settings would have laid out the earlier allocations differently: make
            # the tensors live at the start again under them (in address order, since
            # their real order is not recorded).
            for s in start:
                for baddr, _, allocated, requested in s["blocks"]:
                    if allocated:
                        blocks[baddr] = alloc.malloc(requested, s["stream"])
        alloc.reset_peak_stats()

    def flush(i: int) -> None:
        """Recorded device-memory events the request replayed at event ``i`` left unmatched."""
        for p in pending:
            what = {"segment_alloc": "cudaMalloc", "segment_map": "map", "segment_free": "cudaFree",
                    "segment_unmap": "unmap"}[p["action"]]
            report._miss(f"event {i}: recorded {what}({p['size']}) at 0x{p['addr']:x} that the simulator did not make")
        pending.clear()

    i, n = 0, len(events)
    cursor = [0]  # the event being replayed (device_reserve looks ahead from it)
    while i < n:
        e = events[i]
        action = e["action"]
        cursor[0] = i
        if action in _DEVICE_ALLOCS:
            if action == "segment_alloc":
                report.segment_allocs += 1
            else:
                report.segment_maps += 1
            if check:
                pending.append(e)
        elif action == "alloc":
            report.allocs += 1
            try:
                block = alloc.malloc(e["size"], e.get("stream", 0))
            except OutOfMemoryError:
                # Only a replay that has gone astray gets here: the recording allocated.
                report._miss(f"event {i}: alloc of {e['size']} B ran out of memory in the simulator")
                mode["force"] = True
                try:
                    block = alloc.malloc(e["size"], e.get("stream", 0))
                finally:
                    mode["force"] = False
            if check:
                if block.addr == e["addr"]:
                    report.address_matches += 1
                else:
                    report._miss(f"event {i}: alloc of {e['size']} B at 0x{block.addr:x}, recorded 0x{e['addr']:x}")
                if pending:
                    flush(i)
            blocks[e["addr"]] = block
        elif action == "free_completed":
            block = blocks.pop(e["addr"], None)
            if block is None:
                report._miss(f"event {i}: free of unknown address 0x{e['addr']:x}")
            else:
                alloc.free(block)
        elif action in _RELEASES:
            first = i
            while i < n and events[i]["action"] in _RELEASES:
                if events[i]["action"] == "segment_free":
                    report.segment_frees += 1
                else:
                    report.segment_unmaps += 1
                i += 1
            run = events[first:i]
            i -= 1
            if not check:
                alloc.empty_cache()
            else:
                pending.extend(run)
                if not _malloc_releases(alloc, events, i + 1):
                    # An empty_cache() (or anything else that releases the whole cache).
                    alloc.empty_cache()
                    left = [p for p in pending if any(p is r for r in run)]
                    if left:
                        report._miss(f"event {i}: empty_cache released {len(run) - len(left)} of the "
                                     f"{len(run)} recorded segments/ranges")
                        pending[:] = [p for p in pending if not any(p is r for r in left)]
        elif action == "oom":
            report.ooms += 1
            if check:
                # The request that failed: replay it; the simulator must fail it too (after
                # the same releases), and the program went on without it.
                mode["oom"] = True
                try:
                    block = alloc.malloc(e["size"], e.get("stream", 0))
                except OutOfMemoryError:
                    report.oom_matches += 1
                else:
                    report._miss(f"event {i}: the recording ran out of memory for {e['size']} B; "
                                 f"the simulator placed it at 0x{block.addr:x}")
                    alloc.free(block)
                finally:
                    mode["oom"] = False
                if pending:
                    flush(i)
        i += 1
    if check and pending:
        flush(n)

    report.peak_allocated_bytes = alloc.max_memory_allocated()
    report.peak_reserved_bytes = alloc.max_memory_reserved()
    report.final_allocated_bytes = alloc.memory_allocated()
    report.final_reserved_bytes = alloc.memory_reserved()
    if check:
        report.layout_identical = _layout(snapshot, device) == _sim_layout(alloc)
        if not report.layout_identical:
            report._miss("final segment/block layout differs from the recorded one")
    return report, alloc


def _malloc_releases(alloc: CachingAllocator, events: list[dict], j: int) -> bool:
    """Whether the releases just before ``events[j]`` are the out-of-memory path of the malloc
    that follows: after them (and the cudaMalloc / maps of its retry) comes an ``alloc`` or
    ``oom`` that the cache could not serve, so the allocator tried for device memory, failed,
    and released its cache (``release_cached_blocks``) before trying again. Otherwise they
    come from an ``empty_cache()``."""
    while j < len(events) and events[j]["action"] in _DEVICE_ALLOCS:
        j += 1
    if j == len(events) or events[j]["action"] not in ("alloc", "oom"):
        return False
    e = events[j]
    return not alloc.can_reuse(e["size"], e.get("stream", 0))


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
