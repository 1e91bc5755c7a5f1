"""Private memory pools (CUDA graphs, ``MemPool``, ``mode="reduce-overhead"``), as
``beginAllocateToPool`` / ``endAllocateToPool`` / ``releasePool`` and ``get_pool`` in
CUDACachingAllocator.cpp use them. MiB = 1 << 20."""

import pytest

from xmem_engine import trace as tr
from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator, OutOfMemoryError
from xmem_engine.simulation.simulate import simulate
from xmem_engine.simulation.snapshot import make_snapshot

MiB = 1 << 20
P = (0, 1)


def make(conf: str = "", **kw) -> CachingAllocator:
    return CachingAllocator(parse_alloc_conf(conf), **kw)


def test_a_pool_and_the_global_pools_never_serve_each_other():
    a = make()
    x = a.malloc(30 * MiB)
    a.free(x)  # 30 MiB cached in the global large pool
    a.begin_allocate_to_pool(P)
    y = a.malloc(30 * MiB)  # not the cached block: the pool's own segment
    assert a.memory_reserved() == 60 * MiB and y.pool.owner is not None
    a.free(y)
    a.end_allocate_to_pool(P)
    z = a.malloc(30 * MiB)  # the global cached block again, not the pool's
    assert z.addr == x.addr and a.memory_reserved() == 60 * MiB
    a.check_invariants()


def test_a_pool_reuses_its_own_blocks_across_captures():
    a = make()
    for _ in range(3):  # a graph replayed as a re-run: the same requests land on the same blocks
        a.begin_allocate_to_pool(P)
        bs = [a.malloc(s) for s in (4 * MiB, 512, 12 * MiB)]
        for b in bs:
            a.free(b)
        a.end_allocate_to_pool(P)
    # 2 MiB small segment + 20 MiB (4 MiB rounds to a 20 MiB segment, split for 12 MiB)
    assert a.memory_reserved() == 22 * MiB and a.num_device_alloc == 2
    a.check_invariants()


def test_stats_count_a_pool_in_its_size_class():
    a = make()
    a.begin_allocate_to_pool(P)
    a.malloc(512)
    a.malloc(30 * MiB)
    assert a.stat("reserved_bytes", "small_pool") == 2 * MiB
    assert a.stat("reserved_bytes", "large_pool") == 30 * MiB
    assert a.stat("allocated_bytes", "all") == 512 + 30 * MiB
    assert a.max_memory_allocated() == 512 + 30 * MiB


def test_empty_cache_keeps_a_pool_until_released():
    a = make()
    a.begin_allocate_to_pool(P)
    a.free(a.malloc(30 * MiB))
    a.end_allocate_to_pool(P)
    a.empty_cache()
    assert a.memory_reserved() == 30 * MiB  # the graph still owns it
    a.release_pool(P)
    assert a.memory_reserved() == 30 * MiB  # released: freed at the next empty_cache
    a.empty_cache()
    assert a.memory_reserved() == 0 and P not in a.graph_pools


def test_a_released_pool_with_live_blocks_keeps_them():
    a = make()
    a.begin_allocate_to_pool(P)
    out = a.malloc(30 * MiB)  # a graph's output, still held
    a.end_allocate_to_pool(P)
    a.release_pool(P)
    a.empty_cache()
    assert a.memory_reserved() == 30 * MiB and P in a.graph_pools
    a.free(out)  # freed into the (released) pool's cache, gone at the next empty_cache
    a.empty_cache()
    assert a.memory_reserved() == 0 and P not in a.graph_pools


def test_use_count_counts_each_user():
    a = make()
    for _ in range(2):  # two graphs capture into one pool (graph_pool_handle shared)
        a.begin_allocate_to_pool(P)
        a.free(a.malloc(30 * MiB))
        a.end_allocate_to_pool(P)
    a.release_pool(P)
    a.empty_cache()
    assert a.memory_reserved() == 30 * MiB  # one graph left
    a.release_pool(P)
    a.empty_cache()
    assert a.memory_reserved() == 0


def test_only_the_filtered_streams_go_to_the_pool():
    a = make()
    a.begin_allocate_to_pool(P, frozenset({7}))
    side = a.malloc(30 * MiB, stream=7)
    main = a.malloc(30 * MiB, stream=0)
    assert side.pool.owner is not None and main.pool.owner is None


def test_no_release_and_retry_while_allocating_to_a_pool():
    """A capture cannot synchronise: cudaMalloc failing inside it is an OOM even where
    freeing the global cache would have made room."""
    a = make(capacity=50 * MiB)
    a.free(a.malloc(30 * MiB))  # 30 MiB cached globally
    a.begin_allocate_to_pool(P)
    with pytest.raises(OutOfMemoryError):
        a.malloc(30 * MiB)
    a.end_allocate_to_pool(P)
    a.malloc(40 * MiB)  # outside it, the cache is freed and the request retried
    assert a.num_alloc_retries == 1


def test_private_pools_take_plain_segments_with_expandable_segments():
    a = make("expandable_segments:True")
    a.begin_allocate_to_pool(P)
    b = a.malloc(30 * MiB)
    assert b.expandable is None and a.num_device_alloc == 1
    a.end_allocate_to_pool(P)
    c = a.malloc(30 * MiB)
    assert c.expandable is not None
    a.check_invariants()


def test_errors_name_the_pool():
    a = make()
    a.begin_allocate_to_pool(P)
    with pytest.raises(ValueError, match="already allocating"):
        a.begin_allocate_to_pool(P)
    with pytest.raises(ValueError, match="no private pool"):
        a.release_pool((0, 9))
    with pytest.raises(ValueError, match="global"):
        a.begin_allocate_to_pool((0, 0))


def test_snapshot_names_each_segments_pool():
    a = make()
    a.malloc(30 * MiB)
    a.begin_allocate_to_pool(P)
    a.malloc(30 * MiB)
    ids = sorted(s["segment_pool_id"] for s in make_snapshot(a)["segments"])
    assert ids == [(0, 0), P]


def _ev(kind, **kw):
    return tr.TraceEvent(kind, **kw)


def test_trace_pool_events_replay_through_simulate():
    events = [
        _ev(tr.ALLOC, id=1, bytes=30 * MiB), _ev(tr.FREE, id=1),
        _ev(tr.POOL_BEGIN, id=1), _ev(tr.ALLOC, id=2, bytes=30 * MiB), _ev(tr.FREE, id=2), _ev(tr.POOL_END, id=1),
        _ev(tr.ALLOC, id=3, bytes=30 * MiB),  # the global block again
        _ev(tr.EMPTY_CACHE),
    ]
    r = simulate(events)
    assert r.peak_reserved_bytes == 60 * MiB and r.final_reserved_bytes == 60 * MiB
    r = simulate(events[:-1] + [_ev(tr.FREE, id=3), _ev(tr.POOL_RELEASE, id=1), _ev(tr.EMPTY_CACHE)])
    assert r.final_reserved_bytes == 0


def test_trace_pool_events_round_trip_and_are_checked(tmp_path):
    t = tr.Trace(events=[_ev(tr.POOL_BEGIN, id=2, streams=(3,)), _ev(tr.POOL_END, id=2)])
    t.write_jsonl(tmp_path / "t.jsonl")
    assert tr.Trace.read_jsonl(tmp_path / "t.jsonl").events == t.events
    with pytest.raises(ValueError, match="private pool number"):
        tr.TraceEvent.from_json({"kind": "pool_begin", "id": 0})
