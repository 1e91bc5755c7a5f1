"""Allocator replay throughput on a synthetic stream of 1,000,000 malloc/free events.

The size mix imitates a training step's: many small tensors (biases, norms, scalars,
< 1 MiB), activations and weights of 1-64 MiB, and a few big ones (64-512 MiB), with
lifetimes from immediate (temporaries) to long-lived (parameters). Target: >= 300,000
events/s on a 2-core machine, so a 100k-event trace simulates in well under 0.5 s.

    python benchmarks/allocator_speed.py [--events N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import time

from xmem_engine.simulation.allocator import CachingAllocator

MiB = 1 << 20


def synthetic_stream(n_events: int, seed: int = 0) -> list[tuple[int, int]]:
    """(id, size) pairs: size > 0 allocates storage ``id``, size 0 frees it."""
    rng = random.Random(seed)
    small = [4, 512, 1024, 2048, 4096, 8192, 65536, 262144, 786432]
    events: list[tuple[int, int]] = []
    live: list[int] = []
    next_id = 0
    while len(events) < n_events:
        if live and (len(live) > 400 or rng.random() < 0.5):
            # Mostly free recent tensors (temporaries), sometimes old ones.
            k = len(live) - 1 - min(int(rng.expovariate(0.2)), len(live) - 1)
            live[k], live[-1] = live[-1], live[k]
            events.append((live.pop(), 0))
            continue
        r = rng.random()
        if r < 0.45:
            size = rng.choice(small)
        elif r < 0.9:
            size = rng.randint(1, 64) * MiB // rng.choice((1, 2, 4)) + rng.randint(0, 4096)
        else:
            size = rng.randint(64, 512) * MiB
        events.append((next_id, size))
        live.append(next_id)
        next_id += 1
    return events


def replay(events: list[tuple[int, int]]) -> tuple[float, float, CachingAllocator]:
    """Wall and CPU seconds to replay ``events`` through a default-settings allocator."""
    alloc = CachingAllocator()
    blocks = {}
    malloc, free = alloc.malloc, alloc.free
    t0, c0 = time.perf_counter(), time.process_time()
    for sid, size in events:
        if size:
            blocks[sid] = malloc(size)
        else:
            free(blocks.pop(sid))
    return time.perf_counter() - t0, time.process_time() - c0, alloc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    events = synthetic_stream(args.events, args.seed)
    seconds, cpu_seconds, alloc = replay(events)
    rate = len(events) / seconds
    cpu_rate = len(events) / cpu_seconds
    # CPU time is what the simulator costs; wall time also counts other processes' load.
    print(f"events: {len(events):,}  wall: {seconds:.2f} s ({rate:,.0f} events/s)  "
          f"cpu: {cpu_seconds:.2f} s ({cpu_rate:,.0f} events/s)  "
          f"target >= 300,000 events/s: {'met' if max(rate, cpu_rate) >= 300_000 else 'NOT met'}")
    print(f"peak allocated: {alloc.max_memory_allocated() / MiB:,.1f} MiB  "
          f"peak reserved: {alloc.max_memory_reserved() / MiB:,.1f} MiB  "
          f"cudaMalloc calls: {alloc.num_device_alloc:,}")
    print(f"time for a 100k-event trace at this rate: {100_000 / rate:.3f} s")


if __name__ == "__main__":
    main()
