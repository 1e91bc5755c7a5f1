"""A compiled function over bitsandbytes' 4-bit weights: Dynamo judges xmem's fake ``Params4bit``
as it judges the real one (``tracing/compiler/fake_parameters.py``). A compiled QLoRA block
(Unsloth's) had broken its graph at every ``weight.device`` and at a Triton kernel given the
weight, which a GPU run does not."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from xmem_engine.tracing import trace  # noqa: E402
from xmem_engine.tracing.compiler.torch_compile import compile_unavailable  # noqa: E402

pytestmark = pytest.mark.skipif(compile_unavailable() is not None, reason=str(compile_unavailable()))

H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_045_870_592, "major": 9, "minor": 0,
        "multi_processor_count": 132}

DEVICE_READ = """
def f(x, w):
    y = (x * 2).to(w.device)  # a QLoRA block's dequantize reads its weight's device
    return y.sum(0) + w.shape[0]
"""

VIRTUAL = """
import torch, bitsandbytes as bnb
lin = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16).cuda()
""" + DEVICE_READ + """
f = torch.compile(f)
f(torch.randn(4, 64, device="cuda"), lin.weight)
"""

# the weight passed to a user's Triton kernel, as Unsloth's NF4 dequantize passes it
TRITON = """
import torch, triton, triton.language as tl, bitsandbytes as bnb
lin = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16).cuda()

@triton.jit
def _widen(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(dst + i, tl.load(src + i, mask=m).to(tl.float32), mask=m)

@torch.compile
def g(w):
    out = torch.empty(w.numel(), device=w.device, dtype=torch.float32)
    _widen[(triton.cdiv(w.numel(), 128),)](w, out, w.numel(), BLOCK=128)
    return out * 2

g(lin.weight)
"""


def _dynamo_on_the_real_class() -> tuple[int, int]:
    """(graphs, graph breaks) that Dynamo makes of ``DEVICE_READ`` given a real ``Params4bit``."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    scope: dict = {}
    exec(DEVICE_READ, scope)
    w = bnb.nn.Params4bit(torch.randn(64, 64, dtype=torch.bfloat16), requires_grad=False)
    torch.compile(scope["f"], backend="eager")(torch.randn(4, 64), w)
    counters = dynamo_utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def test_a_4bit_weights_device_is_read_in_the_graph_as_for_the_real_class():
    graphs, breaks = _dynamo_on_the_real_class()
    assert (graphs, breaks) == (1, 0)
    t = trace(VIRTUAL, {}, mode="fake", device=H100)
    info = t.meta["compile"]
    assert (info["graphs"], len(info["graph_breaks"])) == (graphs, breaks), t.meta["notes"]


def test_a_4bit_weight_given_to_a_triton_kernel_stays_in_the_graph():
    t = trace(TRITON, {}, mode="fake", device=H100)
    info = t.meta["compile"]
    assert info["graphs"] == 1 and not info["graph_breaks"] and not info["failures"], t.meta["notes"]
    # the kernel's output (64 x 64 4-bit values packed two to a byte: 2,048 floats) and its double
    outs = [e for e in t.events if e.kind == "alloc" and e.shape == (2048,) and e.dtype == "float32"]
    assert len(outs) == 2, [(e.op, e.shape, e.dtype) for e in t.events if e.kind == "alloc"]
