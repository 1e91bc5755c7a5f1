"""The tracer's vocabulary for *where*: device kinds, and the scope of the torch call that is
running.

A torch function called by user code decides where the storages its aten ops make live: on
the virtual GPU or on the host. The device mode opens a :class:`CallScope` for each call
(what device argument it named, whether the user moved data to the GPU, which arguments it
had); the dispatch mode reads the innermost scope when a new storage appears. Scopes nest
as calls do; :meth:`Tracer.call_scope <xmem_engine.tracing.tracer.Tracer.call_scope>` is
the public way for other code (``sdpa.py``) to open one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xmem_engine.trace import Category, Word


class Device(Word):
    """Where a storage lives as the user's code sees it."""

    GPU = "gpu"  # the virtual CUDA device (host memory, or none in fake mode)
    HOST = "host"  # the CPU


@dataclass(slots=True)
class CallScope:
    """The torch call now running, as the dispatch mode needs to know it."""

    target: Device | None = None  # named by a device argument or a transfer; None: from the inputs
    explicit: bool = False  # the user moved data to the GPU: its storages are "input"
    args: tuple | None = None  # the call's arguments (a factory inside it follows their device)
    gpu_args: bool | None = None  # cache: do ``args`` hold a GPU storage (None: not looked yet)
    category: Category | None = None  # what the storages made in it hold, where the call knows
    host_dtypes: tuple = ()  # factories of these dtypes stay on the host, whatever ``target`` says


CPU = torch.device("cpu")  # where it really is
