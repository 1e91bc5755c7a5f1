"""Traces at any batch size from two (xmem_engine/batch_family.py), and the largest-batch search
that uses them (batch_search.max_batch with estimate_trace): the answer is the real search's,
from fewer traces, and a step whose requests change with the batch is caught and traced."""

from __future__ import annotations

import pytest

from xmem_engine.batch_family import BatchFamily, NotAffine, branches_on, same_trace
from xmem_engine.estimate import estimate, estimate_trace, max_batch
from xmem_engine.tracing import trace

A100 = {"name": "NVIDIA A100-SXM4-40GB", "total_memory": 42_505_273_344, "major": 8, "minor": 0,
        "multi_processor_count": 108}

CNN = """
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(32, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(2):
    x = torch.randn(BATCH, 3, 32, 32, device="cuda")
    F.cross_entropy(model(x), torch.randint(0, 10, (BATCH,), device="cuda")).backward()
    opt.step(); opt.zero_grad()
"""
ATTENTION = """
import torch, torch.nn as nn, torch.nn.functional as F
qkv, out = nn.Linear(64, 192).cuda(), nn.Linear(64, 64).cuda()
opt = torch.optim.AdamW(list(qkv.parameters()) + list(out.parameters()))
for _ in range(2):
    x = torch.randn(BATCH, 32, 64, device="cuda")
    q, k, v = qkv(x).view(BATCH, 32, 3, 4, 16).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(BATCH, 32, 64)
    out(y).square().mean().backward()
    opt.step(); opt.zero_grad()
"""
# the step's own branch on the batch size: above 600 it keeps one more buffer
BRANCH = """
import torch
w = torch.zeros(256, 256, device="cuda", requires_grad=True)
x = torch.randn(BATCH, 256, device="cuda")
keep = torch.empty(BATCH * 64, 256, device="cuda") if BATCH > 600 else None
(x @ w).square().sum().backward()
"""


def _trace(src: str, b: int):
    return trace(src.replace("BATCH", str(b)), {}, mode="fake", device=A100)


MLP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(BATCH, 512, device="cuda")).square().mean().backward()
    opt.step(); opt.zero_grad()
