"""Ops whose CUDA kernel takes a dtype the CPU kernel refuses (``kernels/cuda_dtypes.py``):
``torch.histc`` of integer ids, which transformers 5's mixture-of-experts layers call on CUDA
to count each expert's tokens. It had stopped every MoE step on the virtual GPU with
``"histogram_cpu" not implemented for 'torch.int32'``, in fake and in real mode."""

from __future__ import annotations

import pytest
import torch

from xmem_engine.tracing import trace

COUNT = """
import torch
torch.manual_seed(0)
ids = torch.randint(0, 8, (1000,), device="cuda")
sorted_ids, perm = torch.sort(ids)
counts = torch.histc(sorted_ids.int(), bins=8, min=0, max=7)
offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
result = (str(counts.dtype), tuple(counts.shape), counts.device.type)
total = int(offsets[-1]) if not FAKE else None
"""


def _allocs(tr):
    return [(e.op, e.bytes) for e in tr.events if e.kind == "alloc"]


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_integer_histc_on_the_gpu_counts_as_cuda_does(mode):
    ns = {"FAKE": mode == "fake"}
    tr = trace(COUNT, ns, mode=mode)
    assert tr.mode == mode and ns["result"] == ("torch.int32", (8,), "cuda")
    # the counts, 8 int32, are the op's one allocation: the float copy it is counted through is the CPU's
    assert ("aten.histc.default", 8 * 4) in _allocs(tr)
    assert _allocs(tr).count(("aten._to_copy.default", 1000 * 4)) == 1  # the script's .int(), no float copy
    if mode == "real":
        assert ns["total"] == 1000


def test_fake_and_real_events_are_the_same():
    fake, real = trace(COUNT, {"FAKE": True}, mode="fake"), trace(COUNT, {"FAKE": False}, mode="real")
    assert _allocs(fake) == _allocs(real)[:len(_allocs(fake))]


def test_a_host_tensor_keeps_the_cpu_kernels_answer():
    with pytest.raises(RuntimeError, match="histogram_cpu"):
        trace("import torch\ntorch.histc(torch.arange(10, dtype=torch.int32), bins=4)", {}, mode="fake")


EXPERTS = """
import torch
torch.manual_seed(0)
x = torch.randn(40, 16, device="cuda", dtype=DTYPE, requires_grad=COLS % 8 == 0)
w = torch.randn(4, COLS, 16, device="cuda", dtype=DTYPE, requires_grad=COLS % 8 == 0)  # (experts, out, in)
offs = torch.tensor([10, 20, 30, 40], device="cuda", dtype=torch.int32)
y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
shape, stride = tuple(y.shape), y.stride()
if y.requires_grad:
    y.square().sum().backward()
"""


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cols", [6, 8])
def test_grouped_mm_of_float32_and_float16_runs_as_cudas_fallback(dtype, cols):
    """A mixture-of-experts layer's matmuls in float32 (or float16): CUDA multiplies them group by
    group into an output whose rows are padded to 16 bytes; torch's meta kernel refused them.
    (Forward and backward with 8 columns; 6 pads the rows, whose gradients TMA could not take.)"""
    ns: dict = {"DTYPE": getattr(torch, dtype), "COLS": cols}
    fake = trace(EXPERTS, ns, mode="fake")
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # rows padded to 16 bytes (4 float32 or 8 float16): 8 elements apart; the last row unpadded
    assert ns["shape"] == (40, cols) and ns["stride"] == (8, 1)
    assert ("aten._grouped_mm.default", (39 * 8 + cols) * itemsize) in _allocs(fake)
    if cols == 8:  # the backward's two grouped matmuls: the experts' gradients, then the input's
        assert [b for op, b in _allocs(fake) if op == "aten._grouped_mm.default"][1:] == \
            [4 * 16 * 8 * itemsize, 40 * 16 * itemsize]
    real = trace(EXPERTS, {"DTYPE": getattr(torch, dtype), "COLS": cols}, mode="real")
    assert _allocs(fake) == _allocs(real)
