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

from bisect import bisect_left, bisect_right, insort

from xmem_engine.alloc_conf import AllocatorConfig

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 << 20  # 1 MiB: largest "small" request
K_SMALL_BUFFER = 2 << 20  # 2 MiB: small-pool segment (and expandable small page)
K_LARGE_BUFFER = 20 << 20  # 20 MiB: mid-size segment (and expandable large page)
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20

_ADDR_BITS = 48  # CUDA virtual addresses fit in 48 bits; free-set keys pack size above them
_ADDR_MASK = (1 << _ADDR_BITS) - 1

# Statistics: one slot per (stat, pool type) at index stat * 3 + pool_type in the lists
# cur / peak / freed; "allocated" (cumulative) is derived as cur - base + freed.
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
_AB, _RB, _IS, _ISB = ALLOCATED_BYTES * 3, REQUESTED_BYTES * 3, INACTIVE_SPLIT * 3, INACTIVE_SPLIT_BYTES * 3




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
        "mapped", "expandable", "stream_uses", "pending", "gc_base",
    )

    def __init__(self, addr: int, size: int, stream: int, pool: "BlockPool"):
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

    __slots__ = ("is_small", "pt", "free", "blocks", "unmapped", "get_free_blocks_call_count")

    def __init__(self, is_small: bool):
        self.is_small = is_small
        self.pt = 1 if is_small else 2  # statistics slot: 1 small_pool, 2 large_pool
        self.free: dict[int, list[int]] = {}
        self.blocks: dict[int, Block] = {}  # key -> block
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addresses
        self.get_free_blocks_call_count = 0

    def insert(self, b: Block) -> None:
        key = (b.size << _ADDR_BITS) | b.addr
        sl = self.free.get(b.stream)
        if sl is None:
            sl = self.free[b.stream] = []
        insort(sl, key)
        self.blocks[key] = b
        b.gc_base = self.get_free_blocks_call_count

    def erase(self, b: Block) -> None:
        key = (b.size << _ADDR_BITS) | b.addr
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


@dataclass
class ExpandableSegment:
    """One growing virtual range per (stream, pool) whose pages are mapped on demand."""

    base: int
    virtual_size: int
    page_size: int
    stream: int
    pool: BlockPool
    mapped_pages: set[int]
    unmapped_blocks: dict[int, Block]  # addr -> unmapped block


@dataclass
class Segment:
    """A cudaMalloc'd range (non-expandable)."""

    addr: int
    size: int
    stream: int
    is_small: bool


class _VirtualAddressSpace:
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
        """Address range for an expandable segment (never reused)."""
        return self.malloc(size)


