"""accelerate's ``find_executable_batch_size`` (``Trainer(auto_find_batch_size=True)``) and
Lightning's batch size finder (``Tuner(trainer).scale_batch_size``, ``BatchSizeFinder``) search
on the virtual GPU as they search on the real one.

Why: the decorator runs the training function at a batch size and, on a CUDA out-of-memory
error, frees the cache and tries again at 90 % of it. The virtual GPU has no capacity of its own
(an estimate runs the step whole, to say how much it would need), so the first batch size always
"fitted": a Trainer with ``per_device_train_batch_size=64`` and ``auto_find_batch_size`` was
estimated on a T4 at 85 GiB, "does not fit", where the GPU would train at the size it finds.
While the decorated function runs, the tracer's allocator has the target GPU's capacity, less
the CUDA context and the memory PyTorch's, cuBLAS's and cuDNN's kernels take (``kernel_bytes``
and ``cudnn_bytes`` of the GPU's properties: a search here stops at or below the GPU's own
choice, never above it), and raises torch's ``OutOfMemoryError`` as the GPU does. Each try is
in the notes. Lightning's finder doubles the size until a trial runs out of memory (up to 8,192
by default): it had doubled to 8,192 and the estimate was of that, 139.9 GiB for a small CNN on
a T4, with 10.4 GB of host memory for its batches of images.
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
#: Lightning's finder: the search (``_scale_batch_size``, imported by the callback's module), its
#: trials (``_try_loop_run``) and its size changes (``_adjust_batch_size``), in either package name
LIGHTNING = tuple(f"{pkg}.{mod}" for pkg in ("lightning.pytorch", "pytorch_lightning")
                  for mod in ("tuner.batch_size_scaling", "callbacks.batch_size_finder"))
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


#: each search's name in the notes, by its ``by``
SEARCHES = {"find_executable_batch_size": "find_executable_batch_size at {} (accelerate; Trainer's auto_find_batch_size)",
            "scale_batch_size": "Lightning's batch size finder at {} (Tuner.scale_batch_size, BatchSizeFinder)"}


def as_data(where: str, tries: list[list[Any]], limit: int, by: str = "find_executable_batch_size",
            found: Any = None) -> dict:
    """A search as the estimate's JSON gives it (``batch_size_search``): what a scheduler reads
    to launch the run at the size the GPU would settle on. ``found``: the size the search
    returned (Lightning's, which may take a margin off the largest that ran); else accelerate's,
    the first that ran."""
    if found is None:
        found = next((size for size, outcome, _ in tries if outcome == "ran"), None)
    return {"where": where or "?", "by": by, "limit_bytes": limit, "found": found,
            "tries": [{"batch_size": size, "outcome": outcome} for size, outcome, _ in tries]}


def note(search: dict) -> str:
    """The notes' sentence for a search (``as_data``'s dict)."""
    said = ", ".join(f"{t['batch_size']} ({t['outcome']})" for t in search["tries"])
    found = search["found"]
    end = (f"the run goes on at batch size {found}" if found is not None else "no batch size ran to the end")
    return (f"{SEARCHES[search['by']].format(search['where'])} searched "
            f"with the GPU's {search['limit_bytes'] / 2**30:.2f} GiB for PyTorch (its memory less the CUDA context, the kernels and cuBLAS's workspaces), "
            f"as on the GPU: tried {said}; {end}. The estimate is of the run without the failed "
            "tries: they filled the GPU up to its capacity before they failed, and what they freed is left out")


def record(tracer: Any, where: str, tries: list[list[Any]], limit: int, by: str, found: Any = None) -> None:
    """A finished search's tries (``[size, outcome, first event]``): the failed ones' events out
    of the estimate, the search in the notes and ``batch_size_search``."""
    if not tries:
        return
    ends = [t[2] for t in tries[1:]] + [len(tracer.events)]
    tracer.failed_tries += [(t[2], end) for t, end in zip(tries, ends) if t[1] == OOM]
    search = as_data(where, tries, limit, by, found)
    tracer.notes.append(note(search))
    tracer.batch_searches.append(search)


def tried(tries: list[list[Any]], size: Any, tracer: Any, run: Callable[[], Any]) -> Any:
    """``run()``, a try at ``size``, appended to ``tries`` with its outcome."""
    tries.append([size, "stopped", len(tracer.events)])
    try:
        out = run()
    except torch.OutOfMemoryError:
        tries[-1][1] = OOM
        raise
    tries[-1][1] = "ran"
    return out


class Searching:
    """The trace's searches: its tracer, and the bytes the GPU gives PyTorch. The libraries'
    functions are wrapped once per process and find the trace that runs them here (:func:`active`):
    a module that bound a wrapper while a trace ran keeps it (``accelerate.utils`` re-exports the
    decorator as it loads; Lightning's callback imports ``_scale_batch_size``), and after the trace
    the wrapper calls the library's own function."""

    def __init__(self, tracer: Any, limit: int) -> None:
        self.tracer, self.limit = tracer, limit
        self.size: Any = None  # Lightning's: the size its last _adjust_batch_size set
        self.tries: list[list[Any]] | None = None  # Lightning's: the trials of the search running

    def run(self, by: str, tries: list[list[Any]], call: Callable[[], Any], returns_size: bool = False) -> Any:
        """``call()``, a search, on a device of ``limit`` bytes; ``tries`` recorded after it
        (``returns_size``: what it returns is the size found)."""
        where, out = user_frame(3), None
        try:
            with capacity(self.tracer.allocator, self.limit):
                out = call()
            return out
        finally:
            record(self.tracer, where, tries, self.limit, by, out if returns_size and isinstance(out, int) else None)


_ACTIVE: list[Searching] = []


def active() -> Searching | None:
    return _ACTIVE[-1] if _ACTIVE else None


def _ours(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__xmem_search__ = True  # type: ignore[attr-defined]
    return fn


def searching(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (accelerate's decorator) whose decorated function, called in a trace, runs
    on a device of the GPU's bytes, each try recorded for the notes."""

    @functools.wraps(original)
    def find_executable_batch_size(function: Any = None, starting_batch_size: int = 128, **kwargs: Any) -> Any:
        if function is None:
            return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size, **kwargs)
        tries: list[list[Any]] = []

        @functools.wraps(function)
        def attempt(batch_size: int, *args: Any, **kw: Any) -> Any:
            search = active()
            if search is None:
                return function(batch_size, *args, **kw)
            return tried(tries, batch_size, search.tracer, lambda: function(batch_size, *args, **kw))

        inner = original(attempt, starting_batch_size=starting_batch_size, **kwargs)

        @functools.wraps(inner)
        def run(*args: Any, **kw: Any) -> Any:
            search = active()
            if search is None:
                return inner(*args, **kw)
            tries.clear()
            return search.run("find_executable_batch_size", tries, lambda: inner(*args, **kw))

        return run

    return _ours(find_executable_batch_size)


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


def _scale_batch_size(original: Callable[..., Any]) -> Callable[..., Any]:
    """Lightning's search (``Tuner.scale_batch_size``, ``BatchSizeFinder``) on the GPU's bytes."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        search = active()
        if search is None:
            return original(*args, **kwargs)
        search.tries = tries = []
        try:
            return search.run("scale_batch_size", tries, lambda: original(*args, **kwargs), returns_size=True)
        finally:
            search.tries = None

    return _ours(wrapper)


def _try_loop_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """A trial of Lightning's search, at the size ``_adjust_batch_size`` last set."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        search = active()
        if search is None or search.tries is None:
            return original(*args, **kwargs)
        return tried(search.tries, search.size, search.tracer, lambda: original(*args, **kwargs))

    return _ours(wrapper)


def _adjust_batch_size(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        search = active()
        if search is not None:
            search.size = out[0]  # (new_size, changed)
        return out

    return _ours(wrapper)


#: the functions wrapped, by name, in the modules of MODULES and LIGHTNING that define or import them
WRAPPERS = {"find_executable_batch_size": searching, "_scale_batch_size": _scale_batch_size,
            "_try_loop_run": _try_loop_run, "_adjust_batch_size": _adjust_batch_size}


@contextlib.contextmanager
def batch_size_search(tracer: Any, stack: contextlib.ExitStack) -> Iterator[None]:
    """accelerate's ``find_executable_batch_size`` and Lightning's batch size finder search on
    the target GPU's bytes while the block lasts (patched as the libraries load, for the traced
    code's own import of them)."""
    vc = tracer.vc

    def patch(module: Any) -> None:
        for name, wrap in WRAPPERS.items():
            original = getattr(module, name, None)
            if original is not None and not getattr(original, "__xmem_search__", False):
                stack.enter_context(patched_attr(module, name, wrap(original)))

    _ACTIVE.append(Searching(tracer, search_limit(vc.device_dict, vc.props.total_memory, vc.context_bytes)))
    try:
        with on_import(MODULES + LIGHTNING, patch):
            yield
    finally:
        _ACTIVE.pop()
