"""Shortcuts for hot aten ops under fake tensors.

FakeTensorMode runs every op through Python: a cache lookup (hashing every argument,
rebuilding the cached output: 0.15-0.4 ms), often a meta kernel or a Python decomposition
(batch norm takes milliseconds), and the wrapping of each output. For the ops a training
step is made of - convolution, batch norm and their backwards, copies, dropout, elementwise
ops on contiguous tensors of one dtype, in-place ops that cannot change their operand,
the optimizers' foreach ops - the tracer states the outputs and makes them directly as
meta tensors wrapped the way FakeTensorMode wraps them; views, mm, bmm and softmax run
their C++ meta kernels on the fake tensors. Each shortcut returns ``NotImplemented`` for
any case it does not cover (type promotion, other layouts, broadcasting errors, constants),
and the op then takes FakeTensorMode's own path. ``tests/tracing/test_tracer_fastpaths.py`` checks
the outputs against FakeTensorMode's; whole traces stay event-for-event the same.

Shortcuts run inside the tracer's dispatch mode with FakeTensorMode active, so the
factories they call make fake tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._prims_common import make_channels_last_3d_strides_for, make_channels_last_strides_for
from torch._subclasses.fake_tensor import FakeTensor

from xmem_engine.tracing.kernels.autocast_policy import aten_op
from xmem_engine.tracing.kernels.conv_layout import cuda_layout
from xmem_engine.tracing.torch_compat import is_non_overlapping_and_dense
from xmem_engine.tracing.ops import register

_PLAIN_FLOATS = (torch.float32, torch.float64)
_CPU = torch.device("cpu")


def fake_empty(mode: Any, size: Any, stride: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """A fresh fake tensor of ``mode`` on ``device`` (contiguous where ``stride`` is None), made as
    FakeTensorMode makes a factory's output (a meta tensor, wrapped) but past the modes, so
    nothing records or caches it."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        meta = (torch.empty(size, dtype=dtype, device="meta") if stride is None
                else torch.empty_strided(size, stride, dtype=dtype, device="meta"))
    return FakeTensor(mode, meta, device)


def _empty(size: Any, stride: Any, dtype: torch.dtype, like: Any = None, device: Any = None) -> Any:
    """A fresh fake tensor as FakeTensorMode makes a factory's output, without its dispatch
    cache: hashing the arguments and rebuilding the cached output cost 0.3-0.4 ms a call,
    several times a meta kernel's. On ``like``'s device, else ``device`` (the host if None)."""
    if type(like) is FakeTensor:
        mode, device = like.fake_mode, like.fake_device
    else:
        mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        if mode is None:
            return torch.empty_strided(size, stride, dtype=dtype, device="cpu")
        device = torch.device(device) if device is not None else _CPU
    return fake_empty(mode, size, stride, dtype, device)