class CachingAllocator:
    """One device's caching allocator.

    ``capacity``: bytes cudaMalloc can obtain (None = unlimited); ``device_total``: the
    device's total memory, the base of ``set_per_process_memory_fraction`` (defaults to
    capacity). ``device_malloc(size) -> addr | None`` / ``device_free(addr, size)`` replace
    the virtual address space (used by replays); returning None means out of memory.
    ``history``: a list that receives snapshot-style trace entries (dicts), or None.
    """

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        capacity: int | None = None,
        device_total: int | None = None,
        device_malloc: Callable[[int], int | None] | None = None,
        device_free: Callable[[int, int], None] | None = None,
        history: list | None = None,
    ):
        self.config = config or AllocatorConfig()
        if self.config.backend != "native":
            raise ValueError("backend:cudaMallocAsync bypasses the caching allocator; xmem simulates the native one")
        self.capacity = capacity
        self.device_total = device_total if device_total is not None else capacity
        self._vas = _VirtualAddressSpace()
        self._device_malloc = device_malloc or self._vas.malloc
        self._device_free = device_free or self._vas.free
        self.history = history
        self.small_blocks = BlockPool(is_small=True)
        self.large_blocks = BlockPool(is_small=False)
        self.segments: dict[int, Segment] = {}
        self.expandable_segments: list[ExpandableSegment] = []
        self.active_blocks: set[Block] = set()
        self.pending_frees: list[Block] = []  # freed blocks waiting for other streams
        self.total_allocated_memory = 0  # reserved bytes, as PyTorch names it
        self.set_fraction = False
        self.allowed_memory_maximum = 0
        n_slots = len(STAT_NAMES) * 3
        self.cur = [0] * n_slots
        self.peak = [0] * n_slots
        self.freed = [0] * n_slots
        self.base = [0] * n_slots  # cur at the last reset_accumulated_stats
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

    # ------------------------------------------------------------------ statistics
    def _increase(self, stat: int, pool_type: int, amount: int) -> None:
        cur, peak = self.cur, self.peak
        for i in (stat * 3, stat * 3 + pool_type):
            v = cur[i] + amount
            cur[i] = v
            if v > peak[i]:
                peak[i] = v

    def _decrease(self, stat: int, pool_type: int, amount: int) -> None:
        cur, freed = self.cur, self.freed
        for i in (stat * 3, stat * 3 + pool_type):
            cur[i] -= amount
            freed[i] += amount

    def stat(self, name: str, pool: str = "all", field: str = "current") -> int:
        if self._active_mirrored and name in ("active", "active_bytes"):
            name = "allocation" if name == "active" else "allocated_bytes"
        i = STAT_NAMES.index(name) * 3 + POOL_TYPES.index(pool)
        if field == "current":
            return self.cur[i]
        if field == "peak":
            return self.peak[i]
        if field == "freed":
            return self.freed[i]
        if field == "allocated":
            return self.cur[i] - self.base[i] + self.freed[i]
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
        return self.cur[ALLOCATED_BYTES * 3]

    def max_memory_allocated(self) -> int:
        return self.peak[ALLOCATED_BYTES * 3]

    def memory_reserved(self) -> int:
        return self.cur[RESERVED_BYTES * 3]

    def max_memory_reserved(self) -> int:
        return self.peak[RESERVED_BYTES * 3]

    def reset_peak_stats(self) -> None:
        """``reset_peak_memory_stats``: every peak becomes its current value."""
        self.peak[:] = self.cur
        self.oversize_allocations[1] = self.oversize_allocations[0]
        self.oversize_segments[1] = self.oversize_segments[0]

    def reset_accumulated_stats(self) -> None:
        self.base[:] = self.cur
        self.freed[:] = [0] * len(self.freed)
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
        self.history.append({"action": action, "addr": addr, "size": size, "stream": stream})  # type: ignore[union-attr]

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
        if self.pending_frees:
            self.process_events()
        if orig_size < K_MIN_BLOCK_SIZE:
            size = K_MIN_BLOCK_SIZE
        elif self._rounds:
            size = self.round_size(orig_size)
        else:
            size = (orig_size + K_MIN_BLOCK_SIZE - 1) & -K_MIN_BLOCK_SIZE
        pool = self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks
        block = None
        if self._plain:
            sl = pool.free.get(stream)
            if sl:
                i = bisect_left(sl, size << _ADDR_BITS)
                if i < len(sl):
                    key = sl[i]
                    del sl[i]
                    block = pool.blocks.pop(key)
        else:
            block = self.get_free_block(pool, size, stream)
        if block is None:
            alloc_size = self.get_allocation_size(size)
            if self.set_fraction and self.config.garbage_collection_threshold > 0.0:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(pool, size, alloc_size, stream, False)
            if block is None and self.release_available_cached_blocks(pool, size, stream):
                block = self.alloc_block(pool, size, alloc_size, stream, False)
            if block is None and self.release_cached_blocks():
                block = self.alloc_block(pool, size, alloc_size, stream, True)
            if block is None:
                self._raise_oom(orig_size, alloc_size, stream)
        remaining = block.size - size
        if pool.is_small or self._expandable:
            split_remainder = remaining >= K_MIN_BLOCK_SIZE
        else:
            split_remainder = size < self._max_split and remaining > K_SMALL_SIZE
        # alloc_found_block, written out here (one call less on the hot path):
        pool = block.pool
        pt = pool.pt
        cur, peak, freed = self.cur, self.peak, self.freed
        already_split = block.prev is not None or block.next is not None
        if split_remainder:
            remaining = block
            block = Block(remaining.addr, size, remaining.stream, pool)
            prev = remaining.prev
            if prev is not None:
                block.prev = prev
                prev.next = block
            block.next = remaining
            remaining.prev = block
            raddr = remaining.addr = remaining.addr + size
            rsize = remaining.size = remaining.size - size
            # pool.insert(remaining), written out
            key = (rsize << _ADDR_BITS) | raddr
            sl = pool.free.get(remaining.stream)
            if sl is None:
                sl = pool.free[remaining.stream] = []
            insort(sl, key)
            pool.blocks[key] = remaining
            remaining.gc_base = pool.get_free_blocks_call_count
            if remaining.expandable is not None:
                block.expandable = remaining.expandable
            elif already_split:  # an inactive split block shrinks by size
                i = _ISB + pt
                cur[_ISB] -= size
                cur[i] -= size
                freed[_ISB] += size
                freed[i] += size
            else:  # a new inactive split block appears
                i = _ISB + pt
                v = cur[_ISB] + rsize
                cur[_ISB] = v
                if v > peak[_ISB]:
                    peak[_ISB] = v
                v = cur[i] + rsize
                cur[i] = v
                if v > peak[i]:
                    peak[i] = v
                i = _IS + pt
                v = cur[_IS] + 1
                cur[_IS] = v
                if v > peak[_IS]:
                    peak[_IS] = v
                v = cur[i] + 1
                cur[i] = v
                if v > peak[i]:
                    peak[i] = v
        elif already_split and block.expandable is None:  # a whole inactive split block goes
            bsize = block.size
            i = _ISB + pt
            cur[_ISB] -= bsize
            cur[i] -= bsize
            freed[_ISB] += bsize
            freed[i] += bsize
            i = _IS + pt
            cur[_IS] -= 1
            cur[i] -= 1
            freed[_IS] += 1
            freed[i] += 1
        block.allocated = True
        block.requested = orig_size
        self.active_blocks.add(block)
        bsize = block.size
        # allocation count, allocated bytes, requested bytes (+ active ones once they differ)
        v = cur[0] + 1
        cur[0] = v
        if v > peak[0]:
            peak[0] = v
        v = cur[pt] + 1
        cur[pt] = v
        if v > peak[pt]:
            peak[pt] = v
        i = _AB + pt
        v = cur[_AB] + bsize
        cur[_AB] = v
        if v > peak[_AB]:
            peak[_AB] = v
        v = cur[i] + bsize
        cur[i] = v
        if v > peak[i]:
            peak[i] = v
        i = _RB + pt
        v = cur[_RB] + orig_size
        cur[_RB] = v
        if v > peak[_RB]:
            peak[_RB] = v
        v = cur[i] + orig_size
        cur[i] = v
        if v > peak[i]:
            peak[i] = v
        if not self._active_mirrored:
            self._increase(ACTIVE, pt, 1)
            self._increase(ACTIVE_BYTES, pt, bsize)
        if bsize >= self._max_split:
            self._bump(self.oversize_allocations, 1)
        if self.history is not None:
            self._record("alloc", block.addr, orig_size, block.stream)
        return block


    def get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self.set_fraction and self.config.garbage_collection_threshold > 0.0:
            pool.get_free_blocks_call_count += 1
        sl = pool.free.get(stream)
        if not sl:
            return None
        i = bisect_left(sl, size << _ADDR_BITS)
        n = len(sl)
        if i == n:
            return None
        key = sl[i]
        block = pool.blocks[key]
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
                key = sl[i]
            else:
                i += 1
                while i < n and pool.blocks[sl[i]].expandable is not None:
                    i += 1
                if i == n:
                    return None
                key = sl[i]
                block = pool.blocks[key]
        max_split = self._max_split
        if size < max_split and block.size >= max_split:
            return None  # do not hand an oversize block to a small request
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding_size:
            return None  # nor a much larger oversize block to a large one
        del sl[i]
        del pool.blocks[key]
        return block

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
        if self._expandable:
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
        pt = 1 if pool.is_small else 2
        self._increase(SEGMENT, pt, 1)
        self._increase(RESERVED_BYTES, pt, alloc_size)
        if alloc_size >= self._max_split:
            self._bump(self.oversize_segments, 1)
        self.num_device_alloc += 1
        self.segments[addr] = Segment(addr, alloc_size, stream, pool.is_small)
        if self.history is not None:
            self._record("segment_alloc", addr, alloc_size, stream)
        return block

    @staticmethod
    def _bump(stat: list[int], amount: int) -> None:
        stat[0] += amount
        if stat[0] > stat[1]:
            stat[1] = stat[0]

    def _raise_oom(self, orig_size: int, alloc_size: int, stream: int) -> None:
        self.num_ooms += 1
        if self.history is not None:
            self._record("oom", 0, alloc_size, stream)
        allocated = self.memory_allocated()
        reserved = self.memory_reserved()
        limit = self.allowed_memory_maximum if self.set_fraction else self.capacity
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
        pt = pool.pt
        cur, freed = self.cur, self.freed
        history = self.history
        if not _completing:
            if not block.allocated:
                raise ValueError(f"{block!r} is not allocated (double free?)")
            block.allocated = False
            size = block.size
            cur[0] -= 1
            cur[pt] -= 1
            freed[0] += 1
            freed[pt] += 1
            i = _AB + pt
            cur[_AB] -= size
            cur[i] -= size
            freed[_AB] += size
            freed[i] += size
            if history is not None:
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
        if history is not None:
            self._record("free_completed", block.addr, block.requested, block.stream)
        original_size = block.size
        requested = block.requested
        net_blocks = 0
        net_bytes = 0
        mapped = block.mapped
        blocks = pool.blocks
        prev = block.prev
        if prev is not None and not prev.allocated and not prev.pending and prev.mapped == mapped:
            # try_merge_blocks(block, prev), written out for mapped blocks
            net_blocks -= 1
            net_bytes -= prev.size
            if mapped:
                key = (prev.size << _ADDR_BITS) | prev.addr
                sl = pool.free[prev.stream]
                del sl[bisect_left(sl, key)]
                del blocks[key]
            else:
                self._unmapped_erase(prev)
            block.addr = prev.addr
            block.size += prev.size
            pp = block.prev = prev.prev
            if pp is not None:
                pp.next = block
        nxt = block.next
        if nxt is not None and not nxt.allocated and not nxt.pending and nxt.mapped == mapped:
            net_blocks -= 1
            net_bytes -= nxt.size
            if mapped:
                key = (nxt.size << _ADDR_BITS) | nxt.addr
                sl = pool.free[nxt.stream]
                del sl[bisect_left(sl, key)]
                del blocks[key]
            else:
                self._unmapped_erase(nxt)
            block.size += nxt.size
            nn = block.next = nxt.next
            if nn is not None:
                nn.prev = block
        self.active_blocks.discard(block)
        # pool.insert(block), written out
        key = (block.size << _ADDR_BITS) | block.addr
        sl = pool.free.get(block.stream)
        if sl is None:
            sl = pool.free[block.stream] = []
        insort(sl, key)
        blocks[key] = block
        block.gc_base = pool.get_free_blocks_call_count
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        peak = self.peak
        if block.expandable is None:
            if net_blocks > 0:
                v = cur[_IS] + net_blocks
                cur[_IS] = v
                if v > peak[_IS]:
                    peak[_IS] = v
                i = _IS + pt
                v = cur[i] + net_blocks
                cur[i] = v
                if v > peak[i]:
                    peak[i] = v
            elif net_blocks < 0:
                cur[_IS] += net_blocks
                cur[_IS + pt] += net_blocks
                freed[_IS] -= net_blocks
                freed[_IS + pt] -= net_blocks
            if net_bytes > 0:
                v = cur[_ISB] + net_bytes
                cur[_ISB] = v
                if v > peak[_ISB]:
                    peak[_ISB] = v
                i = _ISB + pt
                v = cur[i] + net_bytes
                cur[i] = v
                if v > peak[i]:
                    peak[i] = v
            elif net_bytes < 0:
                cur[_ISB] += net_bytes
                cur[_ISB + pt] += net_bytes
                freed[_ISB] -= net_bytes
                freed[_ISB + pt] -= net_bytes
        i = _RB + pt
        cur[_RB] -= requested
        cur[i] -= requested
        freed[_RB] += requested
        freed[i] += requested
        if not self._active_mirrored:
            self._decrease(ACTIVE, pt, 1)
            self._decrease(ACTIVE_BYTES, pt, original_size)

    def _unmirror_active(self, block: Block) -> None:
        """Active stats equal allocation stats until a free is first deferred; split them."""
        self._active_mirrored = False
        for src, dst in ((ALLOCATION, ACTIVE), (ALLOCATED_BYTES, ACTIVE_BYTES)):
            for t in range(3):
                for arr in (self.cur, self.peak, self.freed, self.base):
                    arr[dst * 3 + t] = arr[src * 3 + t]
        pt = 1 if block.pool.is_small else 2
        # The block being deferred is still active: undo its share of the decrease.
        for stat, amount in ((ACTIVE, 1), (ACTIVE_BYTES, block.size)):
            for i in (stat * 3, stat * 3 + pt):
                self.cur[i] += amount
                self.freed[i] -= amount

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
        if self.history is not None:
            self._record("segment_free", block.addr, block.size, block.stream)
        self._device_free(block.addr, block.size)
        self.total_allocated_memory -= block.size
        pt = 1 if block.pool.is_small else 2
        self._decrease(SEGMENT, pt, 1)
        self._decrease(RESERVED_BYTES, pt, block.size)
        if block.size >= self._max_split:
            self.oversize_segments[0] -= 1
        block.pool.erase(block)
        del self.segments[block.addr]

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
        for pool in (self.large_blocks, self.small_blocks):
            to_unmap = []
            for block in list(pool):
                if block.expandable is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self.release_block(block)
            for block in to_unmap:
                self.unmap_block(block)
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
        total = self.device_total if self.device_total is not None else (1 << 40)
        pages = (total + total // 8 + page - 1) // page
        vsize = pages * page
        base = self._vas.reserve(vsize)
        es = ExpandableSegment(base, vsize, page, stream, pool, set(), {})
        self.expandable_segments.append(es)
        c = Block(base, vsize, stream, pool)
        c.mapped = False
        c.expandable = es
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
        first = (b.addr - es.base) // es.page_size
        last = (b.addr + size - es.base + es.page_size - 1) // es.page_size
        new_pages = [p for p in range(first, last) if p not in es.mapped_pages]
        nbytes = len(new_pages) * es.page_size
        if self.capacity is not None and self.total_allocated_memory + nbytes > self.capacity:
            return False
        es.mapped_pages.update(new_pages)
        mapped_size = (last - first) * es.page_size
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
        self._increase(RESERVED_BYTES, 1 if pool.is_small else 2, mapped_size)
        self.num_device_alloc += 1
        if self.history is not None:
            self._record("segment_map", b.addr, mapped_size, b.stream)
        return True

    def try_allocate_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        c = self._find_expandable_block(pool, size, stream)
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
        self._decrease(RESERVED_BYTES, 1 if pool.is_small else 2, nbytes)
        self.num_device_free += 1
        if self.history is not None:
            self._record("segment_unmap", start, nbytes, block.stream)

    # ------------------------------------------------------------------ state
    def add_segment(self, addr: int, size: int, stream: int, is_small: bool,
                    blocks: list[tuple[int, int, bool, int]]) -> list[Block]:
        """Install an existing segment (used to rebuild a recorded starting state).

        ``blocks``: (addr, size, allocated, requested) covering the segment in address
        order. Returns the Block objects, allocated ones to be freed later by the caller.
        """
        pool = self.small_blocks if is_small else self.large_blocks
        pt = 1 if is_small else 2
        if sum(b[1] for b in blocks) != size or (blocks and blocks[0][0] != addr):
            raise ValueError(f"blocks do not tile segment 0x{addr:x} of {size} bytes")
        self.segments[addr] = Segment(addr, size, stream, is_small)
        self.total_allocated_memory += size
        self._increase(SEGMENT, pt, 1)
        self._increase(RESERVED_BYTES, pt, size)
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
        split = len(out) > 1
        for b, (_, bsize, allocated, requested) in zip(out, blocks):
            if allocated:
                b.allocated = True
                b.requested = requested
                self.active_blocks.add(b)
                for stat, amount in ((ALLOCATION, 1), (ALLOCATED_BYTES, bsize), (ACTIVE, 1),
                                     (ACTIVE_BYTES, bsize), (REQUESTED_BYTES, requested)):
                    self._increase(stat, pt, amount)
                if bsize >= self._max_split:
                    self._bump(self.oversize_allocations, 1)
            else:
                pool.insert(b)
                if split:
                    self._increase(INACTIVE_SPLIT, pt, 1)
                    self._increase(INACTIVE_SPLIT_BYTES, pt, bsize)
        return out

    def iter_segments(self) -> Iterator[tuple[int, int, int, bool, bool, list[Block]]]:
        """(addr, total_size, stream, is_small, is_expandable, blocks) for every segment.

        Expandable segments are reported as one segment per contiguous mapped range,
        as PyTorch's snapshot does.
        """
        blocks: list[Block] = list(self.active_blocks)  # includes frees pending on streams
        for pool in (self.small_blocks, self.large_blocks):
            blocks.extend(pool.blocks.values())
        blocks.sort(key=lambda b: b.addr)
        by_seg: dict[int, list[Block]] = {a: [] for a in self.segments}
        seg_addrs = sorted(self.segments)
        exp_blocks: list[Block] = []
        for b in blocks:
            if b.expandable is not None:
                exp_blocks.append(b)
                continue
            j = bisect_right(seg_addrs, b.addr) - 1
            by_seg[seg_addrs[j]].append(b)
        for a in seg_addrs:
            s = self.segments[a]
            yield a, s.size, s.stream, s.is_small, False, by_seg[a]
        run: list[Block] = []
        for b in exp_blocks + [None]:  # type: ignore[list-item]
            if run and (b is None or run[-1].next is not b or b.expandable is not run[-1].expandable):
                es = run[0].expandable
                yield run[0].addr, sum(x.size for x in run), es.stream, es.pool.is_small, True, run  # type: ignore[union-attr]
                run = []
            if b is not None:
                run.append(b)

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
        for t in range(3):
            assert self.cur[ALLOCATED_BYTES * 3 + t] == alloc_bytes[t], "allocated_bytes != recount"
            assert self.cur[RESERVED_BYTES * 3 + t] == reserved[t], "reserved_bytes != recount"
        assert self.memory_allocated() <= self.memory_reserved()
        assert self.total_allocated_memory == self.memory_reserved()


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
