"""Threads the traced code starts run under the trace's modes, as its own thread does.

Why: PyTorch keeps its mode stacks (torch-function and torch-dispatch) per thread. A thread the
user's code starts ran outside them: ``Thread(target=model.generate, kwargs=dict(streamer=
TextIteratorStreamer(...)))``, the pattern of every chat demo, reached the fake tensors with no
device mode and no recording, stopped at its first value read (``DataDependentOutputException``)
and left the main thread waiting on the streamer for ever. Each thread started while tracing
now takes the stacks its starter had, in the same order, for the whole of its ``run``.

A thread that ends on one of xmem's own stops (:class:`NeedsRealValues`, a tracer error, the
last iteration reached) ends the trace too: the tracing thread, often blocked on that thread's
queue, is interrupted and the thread's stop is raised there (in ``auto`` mode, the real-mode
run). Daemon threads without a target are service loops that outlive the cell (tqdm's monitor)
and run no traced code: they are left alone, so that no mode outlives the trace in them. A thread
pool's workers can outlive it too (a library's pool, made on first use): there each task
submitted while tracing runs in the modes, not the worker.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import thread as futures_thread
from typing import Any, Callable, Iterator

import torch
import torch.utils._python_dispatch as python_dispatch
from torch.overrides import _get_current_function_mode_stack

from xmem_engine.tracing.compiler.mode_stacks import function_stack
from xmem_engine.tracing.errors import NeedsRealValues, StopTracing, TracerError
from xmem_engine.tracing.frames import thread_origin, user_frame
from xmem_engine.tracing.patches import patched_attr
from xmem_engine.tracing.symbolic import SymbolPinned

#: what a traced thread may end on that ends the trace
TRACE_STOPS = (NeedsRealValues, TracerError, StopTracing, SymbolPinned)


def mode_stacks() -> tuple[list[Any], list[Any]]:
    """This thread's torch-function and torch-dispatch modes, innermost last."""
    return _get_current_function_mode_stack(), python_dispatch._get_current_dispatch_mode_stack()


@contextlib.contextmanager
def in_modes(function: list[Any], dispatch: list[Any]) -> Iterator[None]:
    """This (new) thread's empty stacks filled with ``function`` and ``dispatch``, emptied after.
    The modes are pushed as they are (not entered): a mode's ``__enter__`` keeps a stack of its
    own that two threads would interleave."""
    for m in dispatch:
        python_dispatch._push_mode(m)
    try:
        with function_stack(function):
            yield
    finally:
        for _ in range(torch._C._len_torch_dispatch_stack()):
            python_dispatch._pop_mode()


@contextlib.contextmanager
def threads_in_the_trace() -> Iterator[None]:
    """``threading.Thread.start`` that gives the thread the starter's modes (see the module's
    docstring); a trace stop in such a thread raised in the tracing thread."""
    stopped: list[BaseException] = []
    tracing = threading.get_ident()
    original_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        target = getattr(thread, "_target", None)
        if target is not futures_thread._worker and (target is not None or not thread.daemon):
            thread.run = _run_in_modes(thread.run, *mode_stacks(), stopped, tracing,  # type: ignore[method-assign]
                                       user_frame(2))
        original_start(thread)

    def submit(executor: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        function, dispatch = mode_stacks()
        where = user_frame(2)

        def call_in_modes(*a: Any, **k: Any) -> Any:  # a stop reaches the caller through the future
            with _started_at(where), in_modes(function, dispatch):
                return fn(*a, **k)

        return original_submit(executor, call_in_modes, *args, **kwargs)

    original_submit = ThreadPoolExecutor.submit
    try:
        with patched_attr(threading.Thread, "start", start), patched_attr(ThreadPoolExecutor, "submit", submit):
            yield
    except KeyboardInterrupt:
        if stopped:  # the interrupt was ours: the thread's stop is the trace's
            raise stopped[0] from None
        raise


def _run_in_modes(run: Callable[[], None], function: list[Any], dispatch: list[Any],
                  stopped: list[BaseException], tracing: int, started_at: str) -> Callable[[], None]:
    def run_in_modes() -> None:
        try:
            with _started_at(started_at), in_modes(function, dispatch):
                run()
        except TRACE_STOPS as e:
            stopped.append(e)
            if tracing == threading.main_thread().ident and threading.get_ident() != tracing:
                signal.pthread_kill(tracing, signal.SIGINT)  # wakes a blocked queue.get() or join()

    return run_in_modes


@contextlib.contextmanager
def _started_at(where: str) -> Iterator[None]:
    """The notes name ``where`` (the line that started the thread or submitted the task) for
    this thread's guesses, and no longer after: a pool's worker outlives the task."""
    thread_origin.where = where
    try:
        yield
    finally:
        del thread_origin.where