"""


# softmax over a transposed batch-by-batch matrix (CLIP's loss): CUDA copies it contiguous for
# the kernel, a B x B copy that grows as the square, which the family sees in the copy's shape
LOGITS = """
import torch
x = torch.randn(BATCH, 64, device="cuda", requires_grad=True)
logits = x @ x.t()
torch.log_softmax(logits.t(), dim=-1).sum().backward()
"""


def test_a_copy_a_kernel_makes_has_its_tensor_s_shape_and_grows_as_it_does():
    copies = [e for e in _trace(LOGITS, 8).events if e.kind == "alloc" and e.op == "aten._log_softmax.default"]
    assert [(e.shape, e.dtype, e.bytes) for e in copies[1:]] == [((8, 8), "float32", 256)]  # after its output
    fam = BatchFamily.fit(4, _trace(LOGITS, 4), 8, _trace(LOGITS, 8))
    assert same_trace(fam.trace_at(12), _trace(LOGITS, 12))


@pytest.mark.parametrize("src", [CNN, MLP], ids=["cnn", "mlp"])
def test_the_family_of_two_traces_is_the_real_trace_at_other_batch_sizes(src):
    fam = BatchFamily.fit(8, _trace(src, 8), 16, _trace(src, 16))
    for b in (8, 16, 12, 24, 40):
        assert same_trace(fam.trace_at(b), _trace(src, b)), b


def test_a_step_that_branches_on_the_batch_is_no_family_across_the_branch():
    lo = BatchFamily.fit(8, _trace(BRANCH, 8), 16, _trace(BRANCH, 16))
    assert same_trace(lo.trace_at(500), _trace(BRANCH, 500))
    assert not same_trace(lo.trace_at(700), _trace(BRANCH, 700))  # the branch: a request more
    with pytest.raises(NotAffine, match="events"):
        BatchFamily.fit(500, _trace(BRANCH, 500), 700, _trace(BRANCH, 700))


# the CNN's requests are one family at every batch size: two traces, and the answer's two checks.
# Attention's change with the batch (its reductions' buffers by size), and the branch's at 600:
# the search fits a family again where it missed, and never traces more than the real search.
@pytest.mark.parametrize("src, start, most", [(CNN, 32, 4), (ATTENTION, 16, 24), (BRANCH, 64, 26)],
                         ids=["cnn", "attention", "branch"])
def test_the_largest_batch_is_the_real_searchs_from_fewer_traces(src, start, most):
    def searched(family: bool):
        built: list[int] = []

        def build(v: int):
            built.append(v)
            return estimate(src.replace("BATCH", str(v)), "T4", mode="fake")

        fam = (lambda tr: estimate_trace(tr, "T4")) if family else None
        return max_batch(build, start=start, estimate_trace=fam), built

    (real, real_built), (fam, fam_built) = searched(False), searched(True)
    assert fam.value == real.value > 0 and fam.unbounded == real.unbounded == ""
    assert fam.estimate.peak_device_bytes == real.estimate.peak_device_bytes
    assert set(fam.traced) == set(fam_built)
    if fam.family.endswith("the answer between them"):  # two real traces of one family around it
        lo, hi = sorted(fam_built[:2])
        assert lo <= fam.value < fam.value + 1 <= hi and fam.estimate.trace.meta["batch_family"]
    else:  # the answer and the value above it were traced for real
        assert {fam.value, fam.value + 1} <= set(fam.traced)
        assert fam.estimate.trace.meta.get("batch_family") is None
    assert len(fam_built) <= most < len(real_built), (len(fam_built), len(real_built), fam.family)


# a bias's gradient sums 512 rows at batch 4 (one block, no staging buffers) and 1,024 at 8
# (a two-pass reduction: four events more): the reduction's buffers are not affine in the
# batch, their plan's sizes are, and the family makes the buffers from the plan
REDUCTION = """
import torch, torch.nn as nn
lin = nn.Linear(768, 768).cuda()
x = torch.randn(BATCH, 128, 768, device="cuda")
lin(x).square().mean().backward()
"""


def test_reduction_buffers_are_made_from_their_plans_at_each_batch_size():
    t4, t8 = _trace(REDUCTION, 4), _trace(REDUCTION, 8)
    assert len(t4.events) != len(t8.events)  # the staging buffers come and go with the size
    fam = BatchFamily.fit(4, t4, 8, t8)
    for b in (12, 40):
        real = _trace(REDUCTION, b)
        assert same_trace(fam.trace_at(b), real), b
        a, r = estimate_trace(fam.trace_at(b), "A100-40GB"), estimate_trace(real, "A100-40GB")
        assert (a.peak_allocated_bytes, a.peak_reserved_bytes) == (r.peak_allocated_bytes, r.peak_reserved_bytes)
    assert not same_trace(fam.trace_at(40), _trace(REDUCTION.replace("128, 768", "129, 768"), 40))


# contrastive logits: a (B, B) matrix, whose bytes grow as B squared; a straight line through
# the traces at 4 and 8 (64 and 256 bytes) would put 12's at 448 bytes, not 576
CONTRASTIVE = """
import torch, torch.nn.functional as F
w = torch.randn(64, 32, device="cuda", requires_grad=True)
img, txt = torch.randn(BATCH, 64, device="cuda") @ w, torch.randn(BATCH, 64, device="cuda") @ w
logits = img @ txt.t()
F.cross_entropy(logits, torch.arange(BATCH, device="cuda")).backward()
"""


def test_a_batch_by_batch_tensor_grows_as_the_square():
    fam = BatchFamily.fit(4, _trace(CONTRASTIVE, 4), 8, _trace(CONTRASTIVE, 8))
    for b in (12, 40):
        derived, real = fam.trace_at(b), _trace(CONTRASTIVE, b)
        assert same_trace(derived, real), b
        assert any(e.shape == (b, b) and e.bytes == 4 * b * b for e in derived.events)


def test_a_test_for_a_value_of_the_batch_is_found_in_the_code():
    assert branches_on("b = 8\nif b == 3:\n    raise ValueError\n", "b") == "line 2: b == 3"
    assert branches_on("b = 8\nk = 1 if b % 8 else 2\n", "b") == "line 2: b % 8"
    assert branches_on("b = 8\nassert b not in (3, 5)\n", "b") == "line 2: b not in (3, 5)"
    # a threshold changes the traces at the ends (then no family), a loop their lengths: not listed
    assert branches_on("b = 8\nif b > 600:\n    x = [0 for _ in range(b)]\n", "b") is None
    assert branches_on("if n == 3: pass\n", "b") is None and branches_on("if b ==", "b") is None
