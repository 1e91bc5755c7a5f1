"""accelerate's ``find_executable_batch_size`` (``Trainer(auto_find_batch_size=True)``) searches
on the virtual GPU as it searches on the real one.

Why: the decorator runs the training function at a batch size and, on a CUDA out-of-memory
error, frees the cache and tries again at 90 % of it. The virtual GPU has no capacity of its own
(an estimate runs the step whole, to say how much it would need), so the first batch size always
"fitted": a Trainer with ``per_device_train_batch_size=64`` and ``auto_find_batch_size`` was
estimated on a T4 at 85 GiB, "does not fit", where the GPU would train at the size it finds.
While the decorated function runs, the tracer's allocator has the target GPU's capacity, less
the CUDA context and the memory PyTorch's, cuBLAS's and cuDNN's kernels take (``kernel_bytes``
and ``cudnn_bytes`` of the GPU's properties: a search here stops at or below the GPU's own
choice, never above it), and raises torch's ``OutOfMemoryError`` as the GPU does. Each try is
in the notes.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from xmem_engine.trace import ALLOC, FREE, ITERATION, PHASE, TraceEvent
from xmem_engine.tracing.frames import user_frame
from xmem_engine.tracing.patches import on_import, patched_attr

#: where accelerate defines the decorator, and re-exports it (``from accelerate.utils import ...``)
MODULES = ("accelerate.utils.memory", "accelerate.utils")
OOM = "out of memory"


#: room kept for what the estimate adds to the trace for the target GPU: cuBLAS's and cuBLASLt's
#: workspaces (32 MiB each at most, ``gpus/cuda_libraries.py``) and the segment a small one rounds
#: up to (20 MiB). Without it the replay ran short where the search had fitted.
WORKSPACE_ROOM = (2 * 32 + 20) << 20


def search_limit(props: dict, total: int | None = None, context: int | None = None) -> int:
    """The bytes cudaMalloc can get on the target GPU while a batch size is searched for:
    ``props`` as given to the trace (a partial dict takes ``total`` and ``context``, the
    virtual device's, for what it lacks)."""
    total = int(props.get("total_memory") or total or 0)
    context = int(props.get("context_bytes") or context or 0)
    fixed = context + sum(int(props.get(k) or 0) for k in ("kernel_bytes", "cudnn_bytes"))
    return max(0, total - fixed - WORKSPACE_ROOM)


@contextlib.contextmanager
def capacity(allocator: Any, limit: int) -> Iterator[None]:
    """The simulated device holds ``limit`` bytes for the block (it is unlimited otherwise)."""
    old = allocator.capacity
    allocator.capacity = limit if old is None else min(old, limit)
    try:
        yield
    finally:
        allocator.capacity = old


def as_data(where: str, tries: list[list[Any]], limit: int) -> dict:
    """A search as the estimate's JSON gives it (``batch_size_search``): what a scheduler reads
    to launch the run at the size the GPU would settle on."""
    found = next((size for size, outcome, _ in tries if outcome == "ran"), None)
    return {"where": where or "?", "by": "find_executable_batch_size", "limit_bytes": limit, "found": found,
            "tries": [{"batch_size": size, "outcome": outcome} for size, outcome, _ in tries]}


def note(search: dict) -> str:
    """The notes' sentence for a search (``as_data``'s dict)."""
    said = ", ".join(f"{t['batch_size']} ({t['outcome']})" for t in search["tries"])
    found = search["found"]
    end = (f"the run goes on at batch size {found}" if found is not None else "no batch size ran to the end")
    return (f"find_executable_batch_size at {search['where']} (accelerate; Trainer's auto_find_batch_size) searched "
            f"with the GPU's {search['limit_bytes'] / 2**30:.2f} GiB for PyTorch (its memory less the CUDA context, the kernels and cuBLAS's workspaces), "
            f"as on the GPU: tried {said}; {end}. The estimate is of the run at the size found: the failed "
            "tries filled the GPU up to its capacity before they failed, and what they freed is left out")


def searching(original: Callable[..., Any], tracer: Any, limit: int) -> Callable[..., Any]:
    """``original`` (accelerate's decorator) whose decorated function runs on a device of
    ``limit`` bytes, each try recorded for the notes."""

    @functools.wraps(original)
    def find_executable_batch_size(function: Any = None, starting_batch_size: int = 128, **kwargs: Any) -> Any:
        if function is None:
            return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size, **kwargs)
        tries: list[list[Any]] = []

        @functools.wraps(function)
        def attempt(batch_size: int, *args: Any, **kw: Any) -> Any:
            tries.append([batch_size, "stopped", len(tracer.events)])
            try:
                out = function(batch_size, *args, **kw)
            except torch.OutOfMemoryError:
                tries[-1][1] = OOM
                raise
            tries[-1][1] = "ran"
            return out

        inner = original(attempt, starting_batch_size=starting_batch_size, **kwargs)

        @functools.wraps(inner)
        def run(*args: Any, **kw: Any) -> Any:
            where = user_frame(2)
            try:
                with capacity(tracer.allocator, limit):
                    return inner(*args, **kw)
            finally:
                if tries:
                    ends = [t[2] for t in tries[1:]] + [len(tracer.events)]
                    tracer.failed_tries += [(t[2], end) for t, end in zip(tries, ends) if t[1] == OOM]
                    search = as_data(where, tries, limit)
                    tracer.notes.append(note(search))
                    tracer.batch_searches.append(search)

        return run

    find_executable_batch_size.__xmem_search__ = True  # type: ignore[attr-defined]
    return find_executable_batch_size


