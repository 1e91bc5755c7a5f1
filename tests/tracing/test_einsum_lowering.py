"""einsum as older PyTorch lowers it (einsum_lowering.py): the same values, and the bmm
operand order, output layout and gradient copies of that release when an estimate targets
it (``torch_version``)."""

from __future__ import annotations

import pytest
import torch

from xmem_engine.tracing import trace
from xmem_engine.tracing.kernels import einsum_lowering

CASES = [
    ("oi,...i->...o", [(64, 32), (4, 8, 32)]),
    ("...i,oi->...o", [(4, 8, 32), (64, 32)]),
    ("...qd,...kd->...qk", [(2, 3, 8, 16), (2, 3, 8, 16)]),
    ("b i d, b j d -> b i j", [(2, 5, 4), (2, 6, 4)]),
    ("t,f->tf", [(5,), (7,)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
]


@pytest.mark.parametrize("equation, shapes", CASES)
def test_the_port_computes_what_torch_computes(equation, shapes):
    torch.manual_seed(0)
    ops = [torch.randn(*s) for s in shapes]
    assert torch.allclose(einsum_lowering.einsum(equation, ops), torch.einsum(equation, *ops), atol=1e-5)


def test_before_the_swap_bmm_takes_its_operands_in_order():
    # torch 2.6.0 (checked against its wheel): einsum(W, x) is bmm(W, x^T), returned as a
    # permuted view whose last dim is not the fastest
    W, x = torch.randn(64, 32), torch.randn(4, 8, 32)
    out = einsum_lowering.einsum("oi,...i->...o", [W, x])
    assert out.shape == (4, 8, 64) and out.stride() == (8, 1, 32)


LINEAR = """
import torch
W = torch.nn.Parameter(torch.randn(1000, 256, device="cuda"))
x = torch.randn(4, 64, 256, device="cuda", requires_grad=True)
y = torch.einsum("oi,...i->...o", W, x)
layout = y.stride()
y.sum().backward()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_an_estimate_for_torch_2_8_or_older_traces_its_lowering(mode):
    old, new = {}, {}
    tr_old = trace(LINEAR, old, mode=mode, torch_version="2.8")
    tr_new = trace(LINEAR, new, mode=mode)
    assert old["layout"] == (64, 1, 256) and new["layout"] == (64 * 1000, 1000, 1)
    copies = {name: [e.shape for e in tr.events if e.kind == "alloc" and e.op == "aten.new_empty_strided.default"]
              for name, tr in (("2.6", tr_old), ("installed", tr_new))}
    assert copies["2.6"] == [(4, 64, 256)]          # the input's gradient is copied...
    assert copies["installed"] == [(1000, 256)]     # ...where newer releases copy the weight's


def test_a_version_outside_the_modelled_range_is_refused():
    with pytest.raises(ValueError, match="outside the releases"):
        trace(LINEAR, {}, mode="fake", torch_version="1.13")
