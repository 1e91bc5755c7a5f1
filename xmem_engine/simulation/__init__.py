"""The simulation wing: PyTorch's CUDA caching allocator, replayed on the CPU.

``docs/allocator.md`` describes the allocator's rules, with the C++ names and the method of
:class:`~xmem_engine.simulation.allocator.CachingAllocator` that implements each.

``allocator.py``   the caching allocator: pools, rounding, best fit, splitting, merging,
                   out-of-memory retries, streams, expandable segments, statistics
``alloc_conf.py``  ``PYTORCH_CUDA_ALLOC_CONF`` parsed into an :class:`AllocatorConfig`
``simulate.py``    a trace's events through the allocator: peaks, timeline, what is live
                   at the peak, whether and where the run runs out of memory
``snapshot.py``    ``torch.cuda.memory._snapshot()`` dicts: read safely, and made from a
                   simulated run (for PyTorch's memory viewer)
``replay.py``      a real GPU recording replayed request by request (``xmem replay --check``)

It imports nothing of the tracing wing: it reads plain events (``xmem_engine/trace.py``).
"""

from xmem_engine.simulation.alloc_conf import AllocatorConfig, parse_alloc_conf
from xmem_engine.simulation.allocator import CachingAllocator, OutOfMemoryError
from xmem_engine.simulation.simulate import SimulationResult, simulate

__all__ = ["AllocatorConfig", "CachingAllocator", "OutOfMemoryError", "SimulationResult", "parse_alloc_conf", "simulate"]
