"""Templates of values affine in one integer (xmem_engine/affine.py): the pieces decode
replay's families of sixteen lines are built from."""

from __future__ import annotations

import pytest

from xmem_engine.affine import NotAffine, anchored, evaluate, fit, rebase
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


def test_a_sample_seen_once_takes_the_steps_of_another_line():
    """A residue seen once takes the steps of another residue's line: sizes linear in the
    length and sizes padded to 16 both move by the same amount every 16 lengths."""
    other = fit(_step(17), _step(33), 1, "call")  # residue 1's line, a period a step
    line = anchored(other, _step(24), 0)
    assert [evaluate(line, k) for k in range(4)] == [_step(24 + 16 * k) for k in range(4)]
    assert line[2] is other[2]  # what does not move is the line's own
    later = anchored(other, _step(40), 1)  # seen at the line's second step
    assert [evaluate(later, k) for k in range(1, 4)] == [_step(24 + 16 * k) for k in range(1, 4)]


def test_a_sample_of_another_structure_takes_no_line():
    line = fit(_step(17), _step(33), 1, "call")
    with pytest.raises(NotAffine):
        anchored(line, _step(24)[:2], 0)  # a step with a row fewer
    with pytest.raises(NotAffine):
        anchored(line, (_step(24)[0], _step(24)[1], "norm.0"), 0)  # a name that is not the line's
    with pytest.raises(NotAffine):
        anchored(line, ((*_step(24)[0][:3], Category.ACTIVATION), _step(24)[1], "layers.0"), 0)
