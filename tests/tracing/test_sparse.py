"""Sparse tensors on the virtual GPU: a graph's adjacency (pygcn's ``torch.spmm``), moved as the
indices and values it is made of. Fake tensors keep a sparse tensor's shape, not its entries:
sparse embedding gradients, their clones and what SparseAdam makes of them are made with their
entries (``fake/sparse_entries.py``); what other sparse ops make from one (a transpose in
backward) is run in real mode instead."""

from __future__ import annotations

import pytest

from xmem_engine.simulation.simulate import simulate
from xmem_engine.tracing import trace

GCN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
n, f = 2000, 64
idx = torch.randint(0, n, (2, 30000))
adj = torch.sparse_coo_tensor(idx, torch.rand(idx.shape[1]), (n, n)).coalesce()
adj = LAYOUT
nnz = adj._nnz() if adj.layout is torch.sparse_coo else adj.values().numel()
w = nn.Linear(f, 32).cuda()
adj, x = adj.cuda(), torch.randn(n, f, device="cuda")
on_gpu, moved_nnz = str(adj.device), (adj._nnz() if adj.layout is torch.sparse_coo else adj.values().numel())
loss = F.relu(torch.sparse.mm(adj, w(x))).sum()
STEP
"""


def test_a_sparse_adjacency_moves_with_its_entries_in_fake_mode():
    src = GCN.replace("LAYOUT", "adj").replace("STEP", "")
    fake_ns: dict = {}
    fake, real = trace(src, fake_ns, mode="fake"), trace(src, {}, mode="real")
    nnz = fake_ns["nnz"]
    assert fake_ns["on_gpu"] == "cuda:0" and fake_ns["moved_nnz"] == nnz
    inputs = sorted(e.bytes for e in fake.events if e.kind == "alloc" and e.category == "input")
    assert 4 * nnz in inputs and 16 * nnz in inputs  # fp32 values, int64 index pairs
    assert simulate(fake.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


@pytest.mark.parametrize("layout", ["adj", "adj.to_sparse_csr()"])
def test_what_fake_tensors_cannot_make_of_a_sparse_tensor_runs_in_real_mode(layout):
    """Backward transposes the adjacency (its entries unknown to a fake tensor); a compressed
    layout is not moved in fake mode at all. Auto mode says so and traces in real mode."""
    src = GCN.replace("LAYOUT", layout).replace("STEP", "loss.backward()")
    with pytest.raises(Exception, match="fake tensors keep no entries of a sparse tensor"):
        trace(src, {}, mode="fake")
    auto, real = trace(src, {}, mode="auto"), trace(src, {}, mode="real")
    assert auto.mode == "real" and "sparse tensor" in auto.meta["fallback"]
    assert simulate(auto.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


# A recommendation model's and word2vec's tables: sparse gradients, SGD or SparseAdam.
SPARSE_EMBEDDING = """
import torch, torch.nn as nn
torch.manual_seed(0)
m = MODULE.cuda()
opt = OPTIMIZER
offsets = torch.arange(0, 64 * 32, 32, device="cuda")  # known values, kept over the step
for _ in range(2):
    idx = torch.randint(0, 20000, (64, 32), device="cuda")
    loss = CALL
    loss.backward()
    nnz = m.weight.grad._nnz()
    opt.step(); opt.zero_grad()
"""
TABLES = {
    "embedding": ("nn.Embedding(20000, 32, sparse=True, padding_idx=0)", "m(idx).sum()"),
    "embedding-bag-mean": ("nn.EmbeddingBag(20000, 32, mode='mean', sparse=True)",
                           "m(idx.flatten(), offsets).sum()"),
    "embedding-bag-int32": ("nn.EmbeddingBag(20000, 32, mode='sum', sparse=True)",
                            "m(idx.int(), per_sample_weights=torch.rand(idx.shape, device='cuda')).sum()"),
}


def _embedding_step(table: str, optimizer: str) -> str:
    module, call = TABLES[table]
    return SPARSE_EMBEDDING.replace("MODULE", module).replace("CALL", call).replace("OPTIMIZER", optimizer)


@pytest.mark.parametrize("table", list(TABLES))
def test_a_sparse_embedding_gradient_has_its_entries_in_fake_mode(table):
    """Before, EmbeddingBag's gradient took no memory in fake mode (its meta kernel keeps no
    entries) and Embedding's stopped fake mode at the gradient's clone."""
    src = _embedding_step(table, "torch.optim.SGD(m.parameters(), lr=0.1)")
    fake_ns: dict = {}
    fake, real = trace(src, fake_ns, mode="fake"), trace(src, {}, mode="real")
    assert fake.mode == "fake" and fake_ns["nnz"] == 64 * 32  # one entry per lookup (padding taken as kept)
    values = 64 * 32 * 32 * 4  # a gradient row per lookup
    assert any(e.kind == "alloc" and e.bytes == values and e.phase == "backward" for e in fake.events) or \
        table == "embedding"  # Embedding's values are its incoming gradient, reshaped
    # (EmbeddingBag's forward on the CPU keeps one index more than its meta kernel: peaks, not events)
    assert simulate(fake.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


def test_sparse_adam_counts_every_index_distinct_in_fake_mode():
    src = _embedding_step("embedding-bag-mean", "torch.optim.SparseAdam(list(m.parameters()))")
    fake, real = trace(src, {}, mode="fake"), trace(src, {}, mode="real")
    assert fake.mode == "fake"
    assert any(g["what"] == "coalesce's entries" for g in fake.meta["guesses"])
    fake_peak = simulate(fake.events).peak_allocated_bytes
    real_peak = simulate(real.events).peak_allocated_bytes
    # duplicate lookups merge on the GPU: fake mode's bound is above, by less than the entries' bytes
    assert real_peak <= fake_peak <= real_peak + 2 * 64 * 32 * (32 * 4 + 8)
