"""Shortcuts for hot aten ops under fake tensors.

FakeTensorMode runs every op through Python: a cache lookup, often a meta kernel or a
Python decomposition (batch norm takes milliseconds), and the wrapping of each output.
For a few ops whose outputs are easy to state - convolution, batch norm and their
backwards, copies, in-place ops that cannot change their operand - the tracer makes the
outputs directly with one cached factory call. Each shortcut returns ``NotImplemented``
for any case it does not cover (other dtypes, memory layouts, broadcasting), and the op
then takes FakeTensorMode's own path. ``tests/test_tracer_fastpaths.py`` checks the
outputs against FakeTensorMode's.

Shortcuts run inside the tracer's dispatch mode with FakeTensorMode active, so the
factories they call make fake tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch._prims_common

_PLAIN_FLOATS = (torch.float32, torch.float64)


def _fast_batch_norm(input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                     training: bool, momentum: float, eps: float) -> Any:
    """Fake ``native_batch_norm``: the outputs the CPU kernel allocates, without running
    FakeTensorMode's Python decomposition (a few ms a call; the running-stat update writes
    in place and allocates nothing)."""
    if input.dtype not in _PLAIN_FLOATS or input.dim() < 2:
        return NotImplemented
    c = input.shape[1]
    stats = (c,) if training or running_mean is None else (0,)
    return torch.empty_like(input), input.new_empty(stats), input.new_empty(stats)


def _fast_batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: Any, running_mean: Any,
                              running_var: Any, save_mean: Any, save_invstd: Any, train: bool, eps: float,
                              output_mask: list[bool]) -> Any:
    """Fake ``native_batch_norm_backward``: grad_input like the input, per-channel grads."""
    if input.dtype not in _PLAIN_FLOATS or grad_out.dtype != input.dtype or input.dim() < 2:
        return NotImplemented
    c = input.shape[1]
    return (
        torch.empty_like(input) if output_mask[0] else None,
        input.new_empty((c,)) if output_mask[1] else None,
        input.new_empty((c,)) if output_mask[2] else None,
    )


def _dense_like(x: torch.Tensor, dtype: torch.dtype | None) -> Any:
    """A fresh fake tensor with ``x``'s sizes and strides (``_to_copy`` / ``clone`` with
    ``preserve_format`` on a non-overlapping, dense tensor), made by one cached factory call
    instead of a conversion of ``x`` (a real ``x`` costs FakeTensorMode a meta copy)."""
    if x.layout != torch.strided or not torch._prims_common.is_non_overlapping_and_dense_or_false(x):
        return NotImplemented
    return torch.empty_strided(x.size(), x.stride(), dtype=dtype or x.dtype, device="cpu")


def _fast_to_copy(x: torch.Tensor, *, dtype: Any = None, layout: Any = None, device: Any = None,
                  pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Any:
    if (layout not in (None, torch.strided) or (device is not None and torch.device(device).type != "cpu")
            or memory_format not in (None, torch.preserve_format)):
        return NotImplemented
    return _dense_like(x, dtype)


def _fast_clone(x: torch.Tensor, *, memory_format: Any = None) -> Any:
    if memory_format not in (None, torch.preserve_format):
        return NotImplemented
    return _dense_like(x, None)


def _conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _fast_convolution(input: torch.Tensor, weight: torch.Tensor, bias: Any, stride: list, padding: list,
                      dilation: list, transposed: bool, output_padding: list, groups: int) -> Any:
    """Fake ``convolution`` (not transposed, contiguous, fp32/fp64): the output's shape by the
    usual formula, without FakeTensorMode's meta kernel."""
    spatial = input.dim() - 2
    if (transposed or input.dtype not in _PLAIN_FLOATS or weight.dtype != input.dtype or spatial < 1
            or not (len(stride) == len(padding) == len(dilation) == spatial) or weight.dim() != input.dim()
            or not input.is_contiguous() or not weight.is_contiguous()
            or input.shape[1] != weight.shape[1] * groups):
        return NotImplemented
    out = [input.shape[0], weight.shape[0]]
    for i in range(spatial):
        n = _conv_out_size(input.shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i])
        if n <= 0:
            return NotImplemented  # let the meta kernel raise its error
        out.append(n)
    return input.new_empty(out)


def _fast_convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                               bias_sizes: Any, stride: list, padding: list, dilation: list, transposed: bool,
                               output_padding: list, groups: int, output_mask: list[bool]) -> Any:
    """Fake ``convolution_backward``: gradients shaped like input, weight and bias."""
    if (input.dtype not in _PLAIN_FLOATS or grad_output.dtype != input.dtype or weight.dtype != input.dtype
            or not input.is_contiguous() or not weight.is_contiguous() or not grad_output.is_contiguous()):
        return NotImplemented
    return (
        input.new_empty(input.shape) if output_mask[0] else None,
        weight.new_empty(weight.shape) if output_mask[1] else None,
        weight.new_empty((weight.shape[1] * groups if transposed else weight.shape[0],)) if output_mask[2] else None,
    )


def _fast_threshold_backward(grad_output: torch.Tensor, self: torch.Tensor, threshold: Any) -> Any:
    if grad_output.shape != self.shape or grad_output.dtype != self.dtype or not grad_output.is_contiguous() \
            or not self.is_contiguous():
        return NotImplemented
    return grad_output.new_empty(grad_output.shape)


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
}
