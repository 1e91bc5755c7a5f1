"""Packed sequences (``pack_padded_sequence`` / ``pad_packed_sequence``) on the virtual GPU.

Why: their ``batch_sizes`` and ``lengths`` live on the host on a CUDA run (the RNN kernels
read their memory), while their data lives on the GPU. ``aten::_pad_packed_sequence`` is a
composite op whose C++ body runs above the dispatch modes and reads its inputs' memory
directly, which fake tensors do not have, and makes its ``lengths`` where the tracer would
take it for a GPU tensor. Here is the same body in Python
(``aten/src/ATen/native/PackedSequence.cpp``), for both modes: one output filled with the
padding value, then each time step's rows copied into their slice of it, so the run
allocates what the real one does and autograd sees the same ops. ``_pack_padded_sequence``
is an ordinary op: fake mode sizes it from the real ``lengths`` (``guesses._pack_padded``),
and the dispatch mode keeps its ``batch_sizes`` on the host (``alloc_mode.HOST_OUTPUTS``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from xmem_engine.tracing.scope import Device


def pad_packed_sequence(data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool,
                        padding_value: float, total_length: int, tracer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = [int(n) for n in batch_sizes.tolist()]
    if not sizes:
        raise RuntimeError("_pad_packed_sequence: batch_sizes must not be empty")
    steps = len(sizes)
    if total_length > 0:
        if total_length < steps:
            raise RuntimeError(
                f"Expected total_length to be at least the length of the longest sequence in input, but got "
                f"total_length={total_length} and max sequence length being {steps}")
        steps = total_length
    batch = sizes[0]
    output = data.new_full((steps, batch, *data.shape[1:]), padding_value)
    offset = 0
    for t, size in enumerate(sizes):
        output[t].narrow(0, 0, size).copy_(data.narrow(0, offset, size))
        offset += size
    with tracer.call_scope(target=Device.HOST):  # a host tensor, as on a GPU run
        lengths = torch.tensor([sum(1 for s in sizes if s > b) for b in range(batch)], dtype=torch.long)
    if batch_first:
        output = output.transpose(0, 1)
    return output, lengths


def handler(tracer: Any) -> Callable[[Any, tuple, dict], Any]:
    """The device mode's entry for ``torch._VF._pad_packed_sequence`` (both modes: in real
    mode too its lengths must stay a host tensor)."""

    def pad(func: Any, args: tuple, kwargs: dict) -> Any:
        names = ("data", "batch_sizes", "batch_first", "padding_value", "total_length")
        a = dict(zip(names, args), **kwargs)
        if not tracer.is_gpu(a["data"]) or tracer.is_gpu(a["batch_sizes"]):
            return func(*args, **kwargs)
        return pad_packed_sequence(a["data"], a["batch_sizes"], bool(a["batch_first"]), a["padding_value"],
                                   int(a["total_length"]), tracer)

    return pad
