"""Replaying a trace (``trace.py``) through the allocator simulator.

This is the middle stage of the pipeline: it turns the tracer's ordered requests into what
the caching allocator would do with them on a device of a given capacity: peak allocated
and reserved bytes, cudaMalloc calls, the timeline, what was live at the peak, and whether
(and where) the run would have run out of memory.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field

from xmem_engine import trace as tr
from xmem_engine.simulation.alloc_conf import AllocatorConfig
from xmem_engine.simulation.allocator import ALLOCATED_BYTES, RESERVED_BYTES, Block, CachingAllocator, OutOfMemoryError


@dataclass
class LiveTensor:
    """A storage live at the peak."""

    id: int
    bytes: int  # requested
    block_bytes: int  # what the allocator handed out
    category: str
    op: str
    module: str
    phase: str
    shape: tuple[int, ...]
    dtype: str
    source: str


@dataclass
class SimulationResult:
    """What the allocator did with a trace. Byte figures are the allocator's own stats."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    final_allocated_bytes: int
    final_reserved_bytes: int
    peak_event: int  # index into the trace where allocated bytes peaked (-1: no allocation)
    device_mallocs: int  # cudaMalloc calls (and page maps with expandable segments)
    alloc_retries: int
    oom: bool  # the run hit out-of-memory
    oom_event: int  # index of the failing request, or -1
    oom_message: str
    capacity: int | None
    config: AllocatorConfig
    breakdown: dict[str, int]  # category -> block bytes live at the peak
    live_at_peak: list[LiveTensor]  # largest first
    timeline_event: array  # event index of each sample
    timeline_allocated: array  # allocated bytes after that event
    timeline_reserved: array  # reserved bytes after that event
    iterations: list[int] = field(default_factory=list)  # event index of each iteration marker
    seconds: float = 0.0
    memory_stats: dict[str, int] = field(default_factory=dict)

    reserved_at_peak_bytes: int = 0  # reserved when allocated peaked: the rest is cached
    workspaces_dropped: int = 0  # cuDNN workspaces the device could not give (a smaller engine ran)

    @property
    def cached_at_peak_bytes(self) -> int:
        """Reserved but unallocated at the allocated peak (fragmentation and cache)."""
        return self.reserved_at_peak_bytes - self.peak_allocated_bytes


def pool_key(pool: int) -> tuple[int, int]:
    """The allocator's id of a trace's private pool number (``MempoolId_t``: (0, n), as
    ``torch.cuda.graph_pool_handle()`` and ``MemPool`` number theirs)."""
    return (0, pool)


