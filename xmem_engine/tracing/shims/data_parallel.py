"""``nn.DataParallel`` on the virtual GPU: its scatter and gather as PyTorch's CUDA build does them.

DataParallel splits its inputs over ``device_ids`` and, with several GPUs, gathers the outputs,
through ``torch.nn.parallel.comm``. Its ``scatter`` and ``gather`` are C++
(``torch._C._scatter``, ``_gather``): absent from the CPU wheel (an AttributeError), and on a
CUDA wheel without a driver they reach the CUDA runtime, which aborts the process. The tracer's
tensors are on the virtual GPU only as Python sees them, so the two are given here in Python,
step for step as ``torch/csrc/cuda/comm.cpp`` takes them:

- ``scatter``: ``chunk`` (or ``split_with_sizes``) along ``dim``, then each piece moved to its
  device where it is not there already, on the copy stream given for it (DataParallel passes
  side streams for inputs on the CPU); a piece already on its device is a view. With one GPU,
  as on a one-GPU machine, inputs already on it cost nothing and inputs on the CPU are copied
  once, on the side stream;
- ``gather``: the result allocated on the destination (``empty`` of the joined size), then
  each piece copied into its slice. Scatter's backward gathers the inputs' gradients this way.

The default virtual machine has one GPU, and DataParallel over one device calls its module
directly after the scatter. Over several (a node of ``--gpus-per-node`` GPUs) it would replicate
the module on each: not modelled, and the error says so.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from xmem_engine.tracing.patches import patched_attr

UNMODELLED = ("nn.DataParallel over {n} GPUs is not modelled: xmem estimates one GPU. Make one GPU visible "
              "(device_ids=[0]), or use DistributedDataParallel and `xmem estimate --world-size N`")


def _index(device: Any) -> int:
    from torch._utils import _get_device_index

    return _get_device_index(device, optional=True)


def scatter(tensor: torch.Tensor, devices: Sequence[Any] | None = None, chunk_sizes: Sequence[int] | None = None,
            dim: int = 0, streams: Sequence[Any] | None = None, *, out: Sequence[torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, ...]:
    """``torch.nn.parallel.comm.scatter`` (``torch::cuda::scatter``): see the module docstring."""
    if out is not None:
        if devices is not None or chunk_sizes is not None:
            raise RuntimeError("'devices' and 'chunk_sizes' must not be given with 'out'")
        sizes = [o.size(dim) for o in out]
        for piece, o in zip(tensor.split(sizes, dim), out):
            o.copy_(piece, non_blocking=True)
        return tuple(out)
    if devices is None:
        raise RuntimeError("Expected 'devices' to be given when 'out' is not")
    devices = [_index(d) for d in devices]
    if len(devices) > 1:
        raise NotImplementedError(UNMODELLED.format(n=len(devices)))
    pieces = tensor.split_with_sizes(list(chunk_sizes), dim) if chunk_sizes is not None \
        else tensor.chunk(len(devices), dim)
    moved = []
    for i, (piece, device) in enumerate(zip(pieces, devices)):
        if piece.get_device() != device:
            stream = streams[i] if streams is not None else None
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                piece = piece.to(torch.device("cuda", device), non_blocking=True)
        moved.append(piece)
    return tuple(moved)


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.parallel.comm.gather`` (``torch::cuda::gather``): see the module docstring."""
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    if out is None:
        index = -1 if destination in ("cpu", -1) else _index(destination if destination is not None else 0)
        size = list(first.shape)
        size[dim] = sum(t.size(dim) for t in tensors)
        device = torch.device("cpu") if index == -1 else torch.device("cuda", index)
        out = torch.empty(size, dtype=first.dtype, device=device)
    offset = 0
    for t in tensors:
        out.narrow(dim, offset, t.size(dim)).copy_(t, non_blocking=True)
        offset += t.size(dim)
    return out


def _broadcast_coalesced(tensors: Any, devices: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(UNMODELLED.format(n=len(devices)))


def _reduce_add_coalesced(inputs: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(UNMODELLED.format(n=len(inputs)))


def _copy_streams() -> Any:
    """``_functions._get_stream`` for one trace: each device's background copy stream, made on
    the virtual GPU at first use (the original keeps them in a module global, where one trace's
    streams would outlive it and serve the next)."""
    streams: dict[int, Any] = {}

    def _get_stream(device: torch.device) -> Any:
        if device.type == "cpu":
            return None
        index = _index(device)
        if index not in streams:
            streams[index] = torch.cuda.Stream(index)
        return streams[index]

    return _get_stream


@contextlib.contextmanager
def data_parallel_on_gpu() -> Iterator[None]:
    """``torch.nn.parallel.comm``'s scatter and gather in Python for the block, the copy streams
    on the virtual GPU; the replication over several GPUs (``broadcast_coalesced``,
    ``reduce_add_coalesced``) refused."""
    from torch.nn.parallel import _functions, comm

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_attr(_functions, "_get_stream", _copy_streams()))
        stack.enter_context(patched_attr(comm, "scatter", scatter))
        stack.enter_context(patched_attr(comm, "gather", gather))
        stack.enter_context(patched_attr(comm, "broadcast_coalesced", _broadcast_coalesced))
        stack.enter_context(patched_attr(comm, "reduce_add_coalesced", _reduce_add_coalesced))
        yield