def _on_meta(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """``func`` on the fake tensors' meta tensors: what ``with in_kernel_invocation_manager(mode)``
    does (torch 2.10-2.14 alike), as a plain call; the generator-based context manager cost
    more than the view kernel it wrapped (650 views a token while ``generate()`` decodes)."""
    prev = mode.in_kernel_invocation
    with torch._C._DisableTorchDispatch():
        mode.in_kernel_invocation = True
        with torch._C._PreserveDispatchKeyGuard():
            torch._C._set_meta_in_tls_dispatch_include(True)
            try:
                return func(*args, **kwargs)
            finally:
                mode.in_kernel_invocation = prev


def _contiguous(shape: Any) -> tuple:
    """Contiguous strides for ``shape`` (``make_contiguous_strides_for`` without its
    symbolic-size checks, which cost 0.1 ms a call)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _new_empty(x: torch.Tensor, size: Any) -> Any:
    """``x.new_empty(size)``: contiguous, ``x``'s dtype."""
    return _empty(size, _contiguous(size), x.dtype, x)


def _empty_like(x: torch.Tensor) -> Any:
    """``torch.empty_like(x)`` (``preserve_format``): ``x``'s strides when dense."""
    out = _dense_like(x, None)
    return torch.empty_like(x) if out is NotImplemented else out


def _plain(x: Any) -> bool:
    """A fake tensor the shortcuts may read: no kept constant (FakeTensorMode keeps small
    literal tensors' values and computes with them), not a subclass, dense (a sparse one's
    meta kernels are missing)."""
    return type(x) is FakeTensor and x.constant is None and x.layout is torch.strided


def _fast_batch_norm(input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                     training: bool, momentum: float, eps: float) -> Any:
    """Fake ``native_batch_norm``: the outputs the CPU kernel allocates, without running
    FakeTensorMode's Python decomposition (a few ms a call; the running-stat update writes
    in place and allocates nothing)."""
    if input.dtype not in _PLAIN_FLOATS or input.dim() < 2:
        return NotImplemented
    c = input.shape[1]
    stats = (c,) if training or running_mean is None else (0,)
    return _empty_like(input), _new_empty(input, stats), _new_empty(input, stats)


def _fast_batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: Any, running_mean: Any,
                              running_var: Any, save_mean: Any, save_invstd: Any, train: bool, eps: float,
                              output_mask: list[bool]) -> Any:
    """Fake ``native_batch_norm_backward``: grad_input like the input, per-channel grads."""
    if input.dtype not in _PLAIN_FLOATS or grad_out.dtype != input.dtype or input.dim() < 2:
        return NotImplemented
    c = input.shape[1]
    return (
        _empty_like(input) if output_mask[0] else None,
        _new_empty(input, (c,)) if output_mask[1] else None,
        _new_empty(input, (c,)) if output_mask[2] else None,
    )


def _dense_like(x: torch.Tensor, dtype: torch.dtype | None) -> Any:
    """A fresh fake tensor with ``x``'s sizes and strides (``_to_copy`` / ``clone`` with
    ``preserve_format`` on a non-overlapping, dense tensor), made by one cached factory call
    instead of a conversion of ``x`` (a real ``x`` costs FakeTensorMode a meta copy)."""
    if x.layout != torch.strided or not is_non_overlapping_and_dense(x):
        return NotImplemented
    return _empty(x.size(), x.stride(), dtype or x.dtype, x)


def _fast_to_copy(x: torch.Tensor, *, dtype: Any = None, layout: Any = None, device: Any = None,
                  pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Any:
    if (layout not in (None, torch.strided) or (device is not None and torch.device(device).type != "cpu")
            or memory_format not in (None, torch.preserve_format)):
        return NotImplemented
    return _dense_like(x, dtype)


def _fast_clone(x: torch.Tensor, *, memory_format: Any = None) -> Any:
    if memory_format is torch.contiguous_format and x.layout == torch.strided:  # ``x.contiguous()``
        return _new_empty(x, x.shape)
    if memory_format not in (None, torch.preserve_format):
        return NotImplemented
    return _dense_like(x, None)


def _conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _in_layout(size: Any, fmt: torch.memory_format, like: torch.Tensor) -> Any:
    """A fresh fake tensor of ``size`` laid out ``fmt`` (contiguous or channels-last)."""
    if fmt is torch.contiguous_format:
        return _new_empty(like, size)
    make = make_channels_last_strides_for if len(size) == 4 else make_channels_last_3d_strides_for
    return _empty(size, make(size), like.dtype, like)


def _fast_convolution(input: torch.Tensor, weight: torch.Tensor, bias: Any, stride: list, padding: list,
                      dilation: list, transposed: bool, output_padding: list, groups: int) -> Any:
    """Fake ``convolution`` (not transposed, fp32/fp64, both operands dense in the layout cuDNN
    works in): the output's shape by the usual formula, laid out as cuDNN lays it out
    (``conv_layout.cuda_layout``), without FakeTensorMode's meta kernel."""
    spatial = input.dim() - 2
    if (transposed or input.dtype not in _PLAIN_FLOATS or weight.dtype != input.dtype or spatial < 1
            or not (len(stride) == len(padding) == len(dilation) == spatial) or weight.dim() != input.dim()
            or input.shape[1] != weight.shape[1] * groups):
        return NotImplemented
    fmt = cuda_layout(input, weight)
    if not input.is_contiguous(memory_format=fmt) or not weight.is_contiguous(memory_format=fmt):
        return NotImplemented
    out = [input.shape[0], weight.shape[0]]
    for i in range(spatial):
        n = _conv_out_size(input.shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i])
        if n <= 0:
            return NotImplemented  # let the meta kernel raise its error
        out.append(n)
    return _in_layout(out, fmt, input)