def simulate(
    trace: tr.Trace | list[tr.TraceEvent],
    config: AllocatorConfig | None = None,
    capacity: int | None = None,
    device_total: int | None = None,
    allocator: CachingAllocator | None = None,
) -> SimulationResult:
    """Replay ``trace`` through a fresh allocator with ``capacity`` bytes of device memory.

    Stops at the first request the device cannot satisfy (as the real run would) and says
    so in the result. Pass ``allocator`` to use one you made (e.g. with ``history`` on, to
    write a snapshot of the run afterwards); it then supplies config and capacity.
    """
    t0 = time.perf_counter()
    events = trace.events if isinstance(trace, tr.Trace) else trace
    if allocator is None:
        allocator = CachingAllocator(config or AllocatorConfig(), capacity=capacity, device_total=device_total)
    alloc = allocator
    cfg, capacity = alloc.config, alloc.capacity
    blocks: dict[int, Block] = {}
    born: dict[int, int] = {}  # storage id -> event index of its alloc
    died: dict[int, int] = {}  # storage id -> event index of its free
    sizes: dict[int, int] = {}  # storage id -> block bytes
    t_ev, t_al, t_re = array("q"), array("q"), array("q")
    iterations: list[int] = []
    peak = -1
    peak_bytes = reserved_at_peak = 0
    oom_event, oom_message = -1, ""
    dropped: set[int] = set()  # cuDNN workspaces the device could not give (their frees are skipped)
    n_dropped = 0
    malloc, free = alloc.malloc, alloc.free
    # The allocator's current-value list, read directly: this loop is the GPU-switch path.
    cur = alloc.cur
    ab, rb = ALLOCATED_BYTES * 3, RESERVED_BYTES * 3
    ev_append, al_append, re_append = t_ev.append, t_al.append, t_re.append
    for i, e in enumerate(events):
        kind = e.kind
        if kind == tr.ALLOC:
            try:
                b = malloc(e.bytes, e.stream)
            except OutOfMemoryError as err:
                if e.op == tr.CUDNN_WORKSPACE_OP:  # PyTorch runs cuDNN's next engine config instead
                    dropped.add(e.id)
                    n_dropped += 1
                    continue
                oom_event, oom_message = i, str(err)
                break
            sid = e.id
            blocks[sid] = b
            born[sid] = i
            sizes[sid] = b.size
            now = cur[ab]
            if now > peak_bytes:
                peak_bytes, peak = now, i
                reserved_at_peak = cur[rb]
        elif kind == tr.FREE:
            b = blocks.pop(e.id, None)
            if b is None:
                if e.id in dropped:
                    dropped.discard(e.id)
                    continue
                raise ValueError(f"trace event {i}: free of storage {e.id}, which is not allocated")
            free(b)
            died[e.id] = i
        elif kind == tr.RECORD_STREAM:
            b = blocks.get(e.id)
            if b is not None:
                for s in e.streams:
                    alloc.record_stream(b, s)
            continue
        elif kind == tr.EMPTY_CACHE:
            alloc.empty_cache()
        elif kind == tr.SYNCHRONIZE:
            alloc.synchronize()
            continue
        elif kind == tr.RESET_PEAK:
            alloc.reset_peak_stats()
            continue
        elif kind == tr.ITERATION:
            iterations.append(i)
            continue
        elif kind == tr.POOL_BEGIN:
            alloc.begin_allocate_to_pool(pool_key(e.id), e.streams or None)
            continue
        elif kind == tr.POOL_END:
            alloc.end_allocate_to_pool(pool_key(e.id))
            continue
        elif kind == tr.POOL_RELEASE:
            alloc.release_pool(pool_key(e.id))
            continue
        else:
            continue
        ev_append(i)
        al_append(cur[ab])
        re_append(cur[rb])

    live: list[LiveTensor] = []
    breakdown: dict[str, int] = {}
    if peak >= 0:
        for sid, b_i in born.items():
            if b_i <= peak and died.get(sid, len(events)) > peak:
                e = events[b_i]
                cat = e.category or "other"
                breakdown[cat] = breakdown.get(cat, 0) + sizes[sid]
                live.append(LiveTensor(sid, e.bytes, sizes[sid], cat, e.op, e.module, e.phase,
                                       tuple(e.shape), e.dtype, e.source))
        live.sort(key=lambda t: -t.block_bytes)
    return SimulationResult(
        peak_allocated_bytes=max(peak_bytes, alloc.max_memory_allocated()),
        peak_reserved_bytes=max(max(t_re, default=0), alloc.max_memory_reserved()),
        final_allocated_bytes=alloc.memory_allocated(),
        final_reserved_bytes=alloc.memory_reserved(),
        peak_event=peak,
        device_mallocs=alloc.num_device_alloc,
        alloc_retries=alloc.num_alloc_retries,
        oom=oom_event >= 0,
        oom_event=oom_event,
        oom_message=oom_message,
        capacity=capacity,
        config=cfg,
        breakdown=dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
        live_at_peak=live,
        timeline_event=t_ev,
        timeline_allocated=t_al,
        timeline_reserved=t_re,
        iterations=iterations,
        seconds=time.perf_counter() - t0,
        memory_stats=alloc.memory_stats(),
        reserved_at_peak_bytes=reserved_at_peak,
        workspaces_dropped=n_dropped,
    )
