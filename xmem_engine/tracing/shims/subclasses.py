"""Tensor subclasses that wrap other tensors (DTensor: FSDP2's sharded parameters, their
gradients and the optimizer's states for them): what they hold is their inner tensors.

A wrapper subclass has a storage of its own of 0 bytes; its memory is its inner (local)
tensors', and ops on it run again on them, below the dispatch mode. The tracer looks through
it: a DTensor is on the GPU, fake, a parameter or an optimizer state when its local tensor is.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_KIND: dict[type, bool] = {torch.Tensor: False, torch.nn.Parameter: False}  # type -> is it a wrapper


def is_wrapper(t: Any) -> bool:
    """``t`` is a tensor subclass that wraps other tensors (``__tensor_flatten__``). Asked for
    every tensor of every op: answered once per type."""
    kind = _KIND.get(type(t))
    if kind is None:
        kind = _KIND[type(t)] = isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t)
    return kind


def inner_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors a wrapper holds (recursively); a plain tensor is its own."""
    if is_wrapper(t):
        attrs, _ = t.__tensor_flatten__()
        for a in attrs:
            x = getattr(t, a)
            if isinstance(x, torch.Tensor):
                yield from inner_tensors(x)
    else:
        yield t


def storage_key(t: torch.Tensor) -> int:
    """``t``'s storage (its ``_cdata``). vmap's ``BatchedTensor`` and the ``grad`` transform's
    wrapper have none of their own ("Cannot access storage of BatchedTensorImpl"): they are
    where the tensor they wrap is (transformers' masks ask ``.device`` inside ``vmap``)."""
    try:
        return t.untyped_storage()._cdata
    except NotImplementedError:
        with torch._C.DisableTorchFunction():  # (not through the modes that ask this)
            layout = t.layout
            if layout is torch.sparse_coo or layout in _COMPRESSED:  # a sparse tensor is where its values are
                return storage_key(t._values() if layout is torch.sparse_coo else t.values())
        if not torch._C._functorch.is_functorch_wrapped_tensor(t):
            raise
        return storage_key(torch._C._functorch.get_unwrapped(t))


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
_STRIDED = torch.strided


def _sparse_parts(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A sparse tensor's indices and values: its memory, on the GPU as on the host."""
    with torch._C.DisableTorchFunction():
        layout = t.layout
        if layout is torch.sparse_coo:
            return t._indices(), t._values()
        if layout in (torch.sparse_csr, torch.sparse_bsr):
            return t.crow_indices(), t.col_indices(), t.values()
        if layout in (torch.sparse_csc, torch.sparse_bsc):
            return t.ccol_indices(), t.row_indices(), t.values()
        return ()


def is_fake_wrapper(t: Any) -> bool:
    """A wrapper whose inner tensors are all fake (a DTensor made in fake mode)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return is_wrapper(t) and all(isinstance(x, FakeTensor) for x in inner_tensors(t))


def tensors_in(x: Any) -> Iterator[torch.Tensor]:
    """The tensors of an op's arguments or outputs; a wrapper subclass (DTensor) as the plain
    tensors it holds, which are what has storage."""
    if isinstance(x, torch.Tensor):
        if is_wrapper(x):
            yield from inner_tensors(x)
        elif x.layout is not _STRIDED:  # a sparse tensor: the dense tensors it is made of
            yield from _sparse_parts(x)
        else:
            yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, (torch.Tensor, list, tuple)):
                yield from tensors_in(y)