def _fast_convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                               bias_sizes: Any, stride: list, padding: list, dilation: list, transposed: bool,
                               output_padding: list, groups: int, output_mask: list[bool]) -> Any:
    """Fake ``convolution_backward``: gradients shaped like input, weight and bias, the first two
    in cuDNN's layout."""
    if (input.dtype not in _PLAIN_FLOATS or grad_output.dtype != input.dtype or weight.dtype != input.dtype
            or weight.dim() != input.dim()):
        return NotImplemented
    fmt = cuda_layout(input, weight)
    if not all(t.is_contiguous(memory_format=fmt) for t in (input, weight, grad_output)):
        return NotImplemented
    return (
        _in_layout(input.shape, fmt, input) if output_mask[0] else None,
        _in_layout(weight.shape, fmt, weight) if output_mask[1] else None,
        _new_empty(weight, (weight.shape[1] * groups if transposed else weight.shape[0],)) if output_mask[2] else None,
    )


def _fast_threshold_backward(grad_output: torch.Tensor, self: torch.Tensor, threshold: Any) -> Any:
    if grad_output.shape != self.shape or grad_output.dtype != self.dtype or not grad_output.is_contiguous() \
            or not self.is_contiguous():
        return NotImplemented
    return _new_empty(grad_output, grad_output.shape)


