"""A faithful simulator of PyTorch's CUDA caching allocator.

This re-implements ``DeviceCachingAllocator`` from ``c10/cuda/CUDACachingAllocator.cpp``
(PyTorch 2.4 - 2.10) so that a stream of malloc/free requests lands on the same blocks, in
the same segments, with the same statistics as on a real GPU. Method names follow the C++
ones (``get_free_block``, ``alloc_block``, ``should_split``, ``release_cached_blocks`` ...)
so each rule can be checked against the source; ../shared/docs/allocator-spec.md
summarises them.

Only sizes and addresses are modelled: no memory is touched. Device addresses for new
segments come from ``device_malloc`` (a callable), so a replay can hand out exactly the
addresses a real recording saw; by default a simple virtual address space is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from bisect import bisect_left, insort

from xmem_engine.simulation.alloc_conf import AllocatorConfig
from xmem_engine.trace import MAX_REQUEST_BYTES

K_MIN_BLOCK_SIZE = 512
# MAX_REQUEST_BYTES (trace.py): the largest request the simulator takes, 1 PiB, far above any
# GPU; a larger, negative or non-integer size is a corrupt input, refused rather than rounded.
K_SMALL_SIZE = 1 << 20  # 1 MiB: largest "small" request
K_SMALL_BUFFER = 2 << 20  # 2 MiB: small-pool segment (and expandable small page)
K_LARGE_BUFFER = 20 << 20  # 20 MiB: mid-size segment (and expandable large page)
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20

_ADDR_BITS = 48  # CUDA virtual addresses fit in 48 bits; free-set keys pack size above them
_ADDR_MASK = (1 << _ADDR_BITS) - 1

# Statistics (``DeviceStats`` in C++): one PoolStats row per pool holds, as plain ints, each
# stat's current value, peak, freed total and base; "allocated" (cumulative) is derived as
# current - base + freed. The "all" row is the sum of the two pools, except its peaks, which
# the allocator keeps in an AllPeaks whenever a pool's value rises. So a free only touches
# its own pool's counters.
STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOL_TYPES = ("all", "small_pool", "large_pool")
STAT_FIELDS = ("current", "peak", "allocated", "freed")
(ALLOCATION, SEGMENT, ACTIVE, INACTIVE_SPLIT, ALLOCATED_BYTES, RESERVED_BYTES, ACTIVE_BYTES,
 INACTIVE_SPLIT_BYTES, REQUESTED_BYTES) = range(9)
# CachingAllocator.cur keeps the "all" current value of these two at stat * 3 (a live list that
# replay loops read per event; the other slots of that list stay 0).
_AB_ALL, _RB_ALL = ALLOCATED_BYTES * 3, RESERVED_BYTES * 3
_ROUND_UP, _ROUND_MASK = K_MIN_BLOCK_SIZE - 1, -K_MIN_BLOCK_SIZE  # (size + _ROUND_UP) & _ROUND_MASK
_new_block = object.__new__  # _new_block(Block): a Block whose fields the caller sets


class PoolStats:
    """One pool's row of ``DeviceStats``: for each name in STAT_NAMES, ``<name>`` is the
    current value, ``<name>_peak`` the peak, ``<name>_freed`` the total decrease and
    ``<name>_base`` the current value at the last reset_accumulated_stats."""

    __slots__ = tuple(n + f for n in STAT_NAMES for f in ("", "_peak", "_freed", "_base")) + ("other",)

    def __init__(self) -> None:
        for name in self.__slots__[:-1]:
            setattr(self, name, 0)
        self.other: PoolStats = self  # the other pool's row: "all" = self + other


class AllPeaks:
    """The peaks of the "all" row (its current and freed values are sums of the pools')."""

    __slots__ = STAT_NAMES

    def __init__(self) -> None:
        for name in STAT_NAMES:
            setattr(self, name, 0)




class OutOfMemoryError(RuntimeError):
    """The simulated device could not satisfy a request (``torch.OutOfMemoryError``)."""

    def __init__(self, message: str, requested: int, reserved: int, allocated: int, capacity: int | None):
        super().__init__(message)
        self.requested = requested
        self.reserved = reserved
        self.allocated = allocated
        self.capacity = capacity


class Block:
    """A range of device memory: allocated to a tensor, or cached in a pool."""

    __slots__ = (
        "addr", "size", "stream", "pool", "prev", "next", "allocated", "requested",
        "mapped", "expandable", "stream_uses", "pending", "gc_base", "key",
    )

    def __init__(self, addr: int, size: int, stream: int, pool: "BlockPool"):
        # (malloc's split sets these fields inline as well: keep the two lists in step)
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None  # neighbours inside the segment
        self.next: Block | None = None
        self.allocated = False
        self.requested = 0  # bytes the caller asked for
        self.mapped = True  # False: an unmapped tail of an expandable segment
        self.expandable: ExpandableSegment | None = None
        self.stream_uses: set[int] | None = None  # other streams it was used on
        self.pending = False  # freed, waiting for other streams' events
        self.gc_base = 0  # pool's get_free_block count when it was cached (GC age)
        self.key = 0  # its key in the pool's free list while cached: size << 48 | addr

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block(0x{self.addr:x}, {self.size}, stream={self.stream}, {state})"


class BlockPool:
    """Cached free blocks of one pool (small or large), ordered by (stream, size, address).

    Each stream has a sorted Python list of integer keys ``size << 48 | addr``, kept with
    :mod:`bisect`, so a best-fit lookup is one bisection. (A plain list beats a balanced
    tree here: pools hold tens to a few thousand free blocks, and list insertion is a
    memmove in C.) ``unmapped`` holds the not-yet-mapped tails of expandable segments,
    ordered by (stream, address).
    """

    __slots__ = ("is_small", "free", "blocks", "unmapped", "get_free_blocks_call_count", "stats", "owner")

    def __init__(self, is_small: bool, stats: PoolStats | None = None, owner: "PrivatePool | None" = None):
        self.is_small = is_small
        self.free: dict[int, list[int]] = {}
        self.blocks: dict[int, Block] = {}  # key -> block
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addresses
        self.get_free_blocks_call_count = 0
        # the small_pool / large_pool statistics (a private pool counts in its size class's)
        self.stats = stats if stats is not None else PoolStats()
        self.owner = owner  # the PrivatePool this belongs to (owner_PrivatePool), None: the global pools

    def insert(self, b: Block) -> None:
        key = b.key = (b.size << _ADDR_BITS) | b.addr
        sl = self.free.get(b.stream)
        if sl is None:
            sl = self.free[b.stream] = []
        insort(sl, key)
        self.blocks[key] = b
        b.gc_base = self.get_free_blocks_call_count

    def erase(self, b: Block) -> None:
        key = b.key
        sl = self.free[b.stream]
        del sl[bisect_left(sl, key)]
        del self.blocks[key]

    def __iter__(self) -> Iterator[Block]:
        """All cached blocks in (stream, size, address) order."""
        for stream in sorted(self.free):
            for key in list(self.free[stream]):
                yield self.blocks[key]

    def __len__(self) -> int:
        return len(self.blocks)


class PrivatePool:
    """A CUDA graph's (or ``torch.cuda.MemPool``'s) own blocks (``PrivatePool`` in C++).

    Allocations made while the pool is being allocated to (a graph capture on its stream,
    ``use_mem_pool``, cudagraph trees' warmup) come from its two block pools and go back to
    them: the global pools never serve them, nor they the global pools. Its cached segments
    survive ``empty_cache`` until the pool's last user releases it (``use_count`` 0), then go
    at the next ``empty_cache``. Statistics count in the global small/large rows, as in C++.
    """

    __slots__ = ("id", "small_blocks", "large_blocks", "use_count", "segment_count")

    def __init__(self, pool_id: tuple[int, int], small: PoolStats, large: PoolStats):
        self.id = pool_id
        self.small_blocks = BlockPool(True, small, self)
        self.large_blocks = BlockPool(False, large, self)
        self.use_count = 1
        self.segment_count = 0  # cudaMalloc_count: its live segments

    def __repr__(self) -> str:
        return f"PrivatePool({self.id}, use_count={self.use_count}, segments={self.segment_count})"


@dataclass(eq=False)
class ExpandableSegment:
    """One growing virtual range per (stream, pool) whose pages are mapped on demand."""

    base: int
    virtual_size: int
    page_size: int
    stream: int
    pool: BlockPool
    mapped_pages: set[int]
    unmapped_blocks: dict[int, Block]  # addr -> unmapped block
    head: Block | None = None  # the block at base; next links reach every block
    placeholder: bool = False  # base not known yet (device_reserve gave none): asked again at the first map


@dataclass
class Segment:
    """A cudaMalloc'd range (non-expandable)."""

    addr: int
    size: int
    stream: int
    is_small: bool
    head: Block | None = None  # the block at addr; next links reach every block
    pool_id: tuple[int, int] = (0, 0)  # its private pool's id; (0, 0): the global pools


class VirtualAddressSpace:
    """Hands out 2 MiB-aligned device addresses, top down like the CUDA driver tends to."""

    def __init__(self, top: int = 0x7F0000000000):
        self.top = top
        self.freed: dict[int, list[int]] = {}  # size -> addresses released, for reuse

    def malloc(self, size: int) -> int:
        reuse = self.freed.get(size)
        if reuse:
            return reuse.pop()
        self.top -= (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
        if self.top <= 0:
            raise RuntimeError("simulated device address space exhausted")
        return self.top

    def free(self, addr: int, size: int) -> None:
        self.freed.setdefault(size, []).append(addr)

    def reserve(self, size: int) -> int:
        """Address range for an expandable segment (``cuMemAddressReserve``)."""
        return self.malloc(size)

    def release(self, addr: int, size: int) -> None:
        """An expandable segment's address range is given back (``cuMemAddressFree``)."""
        self.free(addr, size)


class CachingAllocator:
    """One device's caching allocator.

    ``capacity``: bytes cudaMalloc can obtain (None = unlimited); ``device_total``: the
    device's total memory, the base of ``set_per_process_memory_fraction`` (defaults to
    capacity). ``device_malloc(size) -> addr | None`` / ``device_free(addr, size)`` replace
    the virtual address space (used by replays); returning None means out of memory.
    Expandable segments have their own three: ``device_reserve(size, stream, is_small) -> addr``
    reserves the address range of a new segment of that stream and pool (``cuMemAddressReserve``;
    None: not known yet, asked again when the segment maps its first page), ``device_map(addr, size) -> bool``
    obtains physical pages for a range (``cuMemCreate`` + ``cuMemMap``; False: out of
    memory, after ``capacity`` is checked) and ``device_unmap(addr, size)`` is told of pages
    given back; a replay uses them to follow a recording.
    ``history``: a list that receives snapshot-style trace entries (dicts), or None.
    """

    # Slots make the hot paths' attribute reads cheap (a plain instance dict past 30 keys
    # is not); __dict__ still takes any attribute someone else hangs on an allocator.
    __slots__ = (
        "config", "capacity", "device_total", "_vas", "_device_malloc", "_device_free", "_history",
        "_device_reserve", "_device_release", "_device_map", "_device_unmap",
        "small_blocks", "large_blocks", "_pool_stats", "segments", "expandable_segments",
        "pending_frees", "total_allocated_memory", "set_fraction", "allowed_memory_maximum",
        "all_peak", "cur", "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
        "num_sync_all_streams", "oversize_allocations", "oversize_segments", "_max_split",
        "_expandable", "_rounds", "_plain", "_active_mirrored", "_extras", "graph_pools", "graph_pools_freeable",
        "captures_underway", "__dict__", "__weakref__",
    )

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        capacity: int | None = None,
        device_total: int | None = None,
        device_malloc: Callable[[int], int | None] | None = None,
        device_free: Callable[[int, int], None] | None = None,
        history: list | None = None,
        device_reserve: Callable[[int, int, bool], int] | None = None,
        device_map: Callable[[int, int], bool] | None = None,
        device_unmap: Callable[[int, int], None] | None = None,
    ):
        self.config = config or AllocatorConfig()
        if self.config.backend != "native":
            raise ValueError("backend:cudaMallocAsync bypasses the caching allocator; xmem simulates the native one")
        self.capacity = capacity
        self.device_total = device_total if device_total is not None else capacity
        self._vas = VirtualAddressSpace()
        self._device_malloc = device_malloc or self._vas.malloc
        self._device_free = device_free or self._vas.free
        self._device_reserve = device_reserve or (lambda size, stream, is_small: self._vas.reserve(size))
        # (an address range reserved through device_reserve is the caller's to reuse)
        self._device_release = self._vas.release if device_reserve is None else None
        self._device_map = device_map
        self._device_unmap = device_unmap
        self._history = history
        self.small_blocks = BlockPool(is_small=True)
        self.large_blocks = BlockPool(is_small=False)
        small, large = self.small_blocks.stats, self.large_blocks.stats
        small.other, large.other = large, small
        self._pool_stats = (small, large)
        # Private pools (CUDA graphs, MemPool): id -> pool; those whose users all released them;
        # and the pools being allocated to, each with the streams it takes (None: every stream).
        self.graph_pools: dict[tuple[int, int], PrivatePool] = {}
        self.graph_pools_freeable: dict[tuple[int, int], PrivatePool] = {}
        self.captures_underway: list[tuple[tuple[int, int], frozenset[int] | None]] = []
        self.segments: dict[int, Segment] = {}
        self.expandable_segments: list[ExpandableSegment] = []
        self.pending_frees: list[Block] = []  # freed blocks waiting for other streams
        self.total_allocated_memory = 0  # reserved bytes, as PyTorch names it
        self.set_fraction = False
        self.allowed_memory_maximum = 0
        # Per-pool statistics live on the pools (pool.stats); "all" is their sum, but for its peaks:
        self.all_peak = AllPeaks()
        self.cur = [0] * (len(STAT_NAMES) * 3)  # live "all" allocated / reserved bytes (_AB_ALL, _RB_ALL)
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0
        self.oversize_allocations = [0, 0]  # current, peak
        self.oversize_segments = [0, 0]
        cfg = self.config
        self._max_split = cfg.max_split_size
        self._expandable = cfg.expandable_segments
        self._rounds = any(cfg.roundup_power2_divisions)
        # Default rules: best fit is a plain bisection (no oversize, GC or expandable cases).
        self._plain = not cfg.expandable_segments and cfg.max_split_size >= 2**64 - 1 \
            and cfg.garbage_collection_threshold <= 0.0
        self._active_mirrored = True  # active == allocation stats until a deferred free
        self._update_extras()

    @property
    def history(self) -> list | None:
        """The list receiving snapshot-style trace entries, or None (may be switched any time)."""
        return self._history

    @history.setter
    def history(self, history: list | None) -> None:
        self._history = history
        self._update_extras()

    def _update_extras(self) -> None:
        # malloc and free skip their rarely needed steps unless one applies: recording the
        # history, counting oversize blocks (max_split_size set), active stats apart.
        self._extras = self._history is not None or self._max_split < 2**64 - 1 \
            or not self._active_mirrored

    # ------------------------------------------------------------------ statistics
    def _increase(self, name: str, pool: BlockPool, amount: int) -> None:
        """``increase_stat`` on ``pool``'s row and the "all" row (``name`` from STAT_NAMES)."""
        st = pool.stats
        v = getattr(st, name) + amount
        setattr(st, name, v)
        if v > getattr(st, name + "_peak"):
            setattr(st, name + "_peak", v)
        v += getattr(st.other, name)  # the "all" value
        if v > getattr(self.all_peak, name):
            setattr(self.all_peak, name, v)
        if name == "allocated_bytes" or name == "reserved_bytes":
            self.cur[STAT_NAMES.index(name) * 3] = v

    def _decrease(self, name: str, pool: BlockPool, amount: int) -> None:
        """``decrease_stat`` on ``pool``'s row (the "all" row is the sum of the pools)."""
        st = pool.stats
        setattr(st, name, getattr(st, name) - amount)
        setattr(st, name + "_freed", getattr(st, name + "_freed") + amount)
        if name == "allocated_bytes" or name == "reserved_bytes":
            self.cur[STAT_NAMES.index(name) * 3] -= amount

    def stat(self, name: str, pool: str = "all", field: str = "current") -> int:
        if self._active_mirrored and name in ("active", "active_bytes"):
            name = "allocation" if name == "active" else "allocated_bytes"
        STAT_NAMES.index(name)  # ValueError if unknown
        t = POOL_TYPES.index(pool)
        rows = self._pool_stats if t == 0 else (self._pool_stats[t - 1],)
        if field == "current":
            return sum(getattr(r, name) for r in rows)
        if field == "peak":
            return getattr(self.all_peak if t == 0 else rows[0], name if t == 0 else name + "_peak")
        if field == "freed":
            return sum(getattr(r, name + "_freed") for r in rows)
        if field == "allocated":  # cumulative: current - base + freed
            return sum(getattr(r, name) - getattr(r, name + "_base") + getattr(r, name + "_freed")
                       for r in rows)
        raise KeyError(f"unknown statistic field {field!r}; expected one of {STAT_FIELDS}")

    def memory_stats(self) -> dict[str, int]:
        """The same keys as ``torch.cuda.memory_stats()``."""
        out: dict[str, int] = {}
        for si, name in enumerate(STAT_NAMES):
            for ti, pool in enumerate(POOL_TYPES):
                for fname in STAT_FIELDS:
                    out[f"{name}.{pool}.{fname}"] = self.stat(name, pool, fname)
        out["oversize_allocations.current"], out["oversize_allocations.peak"] = self.oversize_allocations
        out["oversize_segments.current"], out["oversize_segments.peak"] = self.oversize_segments
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["max_split_size"] = -1 if self._max_split >= 2**64 - 1 else self._max_split
        return dict(sorted(out.items()))

    def memory_allocated(self) -> int:
        return self.cur[_AB_ALL]

    def max_memory_allocated(self) -> int:
        return self.all_peak.allocated_bytes

    def memory_reserved(self) -> int:
        return self.cur[_RB_ALL]

    def max_memory_reserved(self) -> int:
        return self.all_peak.reserved_bytes

    def reset_peak_stats(self) -> None:
        """``reset_peak_memory_stats``: every peak becomes its current value."""
        small, large = self._pool_stats
        for name in STAT_NAMES:
            setattr(small, name + "_peak", getattr(small, name))
            setattr(large, name + "_peak", getattr(large, name))
            setattr(self.all_peak, name, getattr(small, name) + getattr(large, name))
        self.oversize_allocations[1] = self.oversize_allocations[0]
        self.oversize_segments[1] = self.oversize_segments[0]

    def reset_accumulated_stats(self) -> None:
        for st in self._pool_stats:
            for name in STAT_NAMES:
                setattr(st, name + "_base", getattr(st, name))
                setattr(st, name + "_freed", 0)
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0

    def set_memory_fraction(self, fraction: float) -> None:
        """``torch.cuda.set_per_process_memory_fraction``."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"invalid fraction {fraction}, must be within 0~1")
        if self.device_total is None:
            raise ValueError("set_per_process_memory_fraction needs the device's total memory")
        self.allowed_memory_maximum = int(fraction * self.device_total)
        self.set_fraction = True

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        self._history.append({"action": action, "addr": addr, "size": size, "stream": stream})  # type: ignore[union-attr]

    # ------------------------------------------------------------------ sizes
    def round_size(self, size: int) -> int:
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        if self._rounds:
            divisions = self.config.divisions_for(size)
            if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
                return _roundup_power2_next_division(size, divisions)
        return (size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE

    @staticmethod
    def get_allocation_size(size: int) -> int:
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE

    # ------------------------------------------------------------------ malloc
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        """Allocate ``orig_size`` bytes on ``stream``; raises OutOfMemoryError.

        The common case (default settings, a cached block fits) is written out inline;
        the general rules live in get_free_block / alloc_block; alloc_found_block is inlined.
        """
        if orig_size.__class__ is not int or not 0 <= orig_size <= MAX_REQUEST_BYTES:
            raise ValueError(f"malloc of {orig_size!r} bytes: a request is a whole number of bytes from 0 to "
                             f"{MAX_REQUEST_BYTES:,} (1 PiB)")
        if self.pending_frees:
            self.process_events()
        if orig_size < K_MIN_BLOCK_SIZE:
            size = K_MIN_BLOCK_SIZE
        elif self._rounds:
            size = self.round_size(orig_size)
        else:
            size = (orig_size + _ROUND_UP) & _ROUND_MASK  # up to a multiple of 512
        pool = self.get_pool(size, stream) if self.captures_underway \
            else self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks
        sl = pool.free.get(stream)  # this stream's sorted free keys (None: nothing cached yet)
        block = None
        if self._plain:
            # get_free_block under the default rules: the first key >= (size, 0) is the best fit
            # (IndexError: every cached block is smaller).
            if sl:
                try:
                    block = pool.blocks.pop(sl.pop(bisect_left(sl, size << _ADDR_BITS)))
                except IndexError:
                    pass
        else:
            block = self.get_free_block(pool, size, stream)
        if block is None:
            alloc_size = self.get_allocation_size(size)
            if self.set_fraction and self.config.garbage_collection_threshold > 0.0:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(pool, size, alloc_size, stream, False)
            if block is None and self.release_available_cached_blocks(pool, size, stream):
                block = self.alloc_block(pool, size, alloc_size, stream, False)
            # (not while a pool is allocated to: a capture cannot synchronise)
            if block is None and not self.captures_underway and self.release_cached_blocks():
                block = self.alloc_block(pool, size, alloc_size, stream, True)
            if block is None:
                self._raise_oom(orig_size, alloc_size, stream)
        # alloc_found_block, written out here (one call less on the hot path):
        st = pool.stats  # this pool's statistics; "all" = st + st.other
        top = self.all_peak
        rest = block.size - size
        # should_split, written as a condition (a compare feeding a jump runs faster):
        if (rest >= K_MIN_BLOCK_SIZE if pool.is_small or self._expandable
                else rest > K_SMALL_SIZE and size < self._max_split):
            remaining = block
            # block = new Block(remaining.addr, size, ...) in front of remaining, its fields
            # set here directly (skipping Block.__init__ saves a call per split):
            block = _new_block(Block)
            block.addr = remaining.addr
            block.size = size
            block.stream = stream
            block.pool = pool
            prev = block.prev = remaining.prev
            block.next = remaining
            block.allocated = False
            block.requested = 0
            block.mapped = True
            block.expandable = remaining.expandable
            block.stream_uses = None
            block.pending = False
            block.gc_base = 0
            block.key = 0
            if prev is not None:
                prev.next = block
            else:
                self._set_head(block)
            remaining.prev = block
            raddr = remaining.addr = remaining.addr + size
            remaining.size = rest
            # pool.insert(remaining), written out: same pool and stream, so the same list
            key = remaining.key = (rest << _ADDR_BITS) | raddr
            if sl is None:
                sl = pool.free.setdefault(stream, [])
            insort(sl, key)
            pool.blocks[key] = remaining
            remaining.gc_base = pool.get_free_blocks_call_count
            if block.expandable is None:  # (expandable segments keep no inactive split stats)
                if prev is not None or remaining.next is not None:
                    # remaining was an inactive split block already: it shrinks by size
                    st.inactive_split_bytes -= size
                    st.inactive_split_bytes_freed += size
                else:  # a new inactive split block appears
                    v = st.inactive_split_bytes + rest
                    st.inactive_split_bytes = v
                    if v > st.inactive_split_bytes_peak:
                        st.inactive_split_bytes_peak = v
                    v += st.other.inactive_split_bytes
                    if v > top.inactive_split_bytes:
                        top.inactive_split_bytes = v
                    v = st.inactive_split + 1
                    st.inactive_split = v
                    if v > st.inactive_split_peak:
                        st.inactive_split_peak = v
                    v += st.other.inactive_split
                    if v > top.inactive_split:
                        top.inactive_split = v
        elif (block.prev is not None or block.next is not None) and block.expandable is None:
            # a whole inactive split block goes
            bsize = block.size
            st.inactive_split_bytes -= bsize
            st.inactive_split_bytes_freed += bsize
            st.inactive_split -= 1
            st.inactive_split_freed += 1
        block.allocated = True
        block.requested = orig_size
        bsize = block.size
        # allocation count, allocated bytes, requested bytes (+ active ones once they differ)
        other = st.other
        v = st.allocation + 1
        st.allocation = v
        if v > st.allocation_peak:
            st.allocation_peak = v
        v += other.allocation
        if v > top.allocation:
            top.allocation = v
        v = st.allocated_bytes + bsize
        st.allocated_bytes = v
        if v > st.allocated_bytes_peak:
            st.allocated_bytes_peak = v
        v += other.allocated_bytes
        self.cur[_AB_ALL] = v
        if v > top.allocated_bytes:
            top.allocated_bytes = v
        v = st.requested_bytes + orig_size
        st.requested_bytes = v
        if v > st.requested_bytes_peak:
            st.requested_bytes_peak = v
        v += other.requested_bytes
        if v > top.requested_bytes:
            top.requested_bytes = v
        if self._extras:
            if not self._active_mirrored:
                self._increase("active", pool, 1)
                self._increase("active_bytes", pool, bsize)
            if bsize >= self._max_split:
                self._bump(self.oversize_allocations, 1)
            if self._history is not None:
                self._record("alloc", block.addr, orig_size, block.stream)
        return block

    def get_pool(self, size: int, stream: int) -> BlockPool:
        """The pool a request of ``size`` (rounded) bytes on ``stream`` comes from: the first
        private pool being allocated to that takes the stream, else the global one."""
        for pool_id, streams in self.captures_underway:
            if streams is None or stream in streams:
                pp = self.graph_pools[pool_id]
                return pp.small_blocks if size <= K_SMALL_SIZE else pp.large_blocks
        return self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks

    # ------------------------------------------------------------------ private pools
    def begin_allocate_to_pool(self, pool_id: tuple[int, int], streams: frozenset[int] | None = None) -> None:
        """``beginAllocateToPool``: requests on ``streams`` (None: any) come from the private pool
        ``pool_id`` (made here, or one more user of it) until :meth:`end_allocate_to_pool`."""
        pool_id = tuple(pool_id)
        if pool_id == (0, 0):
            raise ValueError("private pool id (0, 0) is the global pools'")
        if any(pid == pool_id for pid, _ in self.captures_underway):
            raise ValueError(f"beginAllocateToPool: already allocating to pool {pool_id}")
        pp = self.graph_pools.get(pool_id)
        if pp is None:
            self.graph_pools[pool_id] = PrivatePool(pool_id, *self._pool_stats)
        else:
            if pp.use_count == 0:  # released, then used again before it was freed
                self.graph_pools_freeable.pop(pool_id, None)
            pp.use_count += 1
        self.captures_underway.append((pool_id, None if streams is None else frozenset(streams)))

    def end_allocate_to_pool(self, pool_id: tuple[int, int]) -> None:
        """``endAllocateToPool``: the pool's requests go to the global pools again."""
        pool_id = tuple(pool_id)
        for i, (pid, _) in enumerate(self.captures_underway):
            if pid == pool_id:
                del self.captures_underway[i]
                return

    def release_pool(self, pool_id: tuple[int, int]) -> None:
        """``releasePool``: one user (a graph, a MemPool) is gone; at none, the pool's cached
        segments are freed by the next ``empty_cache`` (its allocated blocks stay until freed)."""
        pool_id = tuple(pool_id)
        pp = self.graph_pools.get(pool_id)
        if pp is None:
            raise ValueError(f"releasePool: no private pool {pool_id}")
        pp.use_count -= 1
        if pp.use_count == 0:
            self.graph_pools_freeable[pool_id] = pp

    def get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self.set_fraction and self.config.garbage_collection_threshold > 0.0:
            pool.get_free_blocks_call_count += 1
        i = self._best_fit(pool, size, stream)
        if i < 0:
            return None
        sl = pool.free[stream]
        key = sl.pop(i)
        return pool.blocks.pop(key)

    def _best_fit(self, pool: BlockPool, size: int, stream: int) -> int:
        """get_free_block's choice, without taking it: its index in the stream's free list, or -1."""
        sl = pool.free.get(stream)
        if not sl:
            return -1
        i = bisect_left(sl, size << _ADDR_BITS)
        n = len(sl)
        if i == n:
            return -1
        block = pool.blocks[sl[i]]
        if block.expandable is not None:
            if self._expandable:
                # Best fit counts a block with the unmapped space that follows it.
                def expandable_size(b: Block) -> int:
                    nxt = b.next
                    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

                while i + 1 < n:
                    nb = pool.blocks[sl[i + 1]]
                    if block.expandable is None or expandable_size(nb) >= expandable_size(block):
                        break
                    i += 1
                    block = nb
            else:
                i += 1
                while i < n and pool.blocks[sl[i]].expandable is not None:
                    i += 1
                if i == n:
                    return -1
                block = pool.blocks[sl[i]]
        max_split = self._max_split
        if size < max_split and block.size >= max_split:
            return -1  # do not hand an oversize block to a small request
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding_size:
            return -1  # nor a much larger oversize block to a large one
        return i

    def can_reuse(self, orig_size: int, stream: int = 0) -> bool:
        """Whether a malloc of ``orig_size`` would be served from the cache (no new memory)."""
        size = self.round_size(orig_size)
        return self._best_fit(self.get_pool(size, stream), size, stream) >= 0

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self._expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def alloc_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int, is_retry: bool) -> Block | None:
        """cudaMalloc a new segment (or map pages of an expandable one)."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.set_fraction and self.total_allocated_memory + alloc_size > self.allowed_memory_maximum:
            return None
        if self._expandable and pool.owner is None:  # (private pools take plain segments)
            return self.try_allocate_expandable_block(pool, size, stream)
        if self.capacity is not None and self.total_allocated_memory + alloc_size > self.capacity:
            return None
        addr = self._device_malloc(alloc_size)
        if addr is None:
            return None
        if addr > _ADDR_MASK:
            raise ValueError(f"device address 0x{addr:x} does not fit in {_ADDR_BITS} bits")
        self.total_allocated_memory += alloc_size
        block = Block(addr, alloc_size, stream, pool)
        self._increase("segment", pool, 1)
        self._increase("reserved_bytes", pool, alloc_size)
        if alloc_size >= self._max_split:
            self._bump(self.oversize_segments, 1)
        self.num_device_alloc += 1
        owner = pool.owner
        if owner is None:
            self.segments[addr] = Segment(addr, alloc_size, stream, pool.is_small, block)
        else:
            owner.segment_count += 1
            self.segments[addr] = Segment(addr, alloc_size, stream, pool.is_small, block, owner.id)
        if self._history is not None:
            self._record("segment_alloc", addr, alloc_size, stream)
        return block

    @staticmethod
    def _bump(stat: list[int], amount: int) -> None:
        stat[0] += amount
        if stat[0] > stat[1]:
            stat[1] = stat[0]

    def _raise_oom(self, orig_size: int, alloc_size: int, stream: int) -> None:
        self.num_ooms += 1
        allocated = self.memory_allocated()
        reserved = self.memory_reserved()
        limit = self.allowed_memory_maximum if self.set_fraction else self.capacity
        if self._history is not None:
            # As PyTorch traces it: the rounded request (params.size()) and the device's free
            # memory (cudaMemGetInfo) where an address would be.
            free = max(0, self.capacity - reserved) if self.capacity is not None else 0
            self._history.append({"action": "oom", "device_free": free, "size": self.round_size(orig_size),
                                  "stream": stream})
        cap = "unlimited" if limit is None else _fmt(limit)
        raise OutOfMemoryError(
            f"CUDA out of memory (simulated). Tried to allocate {_fmt(self.round_size(orig_size))}. "
            f"Of {cap} usable, {_fmt(allocated)} is allocated by PyTorch and "
            f"{_fmt(reserved - allocated)} is reserved by PyTorch but unallocated.",
            requested=orig_size, reserved=reserved, allocated=allocated, capacity=limit,
        )

    # ------------------------------------------------------------------ free
    def free(self, block: Block, _completing: bool = False) -> None:
        """Free a block handed out by :meth:`malloc` (``free`` then ``free_block`` in C++).

        Allocated bytes drop at once; a block used on other streams then waits for them
        (see :meth:`process_events`), any other block goes back to its pool, merged with
        free neighbours. ``_completing`` is the second half for a deferred block.
        """
        pool = block.pool
        st = pool.stats  # this pool's statistics
        extras = self._extras
        if not _completing:
            if not block.allocated:
                raise ValueError(f"{block!r} is not allocated (double free?)")
            block.allocated = False
            size = block.size
            st.allocation -= 1
            st.allocation_freed += 1
            st.allocated_bytes -= size
            st.allocated_bytes_freed += size
            self.cur[_AB_ALL] -= size
            if extras:
                if self._history is not None:
                    self._record("free_requested", block.addr, block.requested, block.stream)
                if size >= self._max_split:
                    self.oversize_allocations[0] -= 1
            if block.stream_uses:
                if self._active_mirrored:
                    self._unmirror_active(block)
                block.pending = True
                block.stream_uses = None
                self.pending_frees.append(block)
                return
        if extras and self._history is not None:
            self._record("free_completed", block.addr, block.requested, block.stream)
        original_size = block.size
        merged = 0  # free neighbours absorbed
        mapped = block.mapped
        blocks = pool.blocks
        sl = pool.free.get(block.stream)  # neighbours share the block's pool and stream
        prev = block.prev
        if prev is not None and not prev.allocated and not prev.pending and prev.mapped is mapped:
            # try_merge_blocks(block, prev), written out for mapped blocks
            merged = 1
            if mapped:
                key = prev.key
                del sl[bisect_left(sl, key)]
                del blocks[key]
            else:
                self._unmapped_erase(prev)
            block.addr = prev.addr
            block.size += prev.size
            pp = block.prev = prev.prev
            if pp is not None:
                pp.next = block
            else:
                self._set_head(block)
        nxt = block.next
        if nxt is not None and not nxt.allocated and not nxt.pending and nxt.mapped is mapped:
            merged += 1
            if mapped:
                key = nxt.key
                del sl[bisect_left(sl, key)]
                del blocks[key]
            else:
                self._unmapped_erase(nxt)
            block.size += nxt.size
            nn = block.next = nxt.next
            if nn is not None:
                nn.prev = block
        # pool.insert(block), written out
        key = block.key = (block.size << _ADDR_BITS) | block.addr
        if sl is None:
            sl = pool.free.setdefault(block.stream, [])
        insort(sl, key)
        blocks[key] = block
        block.gc_base = pool.get_free_blocks_call_count
        if block.expandable is None:
            # Inactive split blocks: the merged neighbours were ones; the block becomes one
            # unless its segment is whole again (net: + its own size, or - the neighbours').
            if block.prev is not None or block.next is not None:
                if merged == 0:
                    v = st.inactive_split + 1
                    st.inactive_split = v
                    if v > st.inactive_split_peak:
                        st.inactive_split_peak = v
                    v += st.other.inactive_split
                    if v > self.all_peak.inactive_split:
                        self.all_peak.inactive_split = v
                elif merged == 2:
                    st.inactive_split -= 1
                    st.inactive_split_freed += 1
                v = st.inactive_split_bytes + original_size
                st.inactive_split_bytes = v
                if v > st.inactive_split_bytes_peak:
                    st.inactive_split_bytes_peak = v
                v += st.other.inactive_split_bytes
                if v > self.all_peak.inactive_split_bytes:
                    self.all_peak.inactive_split_bytes = v
            elif merged:
                gone = block.size - original_size
                st.inactive_split -= merged
                st.inactive_split_freed += merged
                st.inactive_split_bytes -= gone
                st.inactive_split_bytes_freed += gone
        requested = block.requested
        st.requested_bytes -= requested
        st.requested_bytes_freed += requested
        if extras and not self._active_mirrored:
            self._decrease("active", pool, 1)
            self._decrease("active_bytes", pool, original_size)

    def _unmirror_active(self, block: Block) -> None:
        """Active stats equal allocation stats until a free is first deferred; split them."""
        self._active_mirrored = False
        self._update_extras()
        for src, dst in (("allocation", "active"), ("allocated_bytes", "active_bytes")):
            for st in self._pool_stats:
                for f in ("", "_peak", "_freed", "_base"):
                    setattr(st, dst + f, getattr(st, src + f))
            setattr(self.all_peak, dst, getattr(self.all_peak, src))
        # The block being deferred is still active: undo its share of the decrease.
        st = block.pool.stats
        st.active += 1
        st.active_freed -= 1
        st.active_bytes += block.size
        st.active_bytes_freed -= block.size

    def record_stream(self, block: Block, stream: int) -> None:
        """``Tensor.record_stream``: the block was used on ``stream`` too."""
        if stream == block.stream:
            return
        if block.stream_uses is None:
            block.stream_uses = set()
        block.stream_uses.add(stream)

    def process_events(self, all_complete: bool = False) -> None:
        """Return deferred frees whose streams caught up.

        The simulator has no clock, so other streams' events complete at a synchronisation
        (``synchronize``, ``empty_cache``); until then the block stays out of its pool, as
        it does on a GPU whose streams are still busy. ``all_complete`` completes them all.
        """
        if not all_complete:
            return
        pending, self.pending_frees = self.pending_frees, []
        for block in pending:
            block.pending = False
            self.free(block, _completing=True)

    def synchronize(self) -> None:
        """``torch.cuda.synchronize``: every stream's pending events complete."""
        self.process_events(all_complete=True)

    def _merge(self, dst: Block, src: Block, pool: BlockPool) -> int:
        """``try_merge_blocks`` after its checks: ``dst`` absorbs its free neighbour ``src``."""
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                self._set_head(dst)
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        subsumed = src.size
        dst.size += subsumed
        if src.mapped:
            pool.erase(src)
        else:
            self._unmapped_erase(src)
        return subsumed

    # ------------------------------------------------------------------ releasing
    def release_block(self, block: Block) -> None:
        """cudaFree a whole cached segment."""
        self.num_device_free += 1
        if self._history is not None:
            self._record("segment_free", block.addr, block.size, block.stream)
        self._device_free(block.addr, block.size)
        self.total_allocated_memory -= block.size
        self._decrease("segment", block.pool, 1)
        self._decrease("reserved_bytes", block.pool, block.size)
        if block.size >= self._max_split:
            self.oversize_segments[0] -= 1
        block.pool.erase(block)
        del self.segments[block.addr]
        if block.pool.owner is not None:
            block.pool.owner.segment_count -= 1

    def release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        """Free cached oversize blocks (only with max_split_size set)."""
        max_split = self._max_split
        if max_split >= 2**64 - 1:
            return False
        key_size = max(size, max_split)
        sl = pool.free.get(stream)
        if not sl:
            return False
        i = bisect_left(sl, key_size << _ADDR_BITS)
        if i < len(sl) and pool.blocks[sl[i]].expandable is None:
            self.release_block(pool.blocks[sl[i]])
            return True
        # No single block is large enough: free oversize blocks, largest first.
        released = 0
        candidates = [pool.blocks[k] for k in sl[:i]]
        for block in reversed(candidates):
            if released >= key_size or block.size < max_split:
                break
            if block.expandable is None and not block.is_split():
                released += block.size
                self.release_block(block)
        return released >= key_size

    def release_cached_blocks(self) -> bool:
        """``empty_cache``: complete pending frees, then free every whole cached segment."""
        self.synchronize()
        pools = [self.large_blocks, self.small_blocks]
        for pp in self.graph_pools_freeable.values():  # private pools no one uses any more
            pools += (pp.small_blocks, pp.large_blocks)
        for pool in pools:
            to_unmap = []
            for block in list(pool):
                if block.expandable is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self.release_block(block)
            for block in to_unmap:
                self.unmap_block(block)
                if block.prev is None and block.next is None and not block.mapped:
                    self.release_expandable_segment(block)
        for pool_id, pp in list(self.graph_pools_freeable.items()):
            if pp.segment_count == 0:
                del self.graph_pools[pool_id], self.graph_pools_freeable[pool_id]
        return True

    def empty_cache(self) -> None:
        self.release_cached_blocks()

    def garbage_collect_cached_blocks(self) -> None:
        """Free old unsplit large cached blocks once reserved passes the GC threshold."""
        gc_threshold = int(self.config.garbage_collection_threshold * self.allowed_memory_maximum)
        if self.total_allocated_memory <= gc_threshold:
            return
        target = self.total_allocated_memory - gc_threshold
        pool = self.large_blocks
        calls = pool.get_free_blocks_call_count
        total_age = 0
        freeable = 0
        for b in pool:
            if not b.is_split():
                total_age += calls - b.gc_base
                freeable += 1
        if freeable == 0:
            return
        reclaimed = 0
        block_freed = True
        while reclaimed < target and block_freed and freeable > 0:
            age_threshold = total_age / freeable
            block_freed = False
            for b in list(pool):
                age = calls - b.gc_base
                if not b.is_split() and b.expandable is None and age >= age_threshold:
                    block_freed = True
                    reclaimed += b.size
                    total_age -= age
                    freeable -= 1
                    self.release_block(b)

    # ------------------------------------------------------------------ expandable segments
    def _unmapped_insert(self, b: Block) -> None:
        sl = b.pool.unmapped.get(b.stream)
        if sl is None:
            sl = b.pool.unmapped[b.stream] = []
        insort(sl, b.addr)
        b.expandable.unmapped_blocks[b.addr] = b  # type: ignore[union-attr]

    def _unmapped_erase(self, b: Block) -> None:
        sl = b.pool.unmapped[b.stream]
        del sl[bisect_left(sl, b.addr)]
        del b.expandable.unmapped_blocks[b.addr]  # type: ignore[union-attr]

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated and not b.pending

        def has_room(b: Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                total += b.size  # type: ignore[union-attr]
                b = b.next  # type: ignore[union-attr]
            return total >= size

        owner = {id(es): es for es in self.expandable_segments}
        for addr in list(pool.unmapped.get(stream, ())):
            c = self._unmapped_lookup(owner, pool, stream, addr)
            if allocatable(c.prev):
                c = c.prev  # type: ignore[assignment]
            if has_room(c):
                return c
        page = K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER
        vsize = self.expandable_segment_size(page)
        base = self._device_reserve(vsize, stream, pool.is_small)
        placeholder = base is None
        if placeholder:
            base = self._vas.reserve(vsize)
        else:
            vsize = self._room_below_next(base, vsize, page)
        if base + vsize - 1 > _ADDR_MASK:
            raise ValueError(f"device address 0x{base:x} does not fit in {_ADDR_BITS} bits")
        c = self._new_expandable_segment(base, vsize, page, stream, pool)
        c.expandable.placeholder = placeholder  # type: ignore[union-attr]
        return c

    def _place_expandable_segment(self, es: ExpandableSegment) -> None:
        """A segment reserved without an address (no page of it mapped yet): ask again, and
        move it there if one comes."""
        self.expandable_segments.remove(es)  # (not one of the segments it must avoid)
        try:
            base = self._device_reserve(es.virtual_size, es.stream, es.pool.is_small)
        finally:
            self.expandable_segments.append(es)
        if base is None:
            return
        if base + es.virtual_size - 1 > _ADDR_MASK:
            raise ValueError(f"device address 0x{base:x} does not fit in {_ADDR_BITS} bits")
        b = es.head
        assert b is not None and b.next is None and not es.mapped_pages
        self._unmapped_erase(b)
        if self._device_release is not None:
            self._device_release(es.base, es.virtual_size)
        es.base = b.addr = base
        es.virtual_size = b.size = self._room_below_next(base, es.virtual_size, es.page_size)
        es.placeholder = False
        self._unmapped_insert(b)

    def _room_below_next(self, base: int, vsize: int, page: int) -> int:
        """``vsize``, cut to the whole pages below the next segment's base: address ranges
        reserved at a given address (a replay's) never overlap (a placeholder's is no real one)."""
        for es in self.expandable_segments:
            if base < es.base < base + vsize and not es.placeholder:
                vsize = (es.base - base) // page * page
        return max(vsize, page)

    def unmapped_from(self, es: ExpandableSegment, addr: int) -> bool:
        """Whether nothing of ``es`` from ``addr`` on is mapped (its last block, unmapped, holds it)."""
        b = es.head
        while b is not None and b.next is not None:
            b = b.next
        return b is not None and not b.mapped and b.addr <= addr

    def trim_expandable_segment(self, es: ExpandableSegment, size: int) -> None:
        """Shorten ``es``'s address space to ``size`` bytes (whole pages; nothing mapped beyond)."""
        size = size // es.page_size * es.page_size
        end = es.base + size
        assert size > 0 and self.unmapped_from(es, end)
        tail = es.head
        while tail is not None and tail.next is not None:
            tail = tail.next
        assert tail is not None
        if tail.addr == end:
            self._unmapped_erase(tail)
            if tail.prev is not None:
                tail.prev.next = None
        else:
            tail.size = end - tail.addr
        es.virtual_size = size

    def expandable_segment_size(self, page: int) -> int:
        """Address space of a new expandable segment: 1 1/8 of the device's total memory in whole
        pages (``ExpandableSegment``'s ``max_handles_``; 1 TiB when the total is unknown)."""
        total = self.device_total if self.device_total is not None else (1 << 40)
        return (total + total // 8 + page - 1) // page * page

    def _new_expandable_segment(self, base: int, vsize: int, page: int, stream: int,
                                pool: BlockPool) -> Block:
        es = ExpandableSegment(base, vsize, page, stream, pool, set(), {})
        self.expandable_segments.append(es)
        c = Block(base, vsize, stream, pool)
        c.mapped = False
        c.expandable = es
        es.head = c
        self._unmapped_insert(c)
        return c

    def _unmapped_lookup(self, owner: dict, pool: BlockPool, stream: int, addr: int) -> Block:
        for es in self.expandable_segments:
            if es.pool is pool and es.stream == stream and addr in es.unmapped_blocks:
                return es.unmapped_blocks[addr]
        raise AssertionError(f"unmapped block 0x{addr:x} not found")

    def _map_block(self, b: Block, size: int) -> bool:
        es = b.expandable
        assert es is not None and not b.mapped and size <= b.size
        if es.placeholder and not es.mapped_pages:
            self._place_expandable_segment(es)
        first = (b.addr - es.base) // es.page_size
        last = (b.addr + size - es.base + es.page_size - 1) // es.page_size
        new_pages = [p for p in range(first, last) if p not in es.mapped_pages]
        assert len(new_pages) == last - first, "mapping a page that is mapped already"
        mapped_size = (last - first) * es.page_size
        if self.capacity is not None and self.total_allocated_memory + mapped_size > self.capacity:
            return False
        if self._device_map is not None and not self._device_map(b.addr, mapped_size):
            return False
        es.mapped_pages.update(new_pages)
        es.placeholder = False  # (its address is the one mapped now)
        mapped_addr = b.addr  # (the trace names the range mapped, before b merges with its neighbours)
        pool = b.pool
        self._unmapped_erase(b)
        b.mapped = True
        if mapped_size < b.size:
            rest = Block(b.addr + mapped_size, b.size - mapped_size, b.stream, pool)
            rest.mapped = False
            rest.expandable = es
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            self._unmapped_insert(rest)
            b.size = mapped_size
        for nb in (b.prev, b.next):
            if nb is not None and not nb.allocated and not nb.pending \
                    and nb.mapped == b.mapped:
                self._merge(b, nb, pool)
        pool.insert(b)
        self.total_allocated_memory += mapped_size
        self._increase("reserved_bytes", pool, mapped_size)
        self.num_device_alloc += 1
        if self._history is not None:
            self._record("segment_map", mapped_addr, mapped_size, b.stream)
        return True

    def try_allocate_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        c = self._find_expandable_block(pool, size, stream)
        if c.next is None and c.size < size:
            return None  # more than a new segment's whole address space (1 1/8 of the device)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            remaining = size - c.size
            nb = c.next
            assert nb is not None
            if not self._map_block(nb, min(remaining, nb.size)):
                return None
            c = nb
        pool.erase(c)
        return c

    def unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside a free expandable block."""
        es = block.expandable
        assert es is not None
        page = es.page_size
        first = (block.addr - es.base + page - 1) // page
        last = (block.addr + block.size - es.base) // page
        if first >= last:
            return
        pool = block.pool
        pool.erase(block)
        start = es.base + first * page
        nbytes = (last - first) * page
        before = start - block.addr
        if before > 0:
            bf = Block(block.addr, before, block.stream, pool)
            bf.expandable = es
            bf.prev, bf.next = block.prev, block
            if block.prev is not None:
                block.prev.next = bf
            else:
                es.head = bf
            block.prev = bf
            pool.insert(bf)
        after = block.size - before - nbytes
        if after > 0:
            af = Block(start + nbytes, after, block.stream, pool)
            af.expandable = es
            af.prev, af.next = block, block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            pool.insert(af)
        block.addr = start
        block.size = nbytes
        block.mapped = False
        for nb in (block.prev, block.next):
            if nb is not None and not nb.allocated and not nb.pending \
                    and nb.mapped == block.mapped:
                self._merge(block, nb, pool)
        self._unmapped_insert(block)
        es.mapped_pages.difference_update(range(first, last))
        self.total_allocated_memory -= nbytes
        self._decrease("reserved_bytes", pool, nbytes)
        self.num_device_free += 1
        if self._history is not None:
            self._record("segment_unmap", start, nbytes, block.stream)
        if self._device_unmap is not None:
            self._device_unmap(start, nbytes)

    def release_expandable_segment(self, block: Block) -> None:
        """Give back the address range of an expandable segment none of whose pages is mapped
        (``block`` spans all of it)."""
        es = block.expandable
        assert es is not None and not block.mapped and block.size == es.virtual_size
        self.expandable_segments.remove(es)
        self._unmapped_erase(block)
        es.head = None
        if self._device_release is not None:
            self._device_release(es.base, es.virtual_size)

    # ------------------------------------------------------------------ state
    def add_segment(self, addr: int, size: int, stream: int, is_small: bool,
                    blocks: list[tuple[int, int, bool, int]]) -> list[Block]:
        """Install an existing segment (used to rebuild a recorded starting state).

        ``blocks``: (addr, size, allocated, requested) covering the segment in address
        order. Returns the Block objects, allocated ones to be freed later by the caller.
        """
        pool = self.small_blocks if is_small else self.large_blocks
        if sum(b[1] for b in blocks) != size or (blocks and blocks[0][0] != addr):
            raise ValueError(f"blocks do not tile segment 0x{addr:x} of {size} bytes")
        self.segments[addr] = Segment(addr, size, stream, is_small)
        self.total_allocated_memory += size
        self._increase("segment", pool, 1)
        self._increase("reserved_bytes", pool, size)
        if size >= self._max_split:
            self._bump(self.oversize_segments, 1)
        out: list[Block] = []
        prev: Block | None = None
        for baddr, bsize, allocated, requested in blocks:
            b = Block(baddr, bsize, stream, pool)
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            out.append(b)
        self.segments[addr].head = out[0] if out else None
        split = len(out) > 1
        for b, (_, bsize, allocated, requested) in zip(out, blocks):
            if allocated:
                b.allocated = True
                b.requested = requested
                for name, amount in (("allocation", 1), ("allocated_bytes", bsize), ("active", 1),
                                     ("active_bytes", bsize), ("requested_bytes", requested)):
                    self._increase(name, pool, amount)
                if bsize >= self._max_split:
                    self._bump(self.oversize_allocations, 1)
            else:
                pool.insert(b)
                if split:
                    self._increase("inactive_split", pool, 1)
                    self._increase("inactive_split_bytes", pool, bsize)
        return out

    def add_expandable_segment(self, base: int, virtual_size: int, stream: int, is_small: bool,
                               ranges: list[tuple[int, int, list[tuple[int, int, bool, int]]]]) -> list[Block]:
        """Install an existing expandable segment (to rebuild a recorded starting state).

        ``ranges``: its mapped ranges as (addr, size, blocks), ``blocks`` as for
        :meth:`add_segment`; the rest of ``[base, base + virtual_size)`` is unmapped. Returns
        the Block objects of the mapped ranges.
        """
        pool = self.small_blocks if is_small else self.large_blocks
        page = K_SMALL_BUFFER if is_small else K_LARGE_BUFFER
        if virtual_size <= 0 or virtual_size % page or base + virtual_size - 1 > _ADDR_MASK:
            raise ValueError(f"expandable segment 0x{base:x} of {virtual_size} bytes: not whole {page}-byte pages")
        es = ExpandableSegment(base, virtual_size, page, stream, pool, set(), {})
        chain: list[Block] = []
        out: list[Block] = []
        cursor = base
        for addr, size, blocks in sorted(ranges, key=lambda r: r[0]):
            if addr < cursor or (addr - base) % page or size <= 0 or size % page \
                    or addr + size > base + virtual_size:
                raise ValueError(f"mapped range 0x{addr:x} of {size} bytes does not fit expandable segment "
                                 f"0x{base:x} in whole {page}-byte pages")
            if sum(b[1] for b in blocks) != size or not blocks or blocks[0][0] != addr:
                raise ValueError(f"blocks do not tile mapped range 0x{addr:x} of {size} bytes")
            if addr > cursor:
                gap = Block(cursor, addr - cursor, stream, pool)
                gap.mapped = False
                chain.append(gap)
            for baddr, bsize, allocated, requested in blocks:
                b = Block(baddr, bsize, stream, pool)
                b.allocated = allocated
                b.requested = requested if allocated else 0
                chain.append(b)
                out.append(b)
            es.mapped_pages.update(range((addr - base) // page, (addr + size - base) // page))
            self.total_allocated_memory += size
            self._increase("reserved_bytes", pool, size)
            cursor = addr + size
        if cursor < base + virtual_size:
            tail = Block(cursor, base + virtual_size - cursor, stream, pool)
            tail.mapped = False
            chain.append(tail)
        self.expandable_segments.append(es)
        es.head = chain[0]
        prev: Block | None = None
        for b in chain:
            b.expandable = es
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            if not b.mapped:
                self._unmapped_insert(b)
            elif b.allocated:
                for name, amount in (("allocation", 1), ("allocated_bytes", b.size), ("active", 1),
                                     ("active_bytes", b.size), ("requested_bytes", b.requested)):
                    self._increase(name, pool, amount)
                if b.size >= self._max_split:
                    self._bump(self.oversize_allocations, 1)
            else:
                pool.insert(b)
        return out

    def iter_segments(self) -> Iterator[tuple[int, int, int, bool, bool, list[Block]]]:
        """(addr, total_size, stream, is_small, is_expandable, blocks) for every segment.

        Expandable segments are reported as one segment per contiguous mapped range,
        as PyTorch's snapshot does. (C++ finds allocated blocks through an ``active_blocks``
        set; here every segment knows its first block, so malloc and free keep no set.)
        """
        out = [(a, s.size, s.stream, s.is_small, False, _chain(s.head)) for a, s in self.segments.items()]
        for es in self.expandable_segments:
            run: list[Block] = []
            for b in _chain(es.head) + [None]:  # type: ignore[list-item]
                if b is not None and b.mapped:
                    run.append(b)
                elif run:
                    out.append((run[0].addr, sum(x.size for x in run), es.stream, es.pool.is_small, True, run))
                    run = []
        # in address order, both kinds together (as the snapshot sorts them)
        out.sort(key=lambda seg: seg[0])
        yield from out

    def _set_head(self, b: Block) -> None:
        """``b`` now starts its segment (it was split off the front, or absorbed the front)."""
        if b.expandable is not None:
            b.expandable.head = b
        else:
            self.segments[b.addr].head = b

    def check_invariants(self) -> None:
        """Assert the structural invariants (used by tests): tiling, no overlap, stats."""
        alloc_bytes = [0, 0, 0]
        reserved = [0, 0, 0]
        for addr, size, stream, is_small, expandable, blocks in self.iter_segments():
            pt = 1 if is_small else 2
            reserved[0] += size
            reserved[pt] += size
            cursor = addr
            for i, b in enumerate(blocks):
                assert b.addr == cursor, f"gap or overlap at 0x{cursor:x}"
                cursor += b.size
                if b.allocated:
                    alloc_bytes[0] += b.size
                    alloc_bytes[pt] += b.size
                elif not expandable and not b in self.pending_frees:
                    nxt = blocks[i + 1] if i + 1 < len(blocks) else None
                    assert nxt is None or nxt.allocated or nxt in self.pending_frees, \
                        f"adjacent free blocks at 0x{b.addr:x}"
                    if not is_small and b.is_split():
                        assert b.size > K_SMALL_SIZE, f"free large-pool block of {b.size} <= 1 MiB"
            assert cursor == addr + size, f"segment 0x{addr:x} not tiled"
        for t, pool_type in enumerate(POOL_TYPES):
            assert self.stat("allocated_bytes", pool_type) == alloc_bytes[t], "allocated_bytes != recount"
            assert self.stat("reserved_bytes", pool_type) == reserved[t], "reserved_bytes != recount"
        assert self.cur[_AB_ALL] == alloc_bytes[0] and self.cur[_RB_ALL] == reserved[0]
        assert self.memory_allocated() <= self.memory_reserved()
        assert self.total_allocated_memory == self.memory_reserved()


def _chain(b: Block | None) -> list[Block]:
    """``b`` and the blocks after it (``next`` links), in address order."""
    out = []
    while b is not None:
        out.append(b)
        b = b.next
    return out


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def _fmt(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} bytes"
