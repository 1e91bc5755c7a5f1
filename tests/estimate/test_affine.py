"""Templates of values affine in one integer (xmem_engine/affine.py): the pieces decode
replay's families of sixteen lines are built from."""

from __future__ import annotations

import pytest

from xmem_engine.affine import NotAffine, evaluate, fit, moved, rebase
from xmem_engine.trace import Category


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def _step(n: int) -> tuple:
    """A decode step's form at length ``n``: a size linear in it, one padded to 16, names
    (a category is a str enum: it stays one)."""
    return (("A", 4 * n, f"aten.cat ({n}, 64)", Category.TEMPORARY), ("A", 2 * _pad16(n)), "layers.0")


def test_rebase_reads_a_line_at_every_scale_th_step():
    line = fit(_step(10), _step(11), 1, "call")
    every16 = rebase(line, 3, 16)  # steps 13, 29, 45, ... of the line
    assert [evaluate(every16, k) for k in range(3)] == [evaluate(line, 3 + 16 * k) for k in range(3)]


def test_moved_gives_the_next_sample_of_a_line_with_anothers_steps():
    """A residue seen once takes the steps of another residue's line: sizes linear in the
    length and sizes padded to 16 both move by the same amount every 16 lengths."""
    other = fit(_step(17), _step(33), 1, "call")  # residue 1's line, a period a step
    nxt = moved(_step(24), evaluate(other, 0), evaluate(other, 1))
    assert nxt == _step(40)
    line = fit(_step(24), nxt, 1, "call")
    assert [evaluate(line, k) for k in range(4)] == [_step(24 + 16 * k) for k in range(4)]


def test_moved_refuses_a_sample_of_another_structure():
    a, b = _step(17), _step(33)
    with pytest.raises(NotAffine):
        moved(_step(24)[:2], a, b)  # a step with a row fewer
    with pytest.raises(NotAffine):
        moved((_step(24)[0], _step(24)[1], "norm.0"), a, b)  # a name that is not a's