def _fast_inplace(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """A fake in-place op whose other operands cannot change ``self``'s shape or dtype
    allocates nothing and returns ``self``."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dim() != 0 and a.shape != self.shape:
                return NotImplemented
            if a.dtype != self.dtype and (a.dim() != 0 or a.dtype.is_floating_point != self.dtype.is_floating_point
                                          or a.dtype.is_complex or self.dtype == torch.bool):
                return NotImplemented
        elif not isinstance(a, (int, float, bool)):
            return NotImplemented
    return self


def _same_lists(lists: list, n: int, like: list) -> bool:
    """Every tensor list has ``n`` tensors shaped and typed like ``like``'s; scalar lists have
    ``n`` numbers; anything else (a tensor of scalars, mixed dtypes) is not covered."""
    for a in lists:
        if isinstance(a, torch.Tensor):
            return False
        if isinstance(a, (list, tuple)):
            if len(a) != n:
                return False
            for i, x in enumerate(a):
                if isinstance(x, torch.Tensor):
                    if x.shape != like[i].shape or x.dtype != like[i].dtype:
                        return False
                elif not isinstance(x, (int, float, bool)):
                    return False
        elif a is not None and not isinstance(a, (int, float, bool)):
            return False
    return True


def _fast_foreach_inplace(self: list, *args: Any, **kwargs: Any) -> Any:
    """Fake in-place ``_foreach_*_`` (the optimizers' steps): with operands shaped and typed
    like ``self`` nothing is allocated and nothing returned. One cache lookup per list op
    costs FakeTensorMode the hashing of every tensor in it, several ms a step."""
    if (not isinstance(self, (list, tuple)) or not all(isinstance(t, torch.Tensor) and t.is_floating_point()
                                                         for t in self)
            or not _same_lists([*args, *kwargs.values()], len(self), self)):
        return NotImplemented
    return None


def _fast_foreach_unary(self: list) -> Any:
    """Fake out-of-place unary ``_foreach_*`` (Adam's ``_foreach_sqrt``): a new tensor like
    each input, allocated in list order as the CUDA kernel does."""
    if not isinstance(self, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in self):
        return NotImplemented
    out = [_dense_like(t, None) for t in self]
    return NotImplemented if any(o is NotImplemented for o in out) else out


_FOREACH_INPLACE = (
    "_foreach_add_.Scalar", "_foreach_add_.List", "_foreach_add_.ScalarList", "_foreach_sub_.Scalar",
    "_foreach_sub_.List", "_foreach_mul_.Scalar", "_foreach_mul_.List", "_foreach_mul_.ScalarList",
    "_foreach_div_.Scalar", "_foreach_div_.List", "_foreach_div_.ScalarList", "_foreach_lerp_.Scalar",
    "_foreach_lerp_.List", "_foreach_addcmul_.Scalar", "_foreach_addcmul_.ScalarList",
    "_foreach_addcdiv_.Scalar", "_foreach_addcdiv_.ScalarList", "_foreach_sqrt_.default",
    "_foreach_zero_.default", "_foreach_maximum_.List", "_foreach_clamp_max_.Scalar",
)
_FOREACH_UNARY = ("_foreach_sqrt.default", "_foreach_neg.default", "_foreach_abs.default",
                  "_foreach_sign.default")


def _viewer(func: Any) -> Callable[..., Any]:
    """Fake view op (``view``, ``t``, ``transpose``, ``detach``...): the meta kernel on the
    tensor itself, wrapped as FakeTensorMode wraps it, without the dispatch cache's hashing
    of the input and rebuilding of the output (0.3 ms a view; T5's step makes thousands).
    Only plain fake tensors: one holding a constant (FakeTensorMode keeps small literal
    tensors' values) or with symbolic sizes takes FakeTensorMode's path."""

    def view(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not _plain(x) or kwargs:
            return NotImplemented
        for a in args:
            if a is not None and type(a) is not int and not isinstance(a, torch.dtype) and not (
                    isinstance(a, (list, tuple)) and all(type(i) is int for i in a)):
                return NotImplemented
        mode = x.fake_mode
        out = _on_meta(mode, func, x, *args)
        if out.device.type != "meta":  # inside vmap (functorch's batch-dim removal): not a meta kernel's output
            return NotImplemented
        return FakeTensor(mode, out, x.fake_device)

    return view


def _computer(func: Any) -> Callable[..., Any]:
    """Fake op with a C++ meta kernel that makes fresh outputs (``mm``, ``bmm``, ``_softmax``):
    the meta kernel on the fake tensors themselves, each output wrapped as FakeTensorMode wraps
    it, without the cache's hashing of every argument and rebuilding of every output (about
    0.4 ms an op, most of a transformer step's tracing). Only plain fake tensors of one mode
    and device, and no tensor lists; anything else takes FakeTensorMode's path."""

    def compute(*args: Any, **kwargs: Any) -> Any:
        like = None
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if not _plain(a):
                    return NotImplemented
                if like is None:
                    like = a
                elif a.fake_mode is not like.fake_mode or a.fake_device != like.fake_device:
                    return NotImplemented
            elif isinstance(a, (list, tuple)) and any(not isinstance(i, (int, float, bool)) for i in a):
                return NotImplemented
            elif isinstance(a, torch.SymInt):
                return NotImplemented
        if like is None or kwargs.get("device") is not None:
            return NotImplemented
        mode, device = like.fake_mode, like.fake_device
        out = _on_meta(mode, func, *args, **kwargs)
        if isinstance(out, tuple):
            if any(o.device.type != "meta" for o in out):
                return NotImplemented
            return tuple(FakeTensor(mode, o, device) for o in out)
        return FakeTensor(mode, out, device) if out.device.type == "meta" else NotImplemented

    return compute


def _matmul_out(dims: int) -> Callable[..., Any]:
    """``mm.out``/``bmm.out`` (Inductor's wrappers call them into buffers they planned):
    ``out`` itself when it already has the product's size and the operands' dtype, as the
    meta kernel returns it then (no resize); anything else takes FakeTensorMode's path."""

    def into(a: Any, b: Any, *, out: Any) -> Any:
        if not (_plain(a) and _plain(b) and _plain(out)) or a.dim() != dims or b.dim() != dims:
            return NotImplemented
        if not (a.dtype == b.dtype == out.dtype) or not (a.fake_device == b.fake_device == out.fake_device):
            return NotImplemented
        sa, sb = a.shape, b.shape
        if any(type(n) is not int for n in (*sa, *sb, *out.shape)) or sa[-1] != sb[-2] or sa[:-2] != sb[:-2]:
            return NotImplemented
        if tuple(out.shape) != (*sa[:-1], sb[-1]):
            return NotImplemented
        return out

    return into


def _fast_empty_strided(size: Any, stride: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
                        pin_memory: Any = None) -> Any:
    """``torch.empty_strided`` (every buffer of Inductor's wrappers) as FakeTensorMode makes it."""
    if layout not in (None, torch.strided) or pin_memory or not _ints(size) or not _ints(stride):
        return NotImplemented
    return _empty(size, stride, dtype or torch.get_default_dtype(), device=device)


def _fast_empty(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
                memory_format: Any = None) -> Any:
    """``torch.empty`` in the contiguous format, as FakeTensorMode makes it."""
    if layout not in (None, torch.strided) or pin_memory or memory_format not in (None, torch.contiguous_format) \
            or not _ints(size):
        return NotImplemented
    return _empty(size, _contiguous(size), dtype or torch.get_default_dtype(), device=device)


def _ints(xs: Any) -> bool:
    return isinstance(xs, (list, tuple)) and all(type(i) is int for i in xs)


def _same_sizes(a: Any, b: Any) -> bool:
    """Sizes equal as written (a symbolic batch's sizes as the same expression), without the
    guard a comparison of two SymInts would add (``tracing/symbolic.py``)."""
    return len(a) == len(b) and all(x is y or (type(x) is type(y) and (
        x == y if type(x) is int else x.node.expr == y.node.expr)) for x, y in zip(a, b))


def _broadcast(shapes: list) -> tuple | None:
    """The broadcast of ``shapes`` (``torch.broadcast_shapes`` is a Python reference that
    costs more than the rest of a shortcut), or None when they do not broadcast."""
    first = shapes[0]
    if not all(type(n) is int for s in shapes for n in s):  # a symbolic batch's sizes: the same ones as they
        # are, else FakeTensorMode's own rules, which guard no more than needed
        return tuple(first) if all(_same_sizes(s, first) for s in shapes) else None
    if all(s == first for s in shapes):
        return tuple(first)
    out = [1] * max(len(s) for s in shapes)
    for s in shapes:
        for i, n in enumerate(s, len(out) - len(s)):
            if n != out[i]:
                if out[i] == 1:
                    out[i] = n
                elif n != 1:
                    return None
    return tuple(out)


def _fast_dropout(input: Any, p: float, train: Any) -> Any:
    """Fake ``native_dropout`` in training: the output and its boolean mask, like the input."""
    if not _plain(input) or not input.is_contiguous() or not input.dtype.is_floating_point or train is not True:
        return NotImplemented
    strides = input.stride()
    return _empty(input.shape, strides, input.dtype, input), _empty(input.shape, strides, torch.bool, input)


def _fast_dropout_backward(grad_output: Any, mask: Any, scale: float) -> Any:
    """Fake ``native_dropout_backward``: a gradient like ``grad_output``."""
    if (not _plain(grad_output) or not grad_output.is_contiguous() or not grad_output.dtype.is_floating_point
            or type(mask) is not FakeTensor or mask.dtype != torch.bool or mask.shape != grad_output.shape):
        return NotImplemented
    return _empty(grad_output.shape, grad_output.stride(), grad_output.dtype, grad_output)


def _pointwise(func: Any, boolean: bool = False) -> Callable[..., Any]:
    """Fake elementwise op (``mul``, ``add``, ``pow``, comparisons) on contiguous tensors of
    one dtype (floating, except for comparisons) and Python numbers: a contiguous output of
    the broadcast shape, as TensorIterator makes it for contiguous operands. Its meta kernel
    is a Python reference slower than FakeTensorMode's cache, so the output is stated, not
    computed. Mixed dtypes, other layouts, broadcasting errors and anything else take
    FakeTensorMode's path."""

    def pointwise(*args: Any, **kwargs: Any) -> Any:
        like = None
        shapes = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if not _plain(a) or not a.is_contiguous() or not (boolean or a.dtype.is_floating_point):
                    return NotImplemented
                if like is None:
                    like = a
                elif a.dtype != like.dtype or a.fake_mode is not like.fake_mode or a.fake_device != like.fake_device:
                    return NotImplemented
                shapes.append(a.shape)
            elif type(a) not in (int, float, str):  # str: gelu's ``approximate``
                return NotImplemented
        if like is None:
            return NotImplemented
        shape = _broadcast(shapes)
        if shape is None:
            return NotImplemented  # FakeTensorMode raises torch's own message
        return _empty(shape, _contiguous(shape), torch.bool if boolean else like.dtype, like)

    return pointwise


# Meta kernels faster than FakeTensorMode's cache (C++ ones); each output checked against
# FakeTensorMode's in tests/tracing/test_tracer_fastpaths.py.
_COMPUTE = ("mm.default", "bmm.default", "_softmax.default", "silu_backward.default", "zeros_like.default",
            "full_like.default", "empty_like.default", "ones_like.default")
_POINTWISE = ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "mul.Scalar", "div.Scalar", "add.Scalar",
              "rsub.Scalar", "pow.Tensor_Scalar", "rsqrt.default", "sqrt.default", "exp.default", "log.default",
              "neg.default", "tanh.default", "tanh_backward.default", "sigmoid.default", "sigmoid_backward.default",
              "gelu.default", "gelu_backward.default", "silu.default", "minimum.default", "maximum.default")
_COMPARISONS = ("ne.Scalar", "eq.Scalar", "gt.Scalar", "lt.Scalar", "ge.Scalar", "le.Scalar")


_VIEWS = ("view.default", "_unsafe_view.default", "t.default", "transpose.int", "detach.default",
          "expand.default", "permute.default", "unsqueeze.default", "squeeze.dim", "select.int",
          "slice.Tensor", "alias.default", "as_strided.default", "view.dtype")


FAST_FAKE: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.convolution.default: _fast_convolution,
    torch.ops.aten.convolution_backward.default: _fast_convolution_backward,
    torch.ops.aten.threshold_backward.default: _fast_threshold_backward,
    torch.ops.aten.relu_.default: _fast_inplace,
    torch.ops.aten.add_.Tensor: _fast_inplace,
    torch.ops.aten.mul_.Tensor: _fast_inplace,
    torch.ops.aten.zero_.default: _fast_inplace,
    torch.ops.aten.fill_.Scalar: _fast_inplace,
    torch.ops.aten._to_copy.default: _fast_to_copy,
    torch.ops.aten.clone.default: _fast_clone,
    torch.ops.aten.native_batch_norm.default: _fast_batch_norm,
    torch.ops.aten.native_batch_norm_backward.default: _fast_batch_norm_backward,
    torch.ops.aten.native_dropout.default: _fast_dropout,
    torch.ops.aten.native_dropout_backward.default: _fast_dropout_backward,
    torch.ops.aten.mm.out: _matmul_out(2),
    torch.ops.aten.bmm.out: _matmul_out(3),
    torch.ops.aten.empty_strided.default: _fast_empty_strided,
    torch.ops.aten.empty.memory_format: _fast_empty,
}
FAST_FAKE.update({op: _fast_foreach_inplace for op in map(aten_op, _FOREACH_INPLACE) if op is not None})
FAST_FAKE.update({op: _fast_foreach_unary for op in map(aten_op, _FOREACH_UNARY) if op is not None})
FAST_FAKE.update({op: _viewer(op) for op in map(aten_op, _VIEWS) if op is not None})
FAST_FAKE.update({op: _computer(op) for op in map(aten_op, _COMPUTE) if op is not None})
FAST_FAKE.update({op: _pointwise(op) for op in map(aten_op, _POINTWISE) if op is not None})
FAST_FAKE.update({op: _pointwise(op, boolean=True) for op in map(aten_op, _COMPARISONS) if op is not None})


register("fake fast path", FAST_FAKE, __name__)
