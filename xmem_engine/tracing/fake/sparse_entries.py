"""Sparse COO tensors in fake mode, with their entries: sparse embedding gradients and what
an optimizer makes of them.

Why: FakeTensorMode runs these ops through meta kernels, and a meta sparse tensor keeps no
entries. ``nn.EmbeddingBag(sparse=True)``'s gradient took no memory (a recommendation model's
step was estimated 96 MiB low, silently), and ``nn.Embedding(sparse=True)``'s stopped fake mode
at its gradient's ``clone``. On the GPU these are ATen's composite code, the same on the CPU
(``Embedding.cpp``, ``EmbeddingBag.cpp``, ``SparseTensor.cpp``): each rule below makes the
sparse tensor of fake indices and values of the sizes that code gives them, so the tracer
records them as the GPU allocates them.

* ``clone``: new indices and values.
* ``_embedding_bag_backward`` (``sparse=True``) and ``_embedding_bag_sparse_backward``: one
  entry per looked-up index; values are the bags' gradient rows, ``grad.index_select(0,
  offset2bag)`` (a new tensor), indices the lookups themselves (a view; int32 ones copied to
  int64). With a ``padding_idx`` the padded lookups are dropped, which only values can say:
  every lookup is taken to be kept (an upper bound), and the two masked copies are made.
* ``sparse_mask`` of a dense tensor (SparseAdam's state read at the gradient's entries): new
  indices and values, one per entry of the mask.
* ``_coalesce``: how many distinct indices there are is a value; every index is taken to be
  distinct (an upper bound, noted). The CUDA kernel (``sparse/cuda/SparseCUDATensor.cu``)
  keeps its flattened copy of the indices as the result's and makes the values anew; its
  two index-sized scratch tensors are ``kernels/cuda_temporaries.py``'s (``coalesce_scratch``).

Anything else (CSR, hybrid layouts of other ops) keeps FakeTensorMode's path, where the
tracer's check of lost entries sends it to real mode (``alloc_mode._lost_entries``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from xmem_engine.tracing.symbolic import hint
from xmem_engine.tracing.ops import register

_aten = torch.ops.aten
_COO = torch.sparse_coo
_MEAN = 1  # EmbeddingBagMode::MEAN


def _coo(indices: torch.Tensor, values: torch.Tensor, size: Any, coalesced: bool) -> torch.Tensor:
    """The sparse tensor made of fake ``indices`` and ``values`` (FakeTensorMode keeps them)."""
    sparse_dim = indices.shape[0]
    return _aten._sparse_coo_tensor_with_dims_and_tensors.default(
        sparse_dim, len(size) - sparse_dim, list(size), indices, values, dtype=values.dtype, layout=_COO,
        device=values.device, pin_memory=False, is_coalesced=coalesced)


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by name, defaults filled in."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _clone(guesses: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    if x.layout is not _COO:
        return NotImplemented
    return _coo(x._indices().clone(), x._values().clone(), x.shape, x.is_coalesced())


def _embedding_bag_backward(guesses: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    if "sparse" in a and not a["sparse"]:
        return NotImplemented  # the dense gradient: FakeTensorMode's own path
    if a["scale_grad_by_freq"]:
        return NotImplemented  # rescaled by lookup counts: not modelled (its entries are lost, so real mode)
    grad, indices, offset2bag = a["grad"], a["indices"], a["offset2bag"]
    if offset2bag.numel() == 0 and indices.numel():  # the CPU forward's (meta's) fast path keeps none
        offset2bag = a["offsets"].new_zeros((indices.numel(),))  # CUDA's forward made it: not a new tensor
    values = grad.index_select(0, offset2bag)
    if a["mode"] == _MEAN:  # apply_bag_size_backward: in place, after a small per-bag factor
        values.mul_((1 / a["bag_size"].to(values.dtype)).unsqueeze(1).index_select(0, offset2bag))
    if a["per_sample_weights"] is not None:
        values.mul_(a["per_sample_weights"].unsqueeze(1))
    padding_idx = a["padding_idx"]
    if padding_idx is not None and padding_idx >= 0:  # embedding_sparse_backward's masked copies
        n = indices.numel()
        guesses.decide("a sparse embedding gradient's entries", f"{hint(n):,} (no lookup of the padding index)",
                       kind="size")
        indices, values = indices.reshape(-1).clone(), values.clone()
    index = indices.reshape(1, -1)
    if index.dtype != torch.long:
        index = index.to(torch.long)
    return _coo(index, values.reshape(-1, grad.shape[-1]), (a["num_weights"], grad.shape[-1]), False)


def _sparse_mask(guesses: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    t, mask = args[0], args[1]
    if t.layout is not torch.strided or mask.layout is not _COO:
        return NotImplemented
    indices = mask._indices()
    nnz, sparse_dim = indices.shape[1], indices.shape[0]
    values = t.new_empty((nnz, *t.shape[sparse_dim:]))
    return _coo(indices.clone(), values, t.shape, mask.is_coalesced())


def _coalesce(guesses: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    if x.layout is not _COO:
        return NotImplemented
    indices, values = x._indices(), x._values()
    nnz = indices.shape[1]
    if nnz < 2:  # a copy, marked coalesced
        return _coo(indices.clone(), values.clone(), x.shape, True)
    guesses.decide("coalesce's entries", f"{hint(nnz):,} (every index distinct)", kind="size")
    flat = indices.new_empty((nnz,))  # flatten_indices(..., force_clone=true), kept as the result's
    new_indices = flat.view(1, nnz) if indices.shape[0] == 1 else indices.new_empty(tuple(indices.shape))
    return _coo(new_indices, values.new_empty(tuple(values.shape)), x.shape, True)


#: op -> rule(guesses, op, args, kwargs): the fake output, or NotImplemented where the rule
#: does not apply (a dense tensor's clone)
RULES: dict[Any, Callable[[Any, Any, tuple, dict], Any]] = {
    _aten.clone.default: _clone,
    _aten._embedding_bag_backward.default: _embedding_bag_backward,
    _aten._embedding_bag_sparse_backward.default: _embedding_bag_backward,
    _aten.sparse_mask.default: _sparse_mask,
    _aten._coalesce.default: _coalesce,
}


register("sparse entries", RULES, __name__)
