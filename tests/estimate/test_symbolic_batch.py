"""One trace with the batch size as a symbol (xmem_engine/tracing/symbolic.py,
batch_family.SymbolicFamily): it equals the real trace at every batch size its guards allow,
event for event; a size that breaks a guard (a branch, a kernel picked by size) is traced where
it is; code that needs the size as a plain number says where; and the largest-batch search
needs one trace where the step does not branch on the batch."""

from __future__ import annotations

import pytest

from xmem_engine.batch_family import NotSymbolic, SymbolicRegions, family_note, same_trace, symbolic_family
from xmem_engine.estimate import estimate_trace, max_batch
from xmem_engine.tracing import trace_script

from tests.estimate.test_batch_family import A100, ATTENTION as _ATTENTION, BRANCH as _BRANCH, CNN as _CNN


def _with_variable(src: str) -> str:
    """test_batch_family's steps, their batch a top-level variable (what a symbol replaces)."""
    return "batch = 8\n" + src.replace("BATCH", "batch")


# a loss read with .item(): a guess as in any fake trace (1 for an unknown mean), not a symbol
CNN = _with_variable(_CNN) + ('loss = model(torch.randn(batch, 3, 32, 32, device="cuda")).mean()\n'
                              'print(f"loss {loss.item():.3f}")\n')
# a class token taken with x[:, 0] (ViT): a whole-dimension slice must stay no slice at all
ATTENTION = _with_variable(_ATTENTION).replace("out(y).square()", "out(y)[:, 0].square()")
# the step's own branch on the batch size: above 600 it keeps one more buffer (line 6)
BRANCH = _with_variable(_BRANCH)
# the size as a plain number: range() needs an index, which fixes the symbol at its value
PINNED = """
import torch
batch = 8
xs = [torch.randn(3, 32, device="cuda") for _ in range(batch)]
torch.stack(xs).sum().item()
"""

# a size read from the data: the number of tokens, a sum over the batch
TOKENS = """
import torch
batch = 8
mask = torch.ones(batch, 16, device="cuda")
n = int(mask.sum().item())
packed = torch.empty(n, 64, device="cuda")
"""

# known values seen through a view sized by the batch: position ids, expanded over it
POSITIONS = """
import torch
batch = 8
emb = torch.nn.Embedding(64, 32).cuda()
pos = torch.arange(16, device="cuda")[None, :].expand(batch, -1)  # a Llama's position ids, and its RoPE's
freqs = torch.ones(4, device="cuda")[None, :, None].float().expand(pos.shape[0], -1, 1) * pos[:, None, :].float()
(emb(pos) * freqs.sum()).square().mean().backward()
"""


def _script(tmp_path, src: str, name: str = "step.py") -> str:
    p = tmp_path / name
    p.write_text(src)
    return str(p)


def _real(path: str, b: int):
    return trace_script(path, mode="fake", overrides={"batch": str(b)}, device=A100)


@pytest.mark.parametrize("src", [CNN, ATTENTION], ids=["cnn", "attention"])
def test_one_symbolic_trace_is_the_real_trace_at_every_batch_size(tmp_path, capsys, src):
    path = _script(tmp_path, src)
    fam = symbolic_family(path, "batch", 8, device=A100)
    assert fam.batch.guards == []
    for b in (8, 2, 3, 17, 64, 1000):
        assert same_trace(fam.trace_at(b), _real(path, b)), b
    assert fam.trace_at(8).meta.get("batch_family") is None  # the value traced is no derived one
    note = family_note(fam.trace_at(17).meta)
    assert note.startswith("batch = 17 was not traced: the trace at 8 with batch as a symbol")
    if src is CNN:  # the loss is guessed as in any fake trace, not a symbol
        assert "loss 1.000" in capsys.readouterr().out


def test_memory_read_by_the_code_is_the_traced_size_s_and_fixes_the_symbol_where_it_decides(tmp_path):
    # printed: the traced size's figure, and the trace holds every size
    printed = _script(tmp_path, CNN + 'print(f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")\n',
                      "printed.py")
    assert symbolic_family(printed, "batch", 8, device=A100).batch.guards == []
    # compared: another size could go the other way, so the symbol is fixed there
    adaptive = _script(tmp_path, CNN + "if torch.cuda.memory_allocated() > 2**20:\n    torch.cuda.empty_cache()\n",
                       "adaptive.py")
    line = len(CNN.splitlines()) + 1
    with pytest.raises(NotSymbolic, match=rf"{adaptive}:{line}: torch.cuda.memory_allocated\(\) decided control flow"):
        symbolic_family(adaptive, "batch", 8, device=A100)


def test_known_values_in_a_view_sized_by_the_batch_are_unknown_there(tmp_path):
    path = _script(tmp_path, POSITIONS)
    fam = symbolic_family(path, "batch", 8, device=A100)
    assert all(same_trace(fam.trace_at(b), _real(path, b)) for b in (8, 3, 40))


def test_a_branch_on_the_batch_is_a_guard_and_the_other_side_a_trace_of_its_own(tmp_path):
    path = _script(tmp_path, BRANCH)
    fam = symbolic_family(path, "batch", 8, device=A100)
    assert same_trace(fam.trace_at(600), _real(path, 600))
    assert fam.trace_at(601) is None
    assert fam.broken_at(601).startswith(f"{path}:6: ")  # the line with the branch
    regions = SymbolicRegions(lambda v: symbolic_family(path, "batch", v, device=A100))
    for b in (8, 500, 601, 2000):
        assert same_trace(regions.trace_at(b), _real(path, b)), b
    assert regions.traced == [8, 601]
    assert "601 broke a guard of the trace at 8" in regions.describe()


def test_code_that_needs_the_size_as_a_number_says_where(tmp_path):
    path = _script(tmp_path, PINNED)
    with pytest.raises(NotSymbolic, match=rf"batch was fixed at 8: {path}:4: Eq\("):
        symbolic_family(path, "batch", 8, device=A100)
    tokens = _script(tmp_path, TOKENS, "tokens.py")
    with pytest.raises(NotSymbolic, match=rf"batch was fixed at 8: {tokens}:5: a value read from a sum over the batch"):
        symbolic_family(tokens, "batch", 8, device=A100)
    with pytest.raises(NotSymbolic, match="needs a value of 2 or more"):
        symbolic_family(path, "batch", 1, device=A100)


def test_the_largest_batch_from_one_symbolic_trace_is_the_real_search_s(tmp_path):
    path = _script(tmp_path, CNN)
    est = lambda tr: estimate_trace(tr, "T4")  # noqa: E731
    real = max_batch(lambda v: est(_real(path, v)), start=32)
    one = max_batch(lambda v: est(_real(path, v)), start=32, estimate_trace=est,
                    symbolic=lambda v: symbolic_family(path, "batch", v, device=A100))
    assert one.value == real.value > 1000
    assert one.traced == [32] and len(real.traced) > 10
    assert one.family == "traced once with batch as a symbol, at 32"
    assert one.estimate.peak_device_bytes == real.estimate.peak_device_bytes


def test_where_the_first_trace_cannot_be_symbolic_the_search_says_why_and_fits_two(tmp_path):
    path = _script(tmp_path, PINNED.replace("batch = 8", "batch = 64"))
    est = lambda tr: estimate_trace(tr, "T4")  # noqa: E731
    search = max_batch(lambda v: est(_real(path, v)), start=64, limit=4096, estimate_trace=est,
                       symbolic=lambda v: symbolic_family(path, "batch", v, device=A100))
    assert search.family.startswith("the batch could not be a symbol (batch was fixed at 64")
    assert search.unbounded == "limit" and search.value == 4096
