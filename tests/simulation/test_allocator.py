"""The caching-allocator rules, each with a hand-computed expectation.

Sizes in comments: MiB = 1 << 20. Constants from CUDACachingAllocator.cpp: kMinBlockSize
512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB,
kRoundLarge 2 MiB.
"""

import pytest

from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator, OutOfMemoryError

MiB = 1 << 20


def make(conf: str = "", **kw) -> CachingAllocator:
    return CachingAllocator(parse_alloc_conf(conf), **kw)


@pytest.mark.parametrize(
    "size, expected",
    [(1, 512), (512, 512), (513, 1024), (MiB + 1, MiB + 512), (0, 512)],
)
def test_round_size_default(size, expected):
    assert make().round_size(size) == expected


def test_round_size_power2_divisions():
    a = make("roundup_power2_divisions:4")
    # 1.2 MiB lies in [1 MiB, 2 MiB): four steps of 256 KiB -> 1.25 MiB
    assert a.round_size(int(1.2 * MiB)) == 1280 * 1024
    assert a.round_size(2 * MiB) == 2 * MiB  # powers of two stay
    # [2 MiB, 4 MiB) in steps of 512 KiB: 3 MiB + 1 -> 3.5 MiB
    assert a.round_size(3 * MiB + 1) == 3 * MiB + 512 * 1024
    assert a.round_size(3 * MiB) == 3 * MiB  # already on a step
    # sizes <= 512 * divisions keep plain 512-byte rounding
    assert a.round_size(2000) == 2048
    assert make("roundup_power2_divisions:8").round_size(5 * MiB + 3) == 5 * MiB + 512 * 1024


@pytest.mark.parametrize(
    "size, segment",
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
     (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB)],
)
def test_segment_sizes(size, segment):
    assert CachingAllocator.get_allocation_size(size) == segment


def test_small_pool_packs_a_2mib_segment():
    a = make()
    b1, b2 = a.malloc(100), a.malloc(600)
    assert (b1.size, b2.size) == (512, 1024)
    assert b2.addr == b1.addr + 512
    assert a.memory_reserved() == 2 * MiB
    assert a.memory_allocated() == 1536
    assert a.stat("requested_bytes") == 700
    assert a.stat("segment", "small_pool") == 1
    assert a.num_device_alloc == 1


def test_large_split_and_unsplit_remainder():
    a = make()
    b1 = a.malloc(5 * MiB)  # new 20 MiB segment, split: 15 MiB remains
    assert a.memory_reserved() == 20 * MiB and b1.size == 5 * MiB
    b2 = a.malloc(14 * MiB + 512 * 1024)  # 15 MiB left; remainder 0.5 MiB <= 1 MiB: not split
    assert b2.addr == b1.addr + 5 * MiB
    assert b2.size == 15 * MiB  # the whole block, counted as allocated
    assert a.memory_allocated() == 20 * MiB
    assert a.stat("requested_bytes") == 19 * MiB + 512 * 1024
    assert a.num_device_alloc == 1


def test_best_fit_takes_smallest_block_then_lowest_address():
    a = make()
    big = a.malloc(30 * MiB)  # its own 30 MiB segment
    s1 = a.malloc(12 * MiB)  # 12 MiB segment
    s2 = a.malloc(12 * MiB)  # another 12 MiB segment
    a.free(big)
    a.free(s1)
    a.free(s2)
    b = a.malloc(11 * MiB)  # fits 12 MiB blocks (best) before 30 MiB; lower address first
    assert b.addr == min(s1.addr, s2.addr)
    assert a.num_device_alloc == 3


def test_merge_on_free_restores_the_whole_segment():
    a = make()
    x, y, z = a.malloc(4 * MiB), a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.free(x)
    a.free(z)  # merges with the 8 MiB tail
    assert a.stat("inactive_split") == 2
    a.free(y)  # merges both sides: one 20 MiB block
    assert a.stat("inactive_split") == 0 and a.stat("inactive_split_bytes") == 0
    start = x.addr
    w = a.malloc(18 * MiB)  # the merged 20 MiB block; remainder 2 MiB > 1 MiB: split
    assert w.addr == start and w.size == 18 * MiB
    assert a.stat("inactive_split_bytes") == 2 * MiB
    a.check_invariants()


def test_split_needs_remainder_strictly_over_1mib():
    a = make()
    b = a.malloc(19 * MiB)  # 20 MiB segment, remainder exactly 1 MiB: not split
    assert b.size == 20 * MiB
    a.free(b)
    c = a.malloc(19 * MiB - 512)  # remainder 1 MiB + 512 > 1 MiB: split
    assert c.size == 19 * MiB - 512