def without_failed_tries(events: list[TraceEvent], tries: list[tuple[int, int]]) -> tuple[list[TraceEvent], set[int]]:
    """``events`` less the out-of-memory tries' transients: each allocation a failed try made
    (events ``[start, end)``, ``end`` where the next try began) and freed before the next one
    allocated, with its free, and the tries' step markers. What a failed try made and kept (an
    optimizer's state, made in its first step) stays, as the next try starts with it. Each event
    left out is replaced by a phase marker of its own phase (the simulation passes over those),
    so that what points at events by index (``gemm_into``, ``repeat_span``) still points right;
    returns the events and the indices replaced (a reduction's buffers there are no more)."""
    drop: set[int] = set()
    marks: set[int] = set()
    for start, end in tries:
        made = {e.id for e in events[start:end] if e.kind == ALLOC}
        nxt = next((i for i in range(end, len(events)) if events[i].kind == ALLOC), len(events))
        drop |= {e.id for e in events[start:nxt] if e.kind == FREE and e.id in made}
        marks |= {i for i in range(start, end) if events[i].kind == ITERATION}
    gone = {i for i, e in enumerate(events) if i in marks or (e.kind in (ALLOC, FREE) and e.id in drop)}
    return [TraceEvent(PHASE, phase=e.phase, iteration=e.iteration) if i in gone else e
            for i, e in enumerate(events)], gone


@contextlib.contextmanager
def batch_size_search(tracer: Any, stack: contextlib.ExitStack) -> Iterator[None]:
    """accelerate's ``find_executable_batch_size`` as :func:`searching` makes it, while the block
    lasts (patched as accelerate loads, for the traced code's own import of it)."""
    vc = tracer.vc
    limit = search_limit(vc.device_dict, vc.props.total_memory, vc.context_bytes)

    def patch(module: Any) -> None:
        original = getattr(module, "find_executable_batch_size", None)
        if original is None or getattr(original, "__xmem_search__", False):
            return  # (the re-export of a definition patched as it loaded)
        stack.enter_context(patched_attr(module, "find_executable_batch_size", searching(original, tracer, limit)))

    with on_import(MODULES, patch):
        yield
