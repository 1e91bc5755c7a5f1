"""``buf.data = fake`` on a real host buffer: the fake tensor takes its place in its modules.

In fake mode a module's host buffers are real tensors (their values are at hand), and what
moves one to the GPU is fake. ``Module._apply`` replaces such a buffer; FSDP moves buffers with
``buf.data = buf.to(device)`` (FSDP1 at its lazy init, FSDP2's ``fully_shard`` of a model left
on the host, as the Trainer's FSDP leaves it), which C++ refuses between a real tensor and a
fake one ("incompatible tensor type") or, where it takes it, leaves a CPU tensor over a meta
storage ("found cpu and meta" in RoPE's ``inv_freq``). On a GPU every module holding the
buffer sees it moved: here each gets the new tensor (the old object keeps its host values).
"""

from __future__ import annotations

import gc
import weakref

import torch

# every nn.Module alive at the last scan (a scan walks the heap: done again only on a miss)
_modules: list[weakref.ref] = []


def _holders(t: torch.Tensor) -> list[tuple[dict, str]]:
    out = []
    for ref in _modules:
        m = ref()
        if m is not None:
            out.extend((m._buffers, k) for k, v in m._buffers.items() if v is t)
    return out


def replace_buffer(t: torch.Tensor, new: torch.Tensor) -> bool:
    """Put ``new`` wherever a module holds ``t`` as a buffer; False if none does."""
    found = _holders(t)
    if not found:
        _modules[:] = [weakref.ref(o) for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
        found = _holders(t)
    for buffers, name in found:
        buffers[name] = new
    return bool(found)
