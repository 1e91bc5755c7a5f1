"""``torch.einsum`` as older PyTorch lowers it, for estimates that target such a release.

Why: einsum is a composition of permutes, reshapes and ``bmm`` (``aten/src/ATen/native/
Linear.cpp``: ``einsum`` and ``sumproduct_pair``), and how it composes them changed. Since
:data:`SWAPPING_FROM`, ``sumproduct_pair`` may swap its two operands; before, it always
computed ``bmm(left, right)`` in operand order. For a linear layer written
``einsum(W, x, "o i, ... i -> ... o")`` the old lowering returns the output as a permuted view
of ``bmm(W, xᵀ)`` (the last dim not the fastest), and its backward copies the input's
gradient rather than the weight's: the layout then decides which CUDA reductions need
staging buffers and which copies are made (``benchmarks/recordings.py``, the kk recordings
of torch 2.6). The tracer runs the installed torch's einsum; with an older target version it
runs this port instead. It is ``Linear.cpp``'s ``einsum`` and ``sumproduct_pair`` line for
line (without symbolic sizes), as they were before the swap; run on torch 2.6.0 it makes
the same ops, shapes and strides as 2.6.0's own einsum, forward and backward.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import torch

# The first release whose sumproduct_pair may swap its operands, found by running
# einsum(W, x, "oi,...i->...o") under a dispatch mode with the released wheels: 2.6.0 and
# 2.8.0 compute bmm(W, x^T), 2.9.0 and 2.10.0 bmm(x, W^T).
SWAPPING_FROM = (2, 9)

_LETTERS = 26
_TOTAL = _LETTERS * 2
_ELLIPSIS = _TOTAL


def _subscript(label: str) -> int:
    return ord(label) - ord("A") if label.isupper() else ord(label) - ord("a") + _LETTERS


def sumproduct_pair(left: torch.Tensor, right: torch.Tensor, sum_dims_: Sequence[int], keepdim: bool) -> torch.Tensor:
    """``(left * right).sum(sum_dims_)`` through one ``bmm``, operands in order."""
    if left.dim() != right.dim():
        raise RuntimeError("number of dimensions must match")
    if not sum_dims_:
        return torch.mul(left, right)
    dim = left.dim()
    sum_dims = {d % dim for d in sum_dims_}
    lro: list[int] = []
    lo: list[int] = []
    ro: list[int] = []
    lro_size = lo_size = ro_size = sum_size = 1
    for i in range(dim):
        sl, sr = left.size(i) != 1, right.size(i) != 1
        if i in sum_dims:
            if sl and sr:
                if left.size(i) != right.size(i):
                    raise RuntimeError("non-broadcast dimensions must match")
                sum_size *= left.size(i)
            elif sl:
                left = left.sum(i, True)
            elif sr:
                right = right.sum(i, True)
        elif sl and sr:
            if left.size(i) != right.size(i):
                raise RuntimeError("non-broadcast dimensions must match")
            lro.append(i)
            lro_size *= left.size(i)
        elif sl:
            lo.append(i)
            lo_size *= left.size(i)
        else:
            ro.append(i)
            ro_size *= right.size(i)
    sums = list(sum_dims_)
    out_size = [left.size(d) for d in lro] + [left.size(d) for d in lo] + [1] * len(sums) + [right.size(d) for d in ro]
    lperm = lro + lo + sums + ro
    rperm = lro + sums + ro + lo
    operm = [-1] * (len(lro) + len(lo) + len(sums) + len(ro))
    for i, d in enumerate(lro + lo + sums + ro):
        operm[d] = i
    left = left.permute(lperm).reshape(lro_size, lo_size, sum_size)
    right = right.permute(rperm).reshape(lro_size, sum_size, ro_size)
    result = torch.bmm(left, right)
    result = result.view(out_size).permute(operm)
    if not keepdim:
        sizes = list(result.shape)
        for i in range(dim - 1, -1, -1):
            if i in sum_dims:
                del sizes[i]
        result = result.view(sizes)
    return result


def einsum(equation: str, operands: Sequence[torch.Tensor], path: Sequence[int] | None = None) -> torch.Tensor:
    """``torch.einsum(equation, *operands)`` composed as before :data:`SWAPPING_FROM`."""
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    num_ops = len(operands)
    arrow = equation.find("->")
    lhs = equation if arrow < 0 else equation[:arrow]
    op_labels: list[list[int]] = [[] for _ in range(num_ops)]
    cur = 0
    i = 0
    while i < len(lhs):
        c = lhs[i]
        if c == " ":
            pass
        elif c == ".":
            if lhs[i:i + 3] != "...":
                raise RuntimeError(f"einsum(): found '.' for operand {cur} that is not part of any ellipsis")
            op_labels[cur].append(_ELLIPSIS)
            i += 2
        elif c == ",":
            cur += 1
            if cur >= num_ops:
                raise RuntimeError("einsum(): fewer operands were provided than specified in the equation")
        elif c.isalpha():
            op_labels[cur].append(_subscript(c))
        else:
            raise RuntimeError(f"einsum(): invalid subscript given at index {i} in the equation string, "
                               "subscripts must be in [a-zA-Z]")
        i += 1
    if cur != num_ops - 1:
        raise RuntimeError("einsum(): more operands were provided than specified in the equation")

    label_count = [0] * _TOTAL
    ell_num_dim = 0
    for k, op in enumerate(operands):
        nlabels = len(op_labels[k])
        if _ELLIPSIS in op_labels[k]:
            nlabels -= 1
            ell_num_dim = max(ell_num_dim, op.dim() - nlabels)
        for s in op_labels[k]:
            if s != _ELLIPSIS:
                label_count[s] += 1

    label_perm_index = [-1] * _TOTAL
    perm_index = 0
    ell_index = 0
    ell_in_output = False
    if arrow < 0:
        perm_index = ell_num_dim
        ell_in_output = True
        for s in range(_TOTAL):
            if label_count[s] == 1:
                label_perm_index[s] = perm_index
                perm_index += 1
    else:
        rhs = equation[arrow + 2:]
        i = 0
        while i < len(rhs):
            c = rhs[i]
            if c == ".":
                ell_index = perm_index
                perm_index += ell_num_dim
                ell_in_output = True
                i += 2
            elif c.isalpha():
                s = _subscript(c)
                if label_count[s] == 0 or label_perm_index[s] != -1:
                    raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the output"
                                       if label_perm_index[s] > -1 else
                                       f"einsum(): output subscript {c} does not appear in the equation for any "
                                       "input operand")
                label_perm_index[s] = perm_index
                perm_index += 1
            i += 1
    out_num_dim = perm_index
    if not ell_in_output:
        ell_index = perm_index
        perm_index += ell_num_dim
    for s in range(_TOTAL):
        if label_count[s] > 0 and label_perm_index[s] == -1:
            label_perm_index[s] = perm_index
            perm_index += 1

    dim_counts = [0] * perm_index
    ops: deque[torch.Tensor] = deque()
    for k, operand in enumerate(operands):
        op = operand
        permutation = [-1] * perm_index
        dim = 0
        for s in op_labels[k]:
            if s == _ELLIPSIS:
                ndim = operand.dim() - (len(op_labels[k]) - 1)
                for j in range(ell_num_dim - ndim, ell_num_dim):
                    if op.size(dim) != 1:
                        dim_counts[ell_index + j] += 1
                    permutation[ell_index + j] = dim
                    dim += 1
            elif permutation[label_perm_index[s]] == -1:
                if op.size(dim) != 1:
                    dim_counts[label_perm_index[s]] += 1
                permutation[label_perm_index[s]] = dim
                dim += 1
            else:  # a repeated label: its diagonal
                prev = permutation[label_perm_index[s]]
                op = op.diagonal(0, prev, dim).movedim(-1, prev)
        for n, val in enumerate(permutation):
            if val == -1:
                op = op.unsqueeze(dim)
                permutation[n] = dim
                dim += 1
        ops.append(op.permute(permutation))

    steps = list(path or ())
    while len(ops) > 1:
        i, j = 0, 1
        if path is not None:
            i, j = steps.pop(0), steps.pop(0)
            if j < i:
                i, j = j, i
        a, b = ops[i], ops[j]
        del ops[j]
        del ops[i]
        sum_dims: list[int] = []
        a_sum: list[int] = []
        b_sum: list[int] = []
        for d in range(out_num_dim, perm_index):
            if a.size(d) != 1 and b.size(d) != 1:
                dim_counts[d] -= 1
                if dim_counts[d] == 1:
                    sum_dims.append(d)
                    dim_counts[d] = 0
            elif dim_counts[d] == 1:
                if a.size(d) != 1:
                    a_sum.append(d)
                    dim_counts[d] = 0
                elif b.size(d) != 1:
                    b_sum.append(d)
                    dim_counts[d] = 0
        if a_sum:
            a = a.sum(a_sum, True)
        if b_sum:
            b = b.sum(b_sum, True)
        if path is not None:
            ops.append(sumproduct_pair(a, b, sum_dims, True))
        else:
            ops.appendleft(sumproduct_pair(a, b, sum_dims, True))

    if perm_index - out_num_dim > 0:
        if num_ops > 1:
            sizes = list(ops[0].shape)
            for d in range(perm_index - 1, out_num_dim - 1, -1):
                del sizes[d]
            return ops[0].view(sizes)
        return ops[0].sum(list(range(out_num_dim, perm_index)))
    return ops[0]


def handler(autocast: Any) -> Callable[[Any, tuple, dict], Any]:
    """The device mode's entry for ``torch.einsum`` when the target release is older: the
    equation form with tensors (the sublist form and opt_einsum's paths go to torch).
    ``autocast``: the tracer's CUDA autocast policy. In an autocast region einsum is one op
    of the lower-precision list: its operands are cast once (weights from the cache), then
    its parts run with autocast off, as the ``einsum`` autocast kernel does."""
    from xmem_engine.tracing.kernels.autocast_policy import AUTOCAST_CPU

    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        if not args or not isinstance(args[0], str) or kwargs:
            return func(*args, **kwargs)
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if len(operands) > 2 or not all(isinstance(t, torch.Tensor) for t in operands):
            return func(*args, **kwargs)  # 3+ operands: torch may compute an opt_einsum path
        if not torch.is_autocast_enabled("cuda"):
            return einsum(args[0], operands)
        low = torch.get_autocast_dtype("cuda")
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_CPU):
            cast = [autocast.cached_cast(low, t, low) for t in operands]
            return einsum(args[0], cast)

    return run
