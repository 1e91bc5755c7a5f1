"""Backward's in-place gradient writes, kept in place as on a GPU.

``at::isTensorSubclassLike`` is true for *every* tensor while a ``TorchDispatchMode`` is
active, and PyTorch's autograd takes a different, allocating branch wherever it checks it.
Under xmem's tracer (fake or real) those branches run; a plain GPU run takes the in-place
ones. Two kinds matter for training steps:

* **Gradient sums.** When two gradients flow into one tensor (a residual branch, an input
  used twice) the engine adds them in the consumer's input buffer
  (``torch/csrc/autograd/input_buffer.cpp``, ``accumulate``): ``old.add_(new)`` when it holds
  the only reference to ``old`` and to its storage and ``old`` is dense, else ``old + new``.
  Under a mode, always ``old + new``: one gradient-sized buffer per residual connection.
* **Scatters into fresh zeros.** Backward formulas of indexing ops build their gradient
  as ``zeros.op_(...)`` and only under a mode as the out-of-place ``zeros.op(...)``, which
  copies ``zeros``: ``gather`` (``scatter_add``; a custom loss's ``log_probs.gather`` copies a
  whole logits-sized tensor), ``x[idx]`` (``index_put``), ``max/min(dim)``, ``topk``, ``sort``
  (``scatter``), ``index_select`` (``index_add``), ``masked_select`` (``masked_scatter``).

:class:`BackwardInPlace` recognises both from the dispatcher and names the in-place op to
run instead, under the conditions the C++ code checks:

* backward without ``create_graph`` (grad mode off: the engine and the formulas never write
  in place otherwise);
* a sum is ``aten.add.Tensor(old, new)`` with equal shapes and dtypes and no ``alpha``, where
  ``old`` was made before the autograd node now running and ``new`` by that node (its
  output, handed to the buffer after the formula ran: a formula's own sums fail this) or
  handed on unchanged by a node that computes no sums (:data:`PASS_THROUGH`), and nothing
  else holds ``old`` or its storage (``old`` has as few references as ``new``, which the
  engine holds once);
* a scatter writes into a tensor the running node made, that nothing else holds, inside a
  node of PyTorch's own (C++) formulas: a custom ``autograd.Function``'s Python backward
  runs as written.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from xmem_engine.tracing.torch_compat import is_non_overlapping_and_dense
from xmem_engine.tracing.ops import register

aten = torch.ops.aten
_ADD = aten.add.Tensor
# What the rewrite reads; a torch without them keeps the allocating branches (as before).
_current_node = getattr(torch._C, "_current_autograd_node", lambda: None)
SUPPORTED = hasattr(torch.Tensor, "_use_count") and hasattr(torch._C, "_storage_Use_Count")

#: out-of-place op of a backward formula's subclass branch -> the plain branch's in-place op
SCATTERS: dict[Any, Any] = {
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.index_add.default: aten.index_add_.default,
    aten.masked_scatter.default: aten.masked_scatter_.default,
    aten.index_put.default: aten._index_put_impl_.default,  # at::_index_put_impl_(.., unsafe=true)
}


#: Nodes whose formulas hand the incoming gradient on unchanged (``a + b`` gives ``grad`` to
#: both) and compute no sums of their own: every add while one runs is a buffer sum, also of
#: a gradient the node did not make (T5's shared position bias, ``scores += bias``).
PASS_THROUGH = frozenset({"AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "CloneBackward0",
                          "AliasBackward0"})


class BackwardInPlace:
    """Follows which tensors the running autograd node made; rewrites the allocating branch
    of a gradient sum or scatter into the in-place op a GPU run executes."""

    def __init__(self) -> None:
        self._node: Any = None
        self._python_node = False
        self._pass_through = False
        self._made: set[int] = set()  # ids of tensors the current node made (all alive)
        self._forget_queued = False

    def node_changed(self) -> Any:
        """The autograd node now running (None outside backward); forgets what the
        previous one made."""
        node = _current_node() if SUPPORTED else None
        if node is not self._node:
            self._node = node
            self._python_node = isinstance(node, torch.autograd.function.BackwardCFunction)
            self._pass_through = node is not None and node.name() in PASS_THROUGH
            self._made.clear()
            if node is not None and not self._forget_queued:
                # A node holds what it saved, an AccumulateGrad its parameter (and so the
                # gradient): let go of the last one when this backward ends, or a model the
                # user drops stays alive (nodes take no weak references).
                torch.autograd.Variable._execution_engine.queue_callback(self.forget)
                self._forget_queued = True
        return node

    @property
    def holds_node(self) -> bool:
        return self._node is not None

    def forget(self) -> None:
        """Let go of the last node (at the end of a backward; as one that raised leaves the
        engine, since it never runs its end-of-backward callbacks: the node, and the graph below
        it with every saved activation, had stayed alive past accelerate's ``empty_cache``, so
        that each out-of-memory retry at a smaller batch started on the cache the failed try
        shaped, and failed sooner than on a GPU)."""
        self._node, self._python_node, self._pass_through, self._forget_queued = None, False, False, False
        self._made.clear()

    def made(self, tensors: Iterable[torch.Tensor]) -> None:
        if self._node is not None:
            self._made.update(map(id, tensors))

    def rewrite(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
        """The in-place call a GPU run makes instead of ``func(*args, **kwargs)``, or None."""
        if self._node is None or torch.is_grad_enabled() or not args:
            return None
        if func is _ADD:
            return (aten.add_.Tensor, args, kwargs) if self._buffer_sum(args, kwargs) else None
        inplace = SCATTERS.get(func)
        if inplace is None or self._python_node:
            return None
        target = args[0]
        if id(target) not in self._made or not _sole_owner_of_storage(target):
            return None
        if func is aten.index_put.default:
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            return inplace, (target, args[1], args[2], accumulate, True), {}
        return inplace, args, kwargs

    def _buffer_sum(self, args: tuple, kwargs: dict) -> bool:
        if kwargs or len(args) != 2:
            return False
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return False
        if id(old) in self._made or not (id(new) in self._made or self._pass_through):
            return False
        if old is new:  # x + x: the engine holds the gradient twice, so it adds out of place
            return False
        if old.shape != new.shape or old.dtype != new.dtype or old.layout != torch.strided:
            return False
        if not is_non_overlapping_and_dense(old):
            return False
        # This call's own references count in both; "as few as new" means only the engine's.
        return old._use_count() <= new._use_count() and _sole_owner_of_storage(old)


def _sole_owner_of_storage(t: torch.Tensor) -> bool:
    """No other tensor (a view, its base) shares ``t``'s storage: the count is t's own
    reference plus the handle asked here."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2


register("in-place backward", SCATTERS, __name__)
