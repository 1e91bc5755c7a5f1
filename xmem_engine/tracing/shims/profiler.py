"""``torch.profiler`` in traced code profiles the CPU only, as it does on a machine without a GPU.

Why: the profiler decides whether to time CUDA kernels by asking ``torch.cuda.is_available()``,
which the tracer answers for the virtual GPU. With no CUPTI to reach it then falls back to CUDA
events (``KINETO_GPU_FALLBACK``), and every op's event fails on this driverless machine: each
failure builds a C++ backtrace (a training step of a 3-layer MLP under
``profile(activities=[CPU, CUDA])`` took 26 s instead of 1.3 s). No kernel runs while tracing,
so there is nothing for the CUDA activity to time: the profiler is built as this machine
answers, its CPU ops (and ``profile_memory``'s host figures) recorded, and the notes say so.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from xmem_engine.tracing.compiler.inductor_gpu import REAL_AVAILABILITY, answering_availability
from xmem_engine.tracing.frames import user_frame
from xmem_engine.tracing.patches import patched_attr

NOTE = ("torch.profiler at {where}: its CUDA activity was off (no kernel runs on the virtual GPU); "
        "it profiled the CPU side of the ops")


@contextlib.contextmanager
def profiler_on_the_host(tracer: Any) -> Iterator[None]:
    """``torch.autograd.profiler.profile`` (which ``torch.profiler.profile`` builds) made with this
    machine's answer to ``torch.cuda.is_available()``, its CUDA request noted once."""
    import torch.autograd.profiler as autograd_profiler

    original = autograd_profiler.profile.__init__
    noted: list[str] = []

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        with answering_availability(REAL_AVAILABILITY), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA is not available, disabling CUDA profiling")
            original(self, *args, **kwargs)
        asked = kwargs.get("use_device") == "cuda" or kwargs.get("use_cuda")
        if asked and not noted:
            noted.append(user_frame(2))
            tracer.notes.append(NOTE.format(where=noted[0] or "?"))

    with patched_attr(autograd_profiler.profile, "__init__", __init__):
        yield
