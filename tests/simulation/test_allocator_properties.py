"""Property tests: random request streams never break the allocator's invariants.

After every step: blocks tile their segments with no overlap, allocated <= reserved, in a
non-expandable large segment no two free blocks are adjacent and every split-off free
block is > 1 MiB, and the byte statistics equal a recount from the blocks.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xmem_engine.simulation.alloc_conf import parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator, OutOfMemoryError

MiB = 1 << 20

sizes = st.one_of(
    st.integers(1, 4096),
    st.integers(4096, MiB + 4096),
    st.integers(MiB, 64 * MiB),
    st.integers(64 * MiB, 300 * MiB),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.sampled_from([0, 0, 0, 1])),
        st.tuples(st.just("free"), st.integers(0, 10_000), st.just(0)),
        st.tuples(st.just("record_stream"), st.integers(0, 10_000), st.sampled_from([1, 2])),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
        st.tuples(st.just("synchronize"), st.just(0), st.just(0)),
    ),
    max_size=120,
)
CONFIGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:[1:2,64:4,>:8]",
    "garbage_collection_threshold:0.6,max_split_size_mb:100",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=st.sampled_from(CONFIGS), program=ops, capacity=st.sampled_from([None, 600 * MiB]))
def test_invariants_hold_after_every_step(conf, program, capacity):
    a = CachingAllocator(parse_alloc_conf(conf), capacity=capacity, device_total=600 * MiB)
    if "garbage" in conf:
        a.set_memory_fraction(0.9)
    live = []
    for op, x, y in program:
        if op == "malloc":
            try:
                live.append(a.malloc(x, stream=y))
            except OutOfMemoryError:
                # only a limit can run out: a capacity, or the 0.9 memory fraction of 600 MiB
                assert capacity is not None or "garbage" in conf
        elif op == "free" and live:
            a.free(live.pop(x % len(live)))
        elif op == "record_stream" and live:
            a.record_stream(live[x % len(live)], y)
        elif op == "empty_cache":
            a.empty_cache()
        elif op == "synchronize":
            a.synchronize()
        a.check_invariants()
        assert sum(b.size for b in live) == a.memory_allocated()
        # requested bytes drop when a free completes (pending frees still count)
        assert sum(b.requested for b in live + a.pending_frees) == a.stat("requested_bytes")
        assert a.max_memory_allocated() <= a.max_memory_reserved() or a.max_memory_reserved() >= a.memory_reserved()
        if capacity is not None:
            assert a.memory_reserved() <= capacity
        if "garbage" in conf:
            assert a.memory_reserved() <= int(0.9 * 600 * MiB)
    for b in live:
        a.free(b)
    a.empty_cache()
    assert a.memory_allocated() == 0
    if not a.config.expandable_segments:
        assert a.memory_reserved() == 0  # every segment is whole and free again
