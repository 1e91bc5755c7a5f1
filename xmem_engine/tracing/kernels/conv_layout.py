"""The memory format a CUDA convolution works in and gives its outputs, on its own (no tracer
imports): the traced convolutions (``convolutions.py``, ``fake/fake_fastpaths.py``) and
Inductor's compile-time expectation of them (``compiler/inductor_gpu.py``) must agree."""

from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format


def cuda_layout(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The memory format CUDA's convolution works in and gives its outputs: cuDNN's
    ``cudnn_conv_suggest_memory_format`` (``aten/src/ATen/native/ConvUtils.h``): channels-last
    when the input or the weight is (4-d, 5-d), contiguous otherwise and for float64. Without
    cuDNN (``torch.backends.cudnn.enabled = False``) CUDA's own kernels are contiguous. A 1-d
    convolution runs as a 2-d one on a contiguous input (``_convolution``'s expand). Not
    followed: a GPU below compute capability 8.0 runs bf16 convolutions without cuDNN
    (``supportsBFloat16ConvolutionWithCuDNNv8``), contiguous."""
    if not torch.backends.cudnn.enabled or torch.float64 in (input.dtype, weight.dtype):
        return torch.contiguous_format
    cl = {4: torch.channels_last, 5: torch.channels_last_3d}.get(weight.dim())
    if cl is not None and cl in (suggest_memory_format(input), suggest_memory_format(weight)):
        return cl
    return torch.contiguous_format
