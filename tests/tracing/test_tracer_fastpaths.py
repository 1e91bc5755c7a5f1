"""The tracer's fake-mode shortcuts give the same outputs as FakeTensorMode's own kernels."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from xmem_engine.tracing.fake.fake_fastpaths import FAST_FAKE

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
        x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)[:, :, 1:]
        ref, fast = aten.clone.default(x, memory_format=torch.contiguous_format), \
            FAST_FAKE[aten.clone.default](x, memory_format=torch.contiguous_format)
        assert meta(ref) == meta(fast)
    with FakeTensorMode():
        x = torch.empty(3, 4)
        assert FAST_FAKE[aten.add_.Tensor](x, torch.empty(3, 4)) is x
        assert FAST_FAKE[aten.add_.Tensor](x, torch.empty(4)) is NotImplemented        # broadcasting: let torch check
        assert FAST_FAKE[aten.add_.Tensor](x.long(), torch.empty(3, 4)) is NotImplemented  # float into int
        assert FAST_FAKE[aten.clone.default](x.t()[::2]) is NotImplemented            # not dense


def _params():
    return [torch.empty(3, 4), torch.empty(5), torch.empty(2, 2, 2)]


@pytest.mark.parametrize("op, extra", [
    (aten._foreach_add_.Scalar, lambda: (1.0,)),
    (aten._foreach_add_.List, lambda: (_params(),)),
    (aten._foreach_mul_.ScalarList, lambda: ([0.5, 2.0, 3.0],)),
    (aten._foreach_lerp_.Scalar, lambda: (_params(), 0.1)),
    (aten._foreach_addcmul_.Scalar, lambda: (_params(), _params(), 0.01)),
    (aten._foreach_addcdiv_.ScalarList, lambda: (_params(), _params(), [-1e-3, -1e-3, -1e-3])),
    (aten._foreach_div_.ScalarList, lambda: ([2.0, 2.0, 2.0],)),
])
def test_foreach_inplace_ops_allocate_nothing(op, extra):
    with FakeTensorMode():
        self, args = _params(), extra()
        assert op(self, *args) is None  # FakeTensorMode's own answer
        assert FAST_FAKE[op](self, *args) is None


@pytest.mark.parametrize("bad", [
    lambda: ([torch.empty(3, 4), torch.empty(5)],),                      # wrong length
    lambda: ([torch.empty(4, 3), torch.empty(5), torch.empty(2, 2, 2)],),  # wrong shape
    lambda: ([torch.empty(3, 4, dtype=torch.float64), torch.empty(5), torch.empty(2, 2, 2)],),  # dtype
    lambda: (torch.empty(3),),                                          # a tensor of scalars
])
def test_foreach_inplace_leaves_unusual_operands_to_fake_tensor_mode(bad):
    with FakeTensorMode():
        assert FAST_FAKE[aten._foreach_add_.List](_params(), *bad()) is NotImplemented
        ints = [torch.empty(3, dtype=torch.int64)]
        assert FAST_FAKE[aten._foreach_mul_.Scalar](ints, 0.5) is NotImplemented


def test_foreach_sqrt_makes_one_tensor_like_each_input():
    with FakeTensorMode():
        params = _params() + [torch.empty(4, 6).t()]
        reference = [meta(t) for t in aten._foreach_sqrt.default(params)]
        assert [meta(t) for t in FAST_FAKE[aten._foreach_sqrt.default](params)] == reference


def view_meta(t, base):
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device,
            t.untyped_storage()._cdata == base.untyped_storage()._cdata, type(t).__name__)


@pytest.mark.parametrize("op, args", [
    (aten.view.default, ([12, 10],)),
    (aten._unsafe_view.default, ([4, 30],)),
    (aten.t.default, ()),
    (aten.transpose.int, (0, 1)),
    (aten.detach.default, ()),
    (aten.expand.default, ([5, 6, 20],)),
    (aten.permute.default, ([1, 0],)),
    (aten.unsqueeze.default, (1,)),
    (aten.squeeze.dim, (0,)),
    (aten.select.int, (1, -3)),
    (aten.slice.Tensor, (0, 1, None, 2)),
    (aten.alias.default, ()),
    (aten.as_strided.default, ([5, 10], [20, 2], 3)),  # reinterpret_tensor in Inductor's wrappers
    (aten.view.dtype, (torch.int16,)),  # alloc_from_pool's view of a byte pool
])
def test_views_alias_their_input_like_fake_tensor_mode_does(op, args):
    with FakeTensorMode():
        base = torch.empty(6, 20)
        x = base[:, :] if op is not aten.squeeze.dim else base.view(1, 6, 20)
        if op is aten.expand.default:
            x = base[0]
        ref = view_meta(op(x, *args), base)
        out = FAST_FAKE[op](x, *args)
        assert out is not NotImplemented and view_meta(out, base) == ref
        assert out.fake_device == x.fake_device


def test_views_of_fake_constants_and_odd_arguments_take_fake_tensor_modes_path():
    mode = FakeTensorMode()
    literal = mode.fake_tensor_converter.from_real_tensor(mode, torch.tensor([1.0, 2.0, 3.0]), make_constant=True)
    with mode:
        assert literal.constant is not None  # FakeTensorMode keeps its value
        assert FAST_FAKE[aten.view.default](literal, [3, 1]) is NotImplemented
        x = torch.empty(4, 4)
        assert FAST_FAKE[aten.view.default](x, torch.Size([16]), extra=1) is NotImplemented
        assert FAST_FAKE[aten.transpose.int](x, 0, 1.5) is NotImplemented


def _t(*shape, dtype=torch.float32):
    return lambda: torch.empty(shape, dtype=dtype)


def _strided():
    return torch.empty(8, 6).t()  # not contiguous


COMPUTE_CASES = [
    (aten.mm.default, (_t(4, 5), _t(5, 3)), {}),
    (aten.mm.default, (_strided, _t(8, 2)), {}),
    (aten.bmm.default, (_t(2, 4, 5), _t(2, 5, 3)), {}),
    (aten.add.Tensor, (_t(4, 1, 5), _t(3, 1)), {"alpha": 2}),
    (aten.add.Tensor, (_t(4, 5, dtype=torch.float16), _t(5, dtype=torch.float16)), {}),
    (aten.add.Tensor, (_t(4, 5), _t()), {}),
    (aten.sub.Tensor, (_t(4, 5), _t(5)), {}),
    (aten.mul.Tensor, (_t(2, 1, 4), _t(3, 1)), {}),
    (aten.mul.Tensor, (_t(0, 4), _t(4)), {}),
    (aten.div.Tensor, (_t(4, 5, dtype=torch.float64), _t(4, 5, dtype=torch.float64)), {}),
    (aten.mul.Scalar, (_t(3, 4), 2.5), {}),
    (aten.mul.Scalar, (_t(3, 4, dtype=torch.bfloat16), 3), {}),
    (aten.div.Scalar, (_t(3, 4), 3), {}),
    (aten.add.Scalar, (_t(3, 4), 1.5), {}),
    (aten.rsub.Scalar, (_t(3, 4), 1.0), {}),
    (aten.pow.Tensor_Scalar, (_t(3, 4), 2), {}),
    (aten.pow.Tensor_Scalar, (_t(3, 4, dtype=torch.float16), 0.5), {}),
    (aten.rsqrt.default, (_t(3, 4),), {}),
    (aten.sqrt.default, (_t(3),), {}),
    (aten.exp.default, (_t(3, 4),), {}),
    (aten.log.default, (_t(3, 4),), {}),
    (aten.neg.default, (_t(3, 4),), {}),
    (aten.tanh.default, (_t(3, 4),), {}),
    (aten.tanh_backward.default, (_t(3, 4), _t(3, 4)), {}),
    (aten.sigmoid.default, (_t(3, 4),), {}),
    (aten.sigmoid_backward.default, (_t(3, 4), _t(3, 4)), {}),
    (aten.gelu.default, (_t(3, 4),), {"approximate": "tanh"}),
    (aten.gelu_backward.default, (_t(3, 4), _t(3, 4)), {}),
    (aten.silu.default, (_t(3, 4),), {}),
    (aten.silu_backward.default, (_t(3, 4), _t(3, 4)), {}),
    (aten._softmax.default, (_t(2, 3, 4), -1, False), {}),
    (aten._softmax.default, (lambda: torch.empty(2, 3, 4).transpose(1, 2), 1, False), {}),
    (aten.ne.Scalar, (_t(3, 4, dtype=torch.int64), 0), {}),
    (aten.eq.Scalar, (_t(3, 4), 0), {}),
    (aten.gt.Scalar, (_t(3, 4), 0.5), {}),
    (aten.lt.Scalar, (_t(3, 4, dtype=torch.bool), 1), {}),
    (aten.ge.Scalar, (_t(3, 4), 0), {}),
    (aten.le.Scalar, (_t(3, 4), 0), {}),
    (aten.minimum.default, (_t(3, 4), _t(4)), {}),
    (aten.maximum.default, (_t(3, 4), _t(3, 4)), {}),
    (aten.zeros_like.default, (_strided,), {}),
    (aten.zeros_like.default, (_t(3, 4),), {"dtype": torch.float16}),
    (aten.full_like.default, (_t(3, 4), 7), {}),
    (aten.empty_like.default, (lambda: torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),), {}),
    (aten.ones_like.default, (_t(3, 4),), {"memory_format": torch.contiguous_format}),
    (aten.native_dropout.default, (_t(3, 4), 0.1, True), {}),
    (aten.native_dropout_backward.default, (_t(3, 4), _t(3, 4, dtype=torch.bool), 1.1), {}),
]

# Cases the shortcuts leave to FakeTensorMode (type promotion, layouts, errors).
DECLINED_CASES = [
    (aten.add.Tensor, (_t(4, 5, dtype=torch.int64), _t(dtype=torch.float64)), {}),
    (aten.add.Tensor, (_t(4, 5, dtype=torch.float16), _t(4, 5)), {}),
    (aten.add.Tensor, (_strided, _t(8)), {}),
    (aten.mul.Tensor, (lambda: torch.empty(2, 3, 4).permute(2, 0, 1), _t(4, 2, 3)), {}),
    (aten.mul.Tensor, (_t(4, 5), _t(3)), {}),  # not broadcastable: FakeTensorMode's error
    (aten.div.Tensor, (_t(4, 5, dtype=torch.int32), _t(4, 5, dtype=torch.int32)), {}),
    (aten.add.Scalar, (_t(3, 4, dtype=torch.int64), 1.5), {}),
    (aten.mul.Scalar, (_t(3, 4), True), {}),
    (aten.native_dropout.default, (_t(3, 4), 0.1, False), {}),
    (aten.native_dropout.default, (_strided, 0.1, True), {}),
]


@pytest.mark.parametrize("op, args, kwargs", COMPUTE_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(COMPUTE_CASES)])
def test_compute_ops_make_what_fake_tensor_mode_makes(op, args, kwargs):
    with FakeTensorMode():
        args = tuple(a() if callable(a) else a for a in args)
        reference = op(*args, **kwargs)
        fast = FAST_FAKE[op](*args, **kwargs)
        assert fast is not NotImplemented
        assert meta(fast) == meta(reference)
        for f, r in zip(fast if isinstance(fast, tuple) else (fast,), reference if isinstance(reference, tuple) else (reference,)):
            assert f.fake_device == r.fake_device and f.requires_grad == r.requires_grad


@pytest.mark.parametrize("op, args, kwargs", DECLINED_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(DECLINED_CASES)])
def test_compute_ops_leave_type_promotion_and_layouts_to_fake_tensor_mode(op, args, kwargs):
    with FakeTensorMode():
        args = tuple(a() if callable(a) else a for a in args)
        assert FAST_FAKE[op](*args, **kwargs) is NotImplemented


def test_compute_ops_leave_constants_devices_and_tensor_lists_to_fake_tensor_mode():
    mode = FakeTensorMode()
    literal = mode.fake_tensor_converter.from_real_tensor(mode, torch.tensor([1.0, 2.0, 3.0]), make_constant=True)
    with mode:
        x = torch.empty(3)
        assert FAST_FAKE[aten.mul.Tensor](x, literal) is NotImplemented
        assert FAST_FAKE[aten.zeros_like.default](x, device="cpu") is NotImplemented
        assert FAST_FAKE[aten.mul.Scalar](2.0, 3.0) is NotImplemented  # no tensor at all
    real = torch.ones(3)
    with FakeTensorMode():
        assert FAST_FAKE[aten.add.Tensor](torch.empty(3), real) is NotImplemented
        with pytest.raises(RuntimeError):  # the meta kernel's own shape check
            FAST_FAKE[aten.mm.default](torch.empty(2, 3), torch.empty(4, 5))


@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (3, 4)], [(4, 1, 5), (3, 1)], [(0, 4), (4,)], [(1,), ()],
                                    [(2, 1), (1, 3), (1, 1, 1)], [(5, 0), (1, 1)], [(3,), (4,)], [(2, 3), (3, 3)]])
def test_broadcast_matches_torch(shapes):
    from xmem_engine.tracing.fake.fake_fastpaths import _broadcast
    try:
        expected = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        expected = None
    assert _broadcast([torch.Size(s) for s in shapes]) == expected


@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4), (0, 5), (4, 0, 2), (1, 1)])
def test_contiguous_strides_match_torch(shape):
    from xmem_engine.tracing.fake.fake_fastpaths import _contiguous

    assert _contiguous(shape) == tuple(torch._prims_common.make_contiguous_strides_for(shape))
    assert _contiguous(shape) == torch.empty(shape).stride()


def test_matmul_into_a_planned_buffer_returns_the_buffer_as_fake_tensor_mode_does():
    with FakeTensorMode():
        a, b, out = torch.empty(4, 5), torch.empty(5, 3), torch.empty(4, 3)
        assert aten.mm.out(a, b, out=out) is out
        assert FAST_FAKE[aten.mm.out](a, b, out=out) is out
        a3, b3, out3 = torch.empty(2, 4, 5), torch.empty(2, 5, 3), torch.empty(2, 4, 3)
        assert aten.bmm.out(a3, b3, out=out3) is out3
        assert FAST_FAKE[aten.bmm.out](a3, b3, out=out3) is out3
        # a buffer of another size (the meta kernel resizes it), dtype or mismatched operands
        for args, out_ in (((a, b), torch.empty(4, 4)), ((a, b), torch.empty(4, 3, dtype=torch.float16)),
                           ((a, torch.empty(4, 3)), torch.empty(4, 3)), ((a3, b), out)):
            assert FAST_FAKE[aten.mm.out if args[0].dim() == 2 and args[1].dim() == 2 else aten.bmm.out](
                *args, out=out_) is NotImplemented


@pytest.mark.parametrize("op, args, kwargs", [
    (aten.empty_strided.default, ([3, 4], [1, 3]), {"dtype": torch.bfloat16, "device": "cuda"}),
    (aten.empty_strided.default, ([2, 0, 5], [5, 5, 1]), {}),
    (aten.empty.memory_format, ([3, 4, 5],), {"dtype": torch.uint8, "device": torch.device("cuda", 0)}),
    (aten.empty.memory_format, ([7],), {"memory_format": torch.contiguous_format}),
])
def test_factories_make_what_fake_tensor_mode_makes(op, args, kwargs):
    with FakeTensorMode():
        reference = op(*args, **kwargs)
        fast = FAST_FAKE[op](*args, **kwargs)
    assert fast is not NotImplemented and meta(fast) == meta(reference)
    assert fast.fake_device == reference.fake_device and type(fast) is type(reference)
    assert fast.requires_grad == reference.requires_grad


def test_factories_leave_other_layouts_and_formats_to_fake_tensor_mode():
    with FakeTensorMode():
        assert FAST_FAKE[aten.empty.memory_format]([2, 3, 4, 5], memory_format=torch.channels_last) is NotImplemented
        assert FAST_FAKE[aten.empty_strided.default]([2], [1], pin_memory=True) is NotImplemented
        assert FAST_FAKE[aten.empty.memory_format]([2], layout=torch.sparse_coo) is NotImplemented
