"""Real values for the small tensors of the virtual GPU in fake mode (their "shadows").

Why: fake tensors carry no values, so code that branches on a small GPU tensor would force
the whole trace to re-run on real tensors, 10-100x slower. It is common: Hugging Face models
check ``torch.all(attention_mask == 1)`` before picking an attention path, loops print
``(preds == labels).sum().item()``, code takes ``nonzero()`` of a mask. The values of such
tensors almost never come from the model: they are token ids, masks and labels moved to the
GPU with ``.to("cuda")``, or small factories such as ``arange``.

So, in fake mode, a small GPU storage whose contents are known keeps a real CPU copy beside
it (its shadow), and every deterministic aten op whose tensor inputs all have known values
also runs on the shadows (:meth:`Shadows.after_op`). Reading a value (``bool``, ``item``,
``tolist``) or an op whose output shape depends on values (``nonzero``, ``unique``) of
shadowed tensors uses the shadows (:meth:`Shadows.data_dependent`); the outputs of such ops
are fake tensors of the real shape, shadowed in turn.

Known: host tensors (real in fake mode when small) and the outputs of deterministic ops on
known inputs, up to :data:`SHADOW_BYTES` a storage. Unknown: anything computed from a
parameter or an activation, random ops, and a storage that an op writes unknown values into
(its shadow is dropped). What is unknown still needs real mode, as before.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from xmem_engine.tracing.fake.placeholders import in_range
from xmem_engine.tracing.ops import register

# The largest storage that gets a shadow. Masks, ids and labels of a batch are far smaller;
# activations and weights are far larger and never known anyway.
SHADOW_BYTES = 1 << 20


def shadowable(nbytes: Any) -> bool:
    """Whether a storage of ``nbytes`` may have its values kept: small, and of one size (a
    storage sized by a symbolic batch, ``symbolic.py``, has no values at every size)."""
    return type(nbytes) is int and nbytes <= SHADOW_BYTES


def _fake_type() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


# In-place ops whose result does not depend on what the tensor held.
_OVERWRITES = frozenset({torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar})
# Factories shaped like a tensor whose values do not depend on what it holds:
# ``torch.ones_like(input_ids)``, the attention mask a script passes for "no padding".
_LIKE = frozenset({torch.ops.aten.ones_like.default, torch.ops.aten.zeros_like.default,
                   torch.ops.aten.full_like.default})


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor of ``t``'s shape, strides and dtype (uninitialised), for ops that read no values."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def _isin_few(elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False) -> Any:
    """``isin`` against a handful of values as one comparison per value. Why: CPU's ``isin``
    takes 4 ms for 128k elements against one, and ``generate()`` asks it every token
    (``MinLengthLogitsProcessor``: the vocabulary against the stop tokens), 5% of a decode's
    trace; the comparisons take 0.05 ms. The same values as ``isin`` (both promote to one dtype)."""
    if not isinstance(elements, torch.Tensor) or not isinstance(test_elements, torch.Tensor) \
            or test_elements.numel() > 8 or elements.is_complex() or test_elements.is_complex():
        return torch.ops.aten.isin.Tensor_Tensor(elements, test_elements, assume_unique=assume_unique, invert=invert)
    common = torch.promote_types(elements.dtype, test_elements.dtype)
    x = elements.to(common)
    out = torch.zeros(elements.shape, dtype=torch.bool)
    for v in test_elements.to(common).reshape(-1):
        out |= x == v
    return ~out if invert else out


_TO_COPY = torch.ops.aten._to_copy.default

# Ops whose shadow runs as a faster equivalent (same values).
_SHADOW_KERNELS: dict[Any, Any] = {torch.ops.aten.isin.Tensor_Tensor: _isin_few}


def _is_random(func: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


_STRIDED = torch.strided


class Shadows:
    """Shadows by fake storage (``untyped_storage()._cdata``); each goes when its storage dies."""

    def __init__(self) -> None:
        self.by_storage: dict[int, torch.UntypedStorage] = {}
        self._fake = _fake_type()
        self._ops: dict[Any, tuple[bool, bool]] = {}  # op -> (writes its inputs, random)
        # told (tensor, its last known storage) when a shadow is dropped (guesses.py keeps it)
        self.on_forget: Any = None
        # the numbers ``.item()`` handed out as guesses (guesses.py): an op's Scalar argument
        # arrives here as a plain number, so a guess is told from a literal by its value
        self.guessed: set[Any] = set()

    def __len__(self) -> int:
        return len(self.by_storage)

    # ------------------------------------------------------------------ values
    def real(self, t: torch.Tensor) -> torch.Tensor | None:
        """The real tensor behind fake ``t`` (same sizes, strides and offset), or None."""
        st = self.by_storage.get(t.untyped_storage()._cdata)
        if st is None or st.device.type != "cpu":  # (a wrapper subclass's inner storage is no value)
            return None
        if t._has_symbolic_sizes_strides:
            return None  # a view sized by a symbolic batch (symbolic.py: expand(batch, -1) of known ids)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return torch.empty((0,), dtype=t.dtype).set_(st, t.storage_offset(), t.size(), t.stride())

    def _all_known(self, args: tuple, kwargs: dict) -> bool:
        """Whether every fake tensor among the inputs has a shadow. The cheap test before
        :meth:`_real_args` builds the real tensors (positional tensors and tensor lists are
        checked without flattening, as this runs for ops of every size)."""
        fake, by = self._fake, self.by_storage
        for a in args:
            if isinstance(a, fake):
                if a.layout is not _STRIDED or a.untyped_storage()._cdata not in by:  # (sparse: never shadowed)
                    return False
            elif isinstance(a, (list, tuple)) and any(
                    isinstance(b, fake) and (b.layout is not _STRIDED or b.untyped_storage()._cdata not in by)
                    for b in a):
                return False
        return not kwargs or all(t.layout is _STRIDED and t.untyped_storage()._cdata in by
                                 for t in tree_flatten(kwargs)[0] if isinstance(t, fake))

    def _real_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """``args`` / ``kwargs`` with every fake tensor replaced by its real value; None if
        one has no shadow."""
        fake = self._fake
        missing = False

        def swap(x: Any) -> Any:
            nonlocal missing
            if isinstance(x, fake):
                r = self.real(x)
                if r is None:
                    missing = True
                return r
            return x

        real_args = tree_map(swap, args)
        if missing:
            return None
        real_kwargs = tree_map(swap, kwargs)
        return None if missing else (real_args, real_kwargs)

    # ------------------------------------------------------------------ ops
    def after_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Run ``func`` on the shadows when all its inputs are known and its outputs are
        small; otherwise drop the shadows of the storages it may have written.

        Called for every fake op, so the common case (an input without a shadow, or a big
        output, and nothing written) returns after a few checks."""
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = (getattr(getattr(func, "_schema", None), "is_mutable", True), _is_random(func))
        written, random = info
        fake = self._fake
        if func in _OVERWRITES and type(args[0]) is fake and self._overwrite(func, args, kwargs):
            return
        known = not random
        if known:
            if type(out) is fake:  # (a sparse tensor has no storage: never shadowed)
                known = out.layout is _STRIDED and shadowable(out.untyped_storage().nbytes())
            else:
                outs = [t for t in tree_flatten(out)[0] if isinstance(t, fake)]
                known = bool(outs) and all(t.layout is _STRIDED and shadowable(t.untyped_storage().nbytes())
                                           for t in outs)
        if known and func is _TO_COPY and kwargs.get("device") is None and type(args[0]) is fake \
                and args[0].requires_grad and args[0].is_leaf:
            # A parameter's cast copy on its device (autocast casts each small weight again every
            # forward: 11% of a GRPO trace, whose 256 generated tokens are 256 forwards). Its
            # values feed matmuls with activations, which are never known.
            known = False
        if known and func in _LIKE and type(args[0]) is fake:
            args = (_stand_in(args[0]), *args[1:])  # only its shape, dtype and layout are read
            kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory")}  # shadows live on the host
        if known and self._all_known(args, kwargs):
            real = self._real_args(args, kwargs)
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            try:
                with unset_fake_temporarily():
                    real_out = _SHADOW_KERNELS.get(func, func)(*real[0], **real[1])
            except Exception:  # the real kernel disagrees with the fake one: value unknown
                real_out = None
            if real_out is not None:
                self._adopt(out, real_out)
                return
        if written and self.by_storage:
            self._forget(args, kwargs)

    def _overwrite(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """``zero_`` / ``fill_(number)`` (``nn.init.zeros_``, ``bias.data.zero_()``) make a
        small storage's values known whatever it held, when they cover all of it."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        t = args[0]
        st = t.untyped_storage()
        known = self.by_storage.get(st._cdata)
        if known is None and (not shadowable(st.nbytes()) or t.numel() * t.element_size() != st.nbytes()
                              or not t.is_contiguous()):
            return False
        with unset_fake_temporarily():
            base = known if known is not None else torch.zeros(st.nbytes(), dtype=torch.uint8).untyped_storage()
            view = torch.empty((0,), dtype=t.dtype).set_(base, t.storage_offset(), t.size(), t.stride())
            value = args[1] if len(args) > 1 else None
            if isinstance(value, (int, float)) and value in self.guessed:
                # ``fill_(loss.item())``: the guess, one the dtype holds (placeholders.in_range);
                # a literal the dtype cannot hold stays the real kernel's error
                args = (t, in_range(value, t.dtype), *args[2:])
            func(view, *args[1:], **kwargs)  # the shadow (or a fresh one) takes the written values
        if known is None:
            self._keep(t, view)
        return True

    def data_dependent(self, func: Any, args: tuple, kwargs: dict, fake_mode: Any) -> Any:
        """The result of an op fake tensors cannot give (``_local_scalar_dense`` behind
        ``item()`` / ``bool()``, ``nonzero``...), from the shadows; NotImplemented if an input
        is unknown."""
        real = self._real_args(args, kwargs) if self.by_storage else None
        if real is None or _is_random(func):
            return NotImplemented
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            real_out = func(*real[0], **real[1])
        if not isinstance(real_out, (torch.Tensor, tuple, list)):
            return real_out  # a Python number

        def to_fake(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            f = fake_mode.from_tensor(r)
            if shadowable(r.untyped_storage().nbytes()):
                self._keep(f, r)
            return f

        return tree_map(to_fake, real_out)

    # ------------------------------------------------------------------ bookkeeping
    def _adopt(self, out: Any, real_out: Any) -> None:
        fakes, reals = tree_flatten(out)[0], tree_flatten(real_out)[0]
        if len(fakes) != len(reals):
            return
        for f, r in zip(fakes, reals):
            if not isinstance(f, self._fake) or not isinstance(r, torch.Tensor):
                continue
            if f.untyped_storage()._cdata in self.by_storage:
                continue  # a view of, or an in-place op on, a shadowed storage: already in step
            if (f.dtype, f.shape, f.stride(), f.storage_offset()) == (r.dtype, r.shape, r.stride(), r.storage_offset()):
                self._keep(f, r)

    def _keep(self, f: torch.Tensor, r: torch.Tensor) -> None:
        st = f.untyped_storage()
        key = st._cdata
        if key not in self.by_storage:
            weakref.finalize(st, self.by_storage.pop, key, None)
        self.by_storage[key] = r.untyped_storage()

    def _forget(self, args: tuple, kwargs: dict) -> None:
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, self._fake) and t.layout is _STRIDED:  # (sparse: never shadowed)
                old = self.by_storage.pop(t.untyped_storage()._cdata, None)
                if old is not None and self.on_forget is not None:
                    self.on_forget(t, old)


register("known value", _SHADOW_KERNELS, __name__)
