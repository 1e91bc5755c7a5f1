"""CUDA graphs and memory pools a script makes itself, on the virtual GPU: ``torch.cuda.CUDAGraph``,
``torch.cuda.graph``, ``graph_pool_handle``, ``MemPool`` and ``use_mem_pool``.

Nothing is captured or replayed; what a GPU's caching allocator sees is recorded:

- a capture routes the capturing stream's requests to the graph's private pool (its own, or the
  one ``pool=`` names), which keeps its segments until the graph is reset (``pool_begin``,
  ``pool_end``, ``pool_release`` trace events, the allocator's ``beginAllocateToPool`` /
  ``endAllocateToPool`` / ``releasePool``);
- ``torch.cuda.graph`` synchronises and empties the cache before it captures, on a side stream
  of its own unless given one;
- the ops inside a capture run once, on the virtual GPU, as the capture records them: the
  tensors they make and keep are the graph's static outputs, in the pool;
- ``replay`` allocates nothing;
- ``use_mem_pool(pool)`` routes every request of the block to ``pool``; a ``MemPool`` is one
  user of its pool (deleting it does not free its cached segments here: they stay to the end).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

from xmem_engine.simulation.simulate import pool_key
from xmem_engine.trace import POOL_BEGIN, POOL_END, POOL_RELEASE, TraceEvent


def pool_event(tracer: Any, kind: str, pool: int, streams: tuple[int, ...] = ()) -> None:
    """Record a private-pool event and apply it to the tracer's live allocator."""
    tracer.events.append(TraceEvent(kind, id=pool, streams=streams, phase=tracer.phase, iteration=tracer.iteration))
    key = pool_key(pool)
    if kind == POOL_BEGIN:
        tracer.allocator.begin_allocate_to_pool(key, frozenset(streams) if streams else None)
    elif kind == POOL_END:
        tracer.allocator.end_allocate_to_pool(key)
    else:
        tracer.allocator.release_pool(key)


def _pool_number(pool: Any) -> int:
    """A trace pool number from what the code passes as ``pool=``: a handle, ``g.pool()``, a MemPool."""
    pool = getattr(pool, "id", pool)
    if isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(p, int) for p in pool) and pool[1] >= 1:
        return pool[1]
    raise ValueError(f"pool={pool!r}: expected torch.cuda.graph_pool_handle(), another graph's pool() or a "
                     "MemPool")


class VirtualCudaGraphs:
    """The patched ``torch.cuda`` names (:meth:`functions`) for one trace's virtual GPU."""

    def __init__(self, vc: Any):
        self.vc = vc
        self._numbers = itertools.count(1)
        self.capturing: dict[int, int] = {}  # stream id -> the pool its capture allocates to
        self.side_stream: Any = None  # torch.cuda.graph's default capture stream

    def new_pool(self) -> int:
        return next(self._numbers)

    def functions(self) -> dict[str, Any]:
        graphs = self
        vc = self.vc

        class CUDAGraph:
            """``torch.cuda.CUDAGraph`` on the virtual GPU (module docstring)."""

            def __init__(self, keep_graph: bool = False, **_: Any):
                self._pool: int | None = None
                self._stream: int | None = None
                self.keep_graph = keep_graph

            def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
                if self._stream is not None:
                    raise RuntimeError("CUDAGraph.capture_begin: this graph is already capturing")
                if self._pool is not None:
                    raise RuntimeError("CUDAGraph.capture_begin: this graph was captured already; reset() it first")
                self._pool = graphs.new_pool() if pool is None else _pool_number(pool)
                self._stream = vc.current_stream.stream_id
                graphs.capturing[self._stream] = self._pool
                pool_event(vc.tracer, POOL_BEGIN, self._pool, (self._stream,))

            def capture_end(self) -> None:
                if self._stream is None or self._pool is None:
                    raise RuntimeError("CUDAGraph.capture_end without capture_begin")
                graphs.capturing.pop(self._stream, None)
                self._stream = None
                pool_event(vc.tracer, POOL_END, self._pool)

            def replay(self) -> None:
                if self._pool is None or self._stream is not None:
                    raise RuntimeError("CUDAGraph.replay: the graph has not been captured")

            def instantiate(self) -> None:
                pass

            def reset(self) -> None:
                if self._pool is not None and self._stream is None:
                    pool_event(vc.tracer, POOL_RELEASE, self._pool)
                    self._pool = None

            def pool(self) -> tuple[int, int]:
                if self._pool is None:
                    raise RuntimeError("CUDAGraph.pool: the graph has not been captured")
                return pool_key(self._pool)

            def enable_debug_mode(self) -> None:
                pass

            def debug_dump(self, path: str) -> None:
                pass

        class graph:
            """``torch.cuda.graph``: synchronise, empty the cache, capture on a side stream."""

            default_capture_stream = None

            def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Any = None,
                         capture_error_mode: str = "global", **_: Any):  # (enable_annotations, ...)
                if graphs.side_stream is None:
                    graphs.side_stream = type(vc.default_stream)()  # a VirtualStream
                self.cuda_graph, self.pool = cuda_graph, pool
                self.stream = stream if stream is not None else graphs.side_stream
                self.capture_error_mode = capture_error_mode

            def __enter__(self) -> None:
                vc.tracer.empty_cache()
                self.on_stream = vc.on_stream(self.stream)
                self.on_stream.__enter__()
                self.cuda_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)

            def __exit__(self, *exc: object) -> None:
                try:
                    self.cuda_graph.capture_end()
                finally:
                    self.on_stream.__exit__(*exc)

        class MemPool:
            """``torch.cuda.MemPool``: a private pool of the code's own, one user while it lives."""

            def __init__(self, allocator: Any = None, use_on_oom: bool = False, **_: Any):
                self._n = graphs.new_pool()
                pool_event(vc.tracer, POOL_BEGIN, self._n)  # createOrIncrefPool: made, routed nowhere
                pool_event(vc.tracer, POOL_END, self._n)

            @property
            def id(self) -> tuple[int, int]:
                return pool_key(self._n)

            @property
            def allocator(self) -> None:
                return None

            def use_count(self) -> int:
                pp = vc.tracer.allocator.graph_pools.get(pool_key(self._n))
                return 0 if pp is None else pp.use_count

            def snapshot(self) -> list[dict]:
                from xmem_engine.simulation.snapshot import make_snapshot

                return [s for s in make_snapshot(vc.tracer.allocator)["segments"]
                        if s["segment_pool_id"] == self.id]

        @contextlib.contextmanager
        def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
            """``torch.cuda.use_mem_pool(pool)``: every request of the block comes from ``pool``."""
            n = _pool_number(pool)
            pool_event(vc.tracer, POOL_BEGIN, n)
            try:
                yield
            finally:
                pool_event(vc.tracer, POOL_END, n)
                pool_event(vc.tracer, POOL_RELEASE, n)

        return {
            "CUDAGraph": CUDAGraph,
            "graph": graph,
            "graph_pool_handle": lambda: pool_key(graphs.new_pool()),
            "MemPool": MemPool,
            "use_mem_pool": use_mem_pool,
            "is_current_stream_capturing": lambda: vc.current_stream.stream_id in graphs.capturing,
        }
