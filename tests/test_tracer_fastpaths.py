"""The tracer's fake-mode shortcuts give the same outputs as FakeTensorMode's own kernels."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from xmem_engine.fake_fastpaths import FAST_FAKE

aten = torch.ops.aten

CONVS = [
    # input shape, weight shape, stride, padding, dilation, groups
    ((2, 3, 17, 17), (8, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((2, 4, 16, 15), (8, 2, 5, 3), [2, 3], [2, 0], [1, 2], 2),
    ((1, 6, 9), (6, 1, 4), [2], [1], [3], 6),
    ((1, 2, 5, 6, 7), (4, 2, 3, 3, 3), [1, 2, 1], [0, 1, 2], [1, 1, 2], 1),
    ((3, 8, 7, 7), (16, 8, 1, 1), [2, 2], [0, 0], [1, 1], 1),
]


def meta(out):
    items = out if isinstance(out, tuple) else (out,)
    return [None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.untyped_storage().nbytes()) for t in items]


def both(func, *args):
    with FakeTensorMode():
        args = tuple(a() if callable(a) else a for a in args)
        reference = meta(func(*args))
        fast = FAST_FAKE[func](*args)
        assert fast is not NotImplemented
        return reference, meta(fast) if fast is not args[0] else "self"


@pytest.mark.parametrize("inp, w, stride, padding, dilation, groups", CONVS)
def test_convolution_and_its_backward(inp, w, stride, padding, dilation, groups):
    ref, fast = both(aten.convolution.default, lambda: torch.empty(inp), lambda: torch.empty(w), None,
                     stride, padding, dilation, False, [0] * len(stride), groups)
    assert ref == fast
    out_shape = ref[0][0]
    for mask in ([True, True, True], [False, True, False], [True, False, True]):
        ref, fast = both(aten.convolution_backward.default, lambda: torch.empty(out_shape), lambda: torch.empty(inp),
                         lambda: torch.empty(w), [w[0]], stride, padding, dilation, False, [0] * len(stride), groups,
                         mask)
        assert ref == fast


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_and_its_backward(training):
    x = lambda: torch.empty(4, 3, 5, 5)  # noqa: E731
    c = lambda: torch.empty(3)  # noqa: E731
    ref, fast = both(aten.native_batch_norm.default, x, c, c, c, c, training, 0.1, 1e-5)
    assert ref == fast
    for mask in ([True, True, True], [True, False, False]):
        ref, fast = both(aten.native_batch_norm_backward.default, x, x, c, c, c, c, c, training, 1e-5, mask)
        assert ref == fast


def test_copies_keep_strides_and_inplace_ops_return_self():
    ref, fast = both(aten._to_copy.default, lambda: torch.empty(4, 6).t())
    assert ref == fast
    ref, fast = both(aten.clone.default, lambda: torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last))
    assert ref == fast
    with FakeTensorMode():
        x = torch.empty(3, 4)
        assert FAST_FAKE[aten.add_.Tensor](x, torch.empty(3, 4)) is x
        assert FAST_FAKE[aten.add_.Tensor](x, torch.empty(4)) is NotImplemented        # broadcasting: let torch check
        assert FAST_FAKE[aten.add_.Tensor](x.long(), torch.empty(3, 4)) is NotImplemented  # float into int
        assert FAST_FAKE[aten.clone.default](x.t()[::2]) is NotImplemented            # not dense
