"""Autograd's gradient sums, done in place as a GPU run does them.

When two gradients flow into one tensor (a residual branch, an input used twice, tied
weights), the autograd engine adds them in the consumer's input buffer
(``torch/csrc/autograd/input_buffer.cpp``, ``accumulate``): ``old.add_(new)`` in place when
the engine holds the only reference to ``old`` and to its storage, ``old`` is dense and
neither is "tensor-subclass-like"; ``old + new`` otherwise. ``isTensorSubclassLike`` is true
for *every* tensor while a ``TorchDispatchMode`` is active, so under xmem's tracer (fake or
real) the engine always takes ``old + new`` and allocates a gradient-sized buffer that a
plain GPU run does not: 147 MiB per step for GPT-2's tied embedding, one activation per
residual connection.

:class:`InputBufferSums` recognises those sums from the dispatcher and has them done in
place when the engine's own conditions hold:

* backward without ``create_graph`` (the engine never adds in place with grad mode on);
* ``aten.add.Tensor(old, new)`` with no ``alpha``, equal shapes and dtypes, ``old`` dense;
* ``old`` was made before the autograd node now running, ``new`` by that node (its output,
  handed to the buffer after the node's formula ran: a formula's own sums fail this);
* nothing else holds ``old`` or its storage: ``old`` has as few references as ``new``
  (which the engine holds once, having moved it) and its storage has no other tensor.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch._prims_common

_ADD = torch.ops.aten.add.Tensor
ADD_IN_PLACE = torch.ops.aten.add_.Tensor


class InputBufferSums:
    """Follows which tensors the running autograd node made; answers whether an add is
    the engine's buffer sum that a GPU run would do in place (as :data:`ADD_IN_PLACE`)."""

    def __init__(self) -> None:
        self._node: Any = None
        self._made: set[int] = set()  # ids of tensors the current node made (all alive)

    def node_changed(self) -> Any:
        """The autograd node now running (None outside backward); forgets what the
        previous one made."""
        node = torch._C._current_autograd_node()
        if node is not self._node:
            self._node = node
            self._made.clear()
        return node

    def made(self, tensors: Iterable[torch.Tensor]) -> None:
        if self._node is not None:
            self._made.update(map(id, tensors))

    def in_place(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """Whether ``func(*args, **kwargs)`` is a buffer sum the engine does in place on a GPU."""
        if func is not _ADD or self._node is None or kwargs or len(args) != 2 or torch.is_grad_enabled():
            return False
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return False
        if id(old) in self._made or id(new) not in self._made:
            return False
        if old.shape != new.shape or old.dtype != new.dtype or old.layout != torch.strided:
            return False
        if not torch._prims_common.is_non_overlapping_and_dense_or_false(old):
            return False
        # This call's own references count in both; "as few as new" means only the engine's.
        if old._use_count() > new._use_count():
            return False
        storage = old.untyped_storage()
        return torch._C._storage_Use_Count(storage._cdata) <= 2  # old's impl + this handle