def test_empty_cache_frees_only_whole_free_segments():
    a = make()
    p = a.malloc(30 * MiB)
    q = a.malloc(4 * MiB)  # in a 20 MiB segment
    r = a.malloc(4 * MiB)  # same segment
    a.free(p)
    a.free(q)
    a.empty_cache()  # the 30 MiB segment goes; the 20 MiB one is partly used
    assert a.memory_reserved() == 20 * MiB
    assert a.num_device_free == 1
    a.free(r)
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.max_memory_reserved() == 54 * MiB - 4 * MiB


def test_oom_path_releases_cache_then_retries():
    a = make(capacity=100 * MiB)
    x = a.malloc(50 * MiB)
    a.free(x)  # 50 MiB cached
    y = a.malloc(70 * MiB)  # cudaMalloc(70) fails (50 + 70 > 100): free the cache, retry
    assert y.size == 70 * MiB
    assert a.num_alloc_retries == 1 and a.num_device_free == 1
    assert a.memory_reserved() == 70 * MiB and a.max_memory_reserved() == 70 * MiB


def test_out_of_memory_raises_and_counts():
    a = make(capacity=100 * MiB)
    a.malloc(60 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(60 * MiB)
    assert a.num_ooms == 1
    assert info.value.requested == 60 * MiB
    assert "Tried to allocate 60.00 MiB" in str(info.value)
    assert a.memory_reserved() == 60 * MiB  # state unchanged
    a.check_invariants()


def test_per_process_memory_fraction():
    a = make(capacity=1000 * MiB, device_total=100 * MiB)
    a.set_memory_fraction(0.5)  # allowed maximum 50 MiB
    a.malloc(40 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.malloc(12 * MiB)  # 40 + 12 > 50
    a.malloc(10 * MiB)  # 40 + 10 = 50 is allowed
    with pytest.raises(ValueError):
        a.set_memory_fraction(1.5)


def test_max_split_size_oversize_rules():
    a = make("max_split_size_mb:40")
    big = a.malloc(100 * MiB)  # oversize block (>= 40 MiB)
    a.free(big)
    small = a.malloc(30 * MiB)  # < max_split may not take an oversize block: new segment
    assert small.addr != big.addr and a.num_device_alloc == 2
    mid = a.malloc(50 * MiB)  # >= max_split, but 100 >= 50 + 20: refused
    assert mid.addr != big.addr and a.num_device_alloc == 3
    near = a.malloc(90 * MiB)  # 100 < 90 + 20: takes it whole, unsplit
    assert near.addr == big.addr and near.size == 100 * MiB
    assert a.memory_stats()["oversize_allocations.current"] == 2  # 50 and 100 MiB blocks
    assert a.memory_stats()["oversize_segments.current"] == 2


def test_max_split_never_splits_oversize_blocks():
    a = make("max_split_size_mb:40")
    b = a.malloc(60 * MiB)
    assert b.size == 60 * MiB and not b.is_split()
    a.free(b)
    c = a.malloc(45 * MiB)  # 60 < 45 + 20: takes the 60 MiB block, no split
    assert c.addr == b.addr and c.size == 60 * MiB


def test_release_available_cached_blocks_with_max_split():
    a = make("max_split_size_mb:40", capacity=150 * MiB)
    big = a.malloc(100 * MiB)
    a.free(big)
    a.malloc(30 * MiB)  # cannot use the oversize block; 130 MiB reserved
    c = a.malloc(30 * MiB)  # 160 > 150: release the cached oversize block first, no full retry
    assert a.num_alloc_retries == 0
    assert a.num_device_free == 1
    assert a.memory_reserved() == 60 * MiB and c.size == 30 * MiB


def test_max_non_split_rounding():
    a = make("max_split_size_mb:40,max_non_split_rounding_mb:100")
    big = a.malloc(100 * MiB)
    a.free(big)
    b = a.malloc(50 * MiB)  # 100 < 50 + 100: allowed now
    assert b.addr == big.addr and b.size == 100 * MiB


def test_garbage_collection_frees_old_cached_blocks():
    a = make("garbage_collection_threshold:0.5", device_total=200 * MiB, capacity=200 * MiB)
    a.set_memory_fraction(1.0)  # GC is active only with a fraction set
    x = a.malloc(60 * MiB)
    y = a.malloc(60 * MiB)
    a.free(x)  # cached; reserved 120 MiB > threshold 100 MiB
    z = a.malloc(80 * MiB)  # no fit: GC frees x's segment (the only free one), then cudaMalloc
    assert a.num_device_free == 1
    assert a.memory_reserved() == 140 * MiB
    assert y.allocated and z.size == 80 * MiB


def test_gc_inactive_without_fraction():
    a = make("garbage_collection_threshold:0.5", device_total=200 * MiB, capacity=200 * MiB)
    x = a.malloc(60 * MiB)
    a.malloc(60 * MiB)
    a.free(x)
    a.malloc(80 * MiB)
    assert a.num_device_free == 0


def test_expandable_segments_map_pages_on_demand():
    a = make("expandable_segments:True")
    blocks = [a.malloc(16 * MiB) for _ in range(8)]
    # 8 live 16 MiB tensors map 7 x 20 MiB pages (allocator-spec.md's example)
    assert a.memory_reserved() == 140 * MiB
    assert a.memory_allocated() == 128 * MiB
    assert [b.addr - blocks[0].addr for b in blocks] == [i * 16 * MiB for i in range(8)]
    a.check_invariants()
    for b in blocks[4:]:
        a.free(b)
    a.empty_cache()  # unmaps whole free pages only: 64..140 MiB -> pages 4..6 (80..140 MiB)
    assert a.memory_reserved() == 80 * MiB
    for b in blocks[:4]:
        a.free(b)
    a.empty_cache()
    assert a.memory_reserved() == 0
    a.check_invariants()


def test_expandable_small_pool_pages_are_2mib():
    a = make("expandable_segments:True")
    for _ in range(5):
        a.malloc(600 * 1024)  # 600 KiB each, 3 MiB in total -> two 2 MiB pages
    assert a.memory_reserved() == 4 * MiB


def test_expandable_oom_when_pages_do_not_fit():
    a = make("expandable_segments:True", capacity=100 * MiB)
    a.malloc(70 * MiB)  # 4 pages = 80 MiB, 10 MiB of the last one free
    with pytest.raises(OutOfMemoryError):
        a.malloc(31 * MiB)  # 10 MiB free + 21 MiB more = 2 pages: 120 MiB > 100 MiB
    assert a.memory_reserved() == 80 * MiB
    a.malloc(30 * MiB)  # 10 MiB free + 1 page: exactly 100 MiB
    assert a.memory_reserved() == 100 * MiB


@pytest.mark.parametrize("capacity", [None, 200 * MiB])
def test_expandable_request_beyond_a_whole_segment_is_out_of_memory(capacity):
    # A segment's address space is 1 1/8 of the device: a larger request cannot be mapped
    # anywhere (issue #36: this was an AssertionError, "xmem failed" instead of "does not fit").
    a = make("expandable_segments:True", capacity=capacity, device_total=100 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.malloc(130 * MiB)
    assert a.memory_reserved() == 0
    a.malloc(110 * MiB)  # within one segment's address space: maps as before
    assert a.memory_reserved() == 120 * MiB


def test_streams_have_separate_pools():
    a = make()
    b1 = a.malloc(5 * MiB, stream=1)
    b1_addr = b1.addr
    a.free(b1)
    b0 = a.malloc(5 * MiB, stream=0)  # stream 1's cached block is not reused
    assert a.num_device_alloc == 2 and b0.stream == 0
    b1b = a.malloc(5 * MiB, stream=1)
    assert b1b.addr == b1_addr


def test_record_stream_defers_the_free():
    a = make()
    b = a.malloc(5 * MiB)
    a.record_stream(b, 7)
    a.free(b)
    assert a.memory_allocated() == 0  # allocated drops at once
    assert a.stat("active_bytes") == 5 * MiB  # active until stream 7's event completes
    c = a.malloc(5 * MiB)  # the deferred block is not available yet
    assert c.addr == b.addr + 5 * MiB
    a.synchronize()
    assert a.stat("active_bytes") == 5 * MiB  # only c now
    d = a.malloc(5 * MiB)
    assert d.addr == b.addr  # back in the pool after synchronisation
    a.check_invariants()


def test_stats_keys_and_peaks():
    a = make()
    x = a.malloc(3 * MiB)
    a.malloc(700)
    a.free(x)
    s = a.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.small_pool.freed",
                "reserved_bytes.large_pool.current", "active_bytes.all.allocated", "requested_bytes.all.peak",
                "inactive_split_bytes.all.current", "segment.all.peak", "num_alloc_retries", "num_ooms",
                "num_device_alloc", "num_device_free"):
        assert key in s
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 1024
    assert s["allocated_bytes.all.current"] == 1024
    assert s["allocated_bytes.large_pool.allocated"] == 3 * MiB
    assert s["allocated_bytes.large_pool.freed"] == 3 * MiB
    assert s["active_bytes.all.peak"] == 3 * MiB + 1024
    assert s["requested_bytes.all.peak"] == 3 * MiB + 700
    assert s["reserved_bytes.all.current"] == 22 * MiB
    a.reset_peak_stats()
    assert a.max_memory_allocated() == 1024
    a.reset_accumulated_stats()
    assert a.memory_stats()["allocated_bytes.all.allocated"] == 0
    a.malloc(512)
    assert a.memory_stats()["allocated_bytes.all.allocated"] == 512


def test_cuda_malloc_async_backend_is_refused():
    with pytest.raises(ValueError, match="cudaMallocAsync"):
        make("backend:cudaMallocAsync")
