"""Ops whose CUDA kernel takes a dtype that the CPU kernel refuses.

The virtual GPU's tensors are the CPU's (real mode) or fakes of CPU tensors (fake mode, whose
meta kernels check the device as the CPU kernel does), so such an op fails on a GPU tensor
although the script is right for CUDA. transformers 5's mixture-of-experts layers count each
expert's tokens with ``torch.histc`` of int32 expert ids on CUDA and of float ids on the CPU
(``integrations/moe.py``, ``grouped_mm_experts_forward``: "CPU only supports float input, CUDA
only supports int input"): a Qwen3-MoE or Mixtral step stopped at its first expert layer with
``"histogram_cpu" not implemented for 'torch.int32'``.

Each rule computes the op through a dtype the CPU takes, below the tracer (the conversions are
the CPU's means, not GPU allocations), and returns the result in the dtype the CUDA kernel
gives; the tracer records that result as the op's output, as for any op. ``_grouped_mm`` (the
experts' matmuls) is the other side of the same divide: torch's meta kernel refuses the float32
and float16 matrices CUDA multiplies group by group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from xmem_engine.tracing.ops import register

aten = torch.ops.aten


def histc(input: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Any:
    """CUDA's integer ``histc``: counted in float32 (exact below 2**24 per bin, and ids below
    2**24 are exact too), one count per bin in the input's dtype (``_histc_cuda``)."""
    if input.is_floating_point():
        return NotImplemented
    counts = aten.histc.default(aten._to_copy.default(input, dtype=torch.float32), bins, min, max)
    return aten._to_copy.default(counts, dtype=input.dtype)


_GROUPED_MM_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> Any:
    """CUDA's ``_grouped_mm`` of float32 or float16 matrices (``_grouped_mm_cuda``: the CUTLASS
    kernel takes bf16 on sm90/sm100, every other case is ``_grouped_mm_fallback``, one ``mm_out``
    a group into the output). torch's meta kernel takes bf16 only (fp16 where cuBLASLt's grouped
    GEMM runs, which it asks of a CPU tensor): an fp32 MoE model stopped at its first expert. The
    output as ``create_grouped_gemm_output_tensor`` makes it (rows padded to 16 bytes for TMA);
    in real mode the values are the CPU kernel's."""
    if mat_a.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16):
        return NotImplemented  # the meta kernel and the CPU kernel take bf16 as CUDA does
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        torch._check(m.dtype in _GROUPED_MM_DTYPES,
                     lambda: f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {m.dtype}")
    dtype = out_dtype or mat_a.dtype
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif a2:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif b2:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    align = 16 // dtype.itemsize
    padded = (size[-1] + align - 1) // align * align
    stride = [size[1] * padded, padded, 1] if a2 == b2 else [padded, 1]
    out = aten.empty_strided.default(size, stride, dtype=dtype, device=mat_a.device)
    if not isinstance(mat_a, FakeTensor):
        aten.copy_.default(out, aten._grouped_mm.default(mat_a, mat_b, offs, bias, out_dtype))
    return out


#: op -> its CUDA dtype rule (``NotImplemented`` where the CPU kernel takes the input as it is)
RULES = register("cuda dtype", {aten.histc.default: histc, aten._grouped_mm.default: grouped_mm}, __name__)
