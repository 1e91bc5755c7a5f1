"""What CUDA runs differently from the CPU kernels the tracer executes: buffers kernels make
for themselves (cuda_temporaries.py), composite ops run as their parts under
inference_mode, and autocast's weight cache, which inference_mode turns off."""

from __future__ import annotations

import pytest

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace

INDEX_PUT = """
import torch
table = torch.zeros(1000, 64, device="cuda")
idx = torch.randint(0, 1000, (4, 128), device="cuda")
vals = torch.randn(4, 128, 64, device="cuda")
table.index_put_((idx,), vals, accumulate=ACCUMULATE)
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_index_put_with_accumulate_makes_the_sort_kernels_buffers(mode):
    tr = trace(INDEX_PUT.replace("ACCUMULATE", "True"), {}, mode=mode)
    temps = [(e.kind, e.bytes) for e in tr.events if e.op == "aten.index_put_.default" and e.kind in ("alloc", "free")]
    n = 4 * 128 * 8  # int64 per index
    assert temps == [("alloc", n), ("alloc", n), ("free", n),           # remainder, then the linear index
                     ("alloc", n), ("alloc", n), ("alloc", n),          # sorted_indices, orig_indices, range
                     ("free", n), ("free", n), ("free", n), ("free", n)]
    plain = trace(INDEX_PUT.replace("ACCUMULATE", "False"), {}, mode=mode)
    assert not [e for e in plain.events if e.op == "aten.index_put_.default"]


def test_an_indexing_backward_makes_them_too():
    src = """
import torch
weight = torch.nn.Parameter(torch.randn(1000, 64, device="cuda"))
ids = torch.randint(0, 1000, (2, 32), device="cuda")
weight[ids, :].sum().backward()
"""
    fake, real = trace(src, {}, mode="fake"), trace(src, {}, mode="real")
    assert sum(1 for e in fake.events if e.kind == "alloc" and e.bytes == 2 * 32 * 8) >= 5
    assert alloc_stream(fake) == alloc_stream(real)


EINSUM = """
import torch
x = torch.randn(4, 64, 16 * 8, device="cuda")
w = torch.randn(4, 16, 64, 64, device="cuda")
v = x.view(4, 64, 16, 8).transpose(1, 2)            # a permuted view: einsum copies it for bmm
with CONTEXT:
    out = torch.einsum("...qk,...kd->...qd", w, v)
"""


@pytest.mark.parametrize("context", ["torch.no_grad()", "torch.inference_mode()"])
def test_composite_ops_allocate_their_parts_under_inference_mode_too(context):
    fake = trace(EINSUM.replace("CONTEXT", context), {}, mode="fake")
    real = trace(EINSUM.replace("CONTEXT", context), {}, mode="real")
    copies = [e for e in fake.events if e.kind == "alloc" and e.op == "aten.clone.default"]
    assert [e.bytes for e in copies] == [4 * 16 * 64 * 8 * 4]
    assert alloc_stream(fake) == alloc_stream(real)


def test_autocast_keeps_no_weight_casts_under_inference_mode():
    src = """
import torch
layers = [torch.nn.Linear(256, 256).cuda() for _ in range(4)]
x = torch.randn(8, 256, device="cuda")
with CONTEXT, torch.autocast("cuda", dtype=torch.bfloat16):
    for layer in layers:
        x = layer(x)
    during = torch.cuda.memory_allocated()
"""
    weights = 4 * (256 * 256 + 256) * 4 + 8 * 256 * 4
    cached, plain = {}, {}
    trace(src.replace("CONTEXT", "torch.no_grad()"), cached, mode="fake")
    trace(src.replace("CONTEXT", "torch.inference_mode()"), plain, mode="fake")
    bf16_weights = 4 * 256 * 256 * 2
    assert cached["during"] - plain["during"] >= bf16_weights  # cached under no_grad only
    assert plain["during"] < weights + bf16_weights // 2


def test_ops_with_kernels_of_their_own_are_not_decomposed():
    from xmem_engine.tracing.alloc_mode import _composite_implicit
    import torch

    assert _composite_implicit(torch.ops.aten.einsum.default)
    assert not _composite_implicit(torch.ops.aten.silu_backward.default)  # has a math kernel too
    assert not _composite_implicit(torch.ops.aten.mm.default)


def test_softmax_of_a_strided_input_copies_it_for_the_kernel():
    """host_softmax runs on input.contiguous(): the padded logits of a compiled GPT-2 on an H200
    were copied at the loss every step (823,410,688 B), contiguous ones are not."""
    src = """
