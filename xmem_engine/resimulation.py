"""What an estimate's simulated run gives when it is run again: the least memory the step runs
in, and the run as a memory snapshot. Both re-simulate the trace an :class:`Estimate` carries
(no new trace); ``Estimate.resimulate`` (another GPU or allocator setting) is the estimate's own.
"""

from __future__ import annotations

from xmem_engine.estimate import Estimate, allocator_config
from xmem_engine.simulation.alloc_conf import AllocatorConfig
from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.simulation.simulate import simulate


def replay_inputs(est: Estimate, alloc_conf: str | AllocatorConfig | None) -> tuple[list, AllocatorConfig]:
    """What re-simulating ``est`` needs: its trace as run on its GPU, and the allocator
    settings (``alloc_conf``, else the estimate's own)."""
    if est.simulated_events is None:
        raise ValueError("this estimate carries no trace to re-simulate")
    return est.simulated_events, allocator_config(alloc_conf if alloc_conf is not None else est.alloc_conf)


SEGMENT_GRANULE = 2 << 20  # cudaMalloc sizes the allocator asks for are multiples of 2 MiB


def minimum_memory(est: Estimate, alloc_conf: str | AllocatorConfig | None = None) -> int:
    """The least device memory the step runs in: context, libraries, and the smallest
    allocator limit under which the simulated run completes.

    The natural peak (``peak_device_bytes``) is what nvidia-smi shows when memory is plenty:
    it includes cached blocks the step never needed at once. On a device (or under
    ``set_per_process_memory_fraction``) with less, the caching allocator frees its cached
    segments and retries when cudaMalloc fails, so the step can still run. This bisects the
    limit, in 2 MiB steps, between the allocated peak and the reserved peak: about
    log2((reserved - allocated) / 2 MiB) re-simulations. What a scheduler can pack to; it
    leaves nothing for run-to-run variation.
    """
    events, cfg = replay_inputs(est, alloc_conf)

    def runs(limit: int) -> bool:
        return not simulate(events, allocator=CachingAllocator(
            cfg, capacity=limit, device_total=est.capacity_bytes)).oom

    granule = SEGMENT_GRANULE
    lo = est.peak_allocated_bytes // granule  # in granules: at most lo does not run...
    hi = -(-est.peak_reserved_bytes // granule)  # ...and hi does (the unlimited run's peak)
    if lo >= hi or runs(lo * granule):
        hi = lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runs(mid * granule):
            hi = mid
        else:
            lo = mid
    return est.context_bytes + est.outside_allocator_bytes + hi * granule


def simulated_snapshot(est: Estimate, alloc_conf: str | AllocatorConfig | None = None) -> dict:
    """The estimate's simulated run as a ``torch.cuda.memory._snapshot()`` dict (for
    ``python -m torch.cuda._memory_viz`` or pytorch.org/memory_viz)."""
    from xmem_engine.simulation.snapshot import make_snapshot

    events, cfg = replay_inputs(est, alloc_conf)
    history: list[dict] = []
    alloc = CachingAllocator(cfg, capacity=est.allocator_limit_bytes, device_total=est.capacity_bytes,
                             history=history)
    simulate(events, allocator=alloc)
    return make_snapshot(alloc, history)