import torch
padded = torch.randn(64, 1000 + 8, device="cuda")
logits = padded[:, :1000]  # a row stride of 1008, as Inductor pads a matmul's output
a = torch.log_softmax(logits, dim=-1)
b = torch.softmax(padded, dim=-1)
"""
    tr = trace(src, {}, mode="fake")
    temps = [(e.kind, e.bytes, e.op) for e in tr.events if e.category == "temporary"]
    assert temps == [("alloc", 64 * 1000 * 4, "aten._log_softmax.default"), ("free", 64 * 1000 * 4, "aten._log_softmax.default")]


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_cufft_copies_a_complex_to_real_input_and_buffers_a_multi_dim_real_to_complex(mode):
    """_fft_c2r_cufft clones its input ("must always clone", gh-34551) after making its output;
    _fft_r2c_cufft off the one-plan path (dims starting (0, 1)) uses a second output-sized buffer.
    A Fourier neural operator's irfft2 made no copy before."""
    src = """
import torch
x = torch.randn(8, 16, 64, 64, device="cuda")
spectrum = torch.fft.rfft2(x)             # dims (2, 3): one plan, no buffer
image = torch.fft.irfft2(spectrum, s=(64, 64))
leading = torch.fft.rfftn(x, dim=(0, 1))  # dims (0, 1): the R2C then the C2C, two buffers
"""
    tr = trace(src, {}, mode=mode)
    temps = [(e.kind, e.bytes, e.op) for e in tr.events if e.category == "temporary"]
    half = 8 * 16 * 64 * 33 * 8  # the one-sided spectrum, complex64
    assert temps == [("alloc", half, "aten._fft_c2r.default"), ("free", half, "aten._fft_c2r.default"),
                     ("alloc", 8 * 9 * 64 * 64 * 8, "aten._fft_r2c.default"),
                     ("free", 8 * 9 * 64 * 64 * 8, "aten._fft_r2c.default")]


def test_the_estimate_says_cuffts_plan_workspaces_are_not_included():
    from xmem_engine.gpus.catalog import get_gpu
    from xmem_engine.gpus.cuda_libraries import CUFFT_NOTE, adapt_trace
    from xmem_engine.trace import Trace

    fft = trace("import torch\ny = torch.fft.irfft(torch.fft.rfft(torch.randn(4, 256, device='cuda')))", {}, mode="fake")
    plain = trace("import torch\ny = torch.randn(4, 256, device='cuda') * 2", {}, mode="fake")
    assert CUFFT_NOTE in adapt_trace(fft, get_gpu("T4"))[1]
    assert CUFFT_NOTE not in adapt_trace(plain, get_gpu("T4"))[1]
    assert fft.meta["ffts"] and not plain.meta["ffts"]  # found once, when traced
    from_file = Trace(fft.events, fft.mode, fft.seconds, {})  # a trace file has no such meta: its events say
    assert CUFFT_NOTE in adapt_trace(from_file, get_gpu("T4"))[1]


CONV_LAYOUT = """
import torch
conv = torch.nn.Conv2d(3, 8, 3, padding=1).cuda()
conv.weight.data = conv.weight.data.to(memory_format=WEIGHT)
x = torch.randn(BATCH, 3, 16, 16, device="cuda").to(memory_format=INPUT).requires_grad_()
out = conv(x)
print("layout", out.is_contiguous(memory_format=torch.channels_last))
out.backward(torch.ones_like(out))
print("layout", x.grad.is_contiguous(memory_format=torch.channels_last))
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
@pytest.mark.parametrize("batch", [8, 32])  # the CPU's NNPACK (batch >= 16) ignores channels-last
def test_a_convolution_lays_its_outputs_out_as_cudnn_does(mode, batch, capsys):
    """cuDNN works channels-last when the input or the weight is (Inductor's compiled code
    asserts it); where they differ it copies the other operand, for the op's duration."""
    def run(weight, input):
        capsys.readouterr()
        src = CONV_LAYOUT.replace("WEIGHT", weight).replace("INPUT", input).replace("BATCH", str(batch))
        tr = trace(src, {}, mode=mode)
        layouts = [line.split()[1] == "True" for line in capsys.readouterr().out.splitlines()
                   if line.startswith("layout")]
        return layouts, conv_copies(tr)

    image = batch * 3 * 16 * 16 * 4
    assert run("torch.contiguous_format", "torch.contiguous_format") == ([False, False], [])
    assert run("torch.channels_last", "torch.channels_last") == ([True, True], [])
    # a channels-last model fed NCHW images: cuDNN copies the input in forward and in backward
    # (``_convolution``'s and ``convolution_backward``'s ``input.contiguous(channels_last)``)
    # (x.grad: cuDNN's channels-last gradient, copied to x's layout by AccumulateGrad)
    layouts, copies = run("torch.channels_last", "torch.contiguous_format")
    assert layouts == [True, False]
    assert copies == [("aten.convolution.default", image), ("aten.convolution_backward.default", image)]


def conv_copies(tr):
    """The operand copies a trace's convolutions make: transient byte buffers."""
    return [(e.op, e.bytes) for e in tr.events if e.kind == "alloc" and "convolution" in e.op
            and e.dtype == "uint8" and e.shape == (e.bytes,)]


def test_a_1d_convolution_of_a_permuted_input_copies_it_contiguous():
    src = """
import torch
conv = torch.nn.Conv1d(64, 32, 3).cuda()
x = torch.randn(4, 100, 64, device="cuda").transpose(1, 2)   # (N, L, C) features as (N, C, L)
out = conv(x)
"""
    assert conv_copies(trace(src, {}, mode="fake")) == [("aten.convolution.default", 4 * 100 * 64 * 4)]
