"""Meta kernels for the ``out=`` overloads PyTorch ships without one.

Inductor calls some extern kernels with ``out=`` into a buffer of its own plan
(``extern_kernels._scaled_mm(..., out=buf)`` for torchao's float8 matmuls). Where that
overload has no Meta kernel, FakeTensorMode's fallback runs the real CPU kernel on
zero-filled copies of the inputs: a compiled 2-layer float8 Llama spent 39 of its 59 s
there (84 float8 matmuls of 2048 x 8192), and the 22-layer one 16 GiB of host memory.
The functional overload's meta kernel answers instead, and the ``out`` tensor is checked
and resized as the op's CUDA kernel does. Registered for the trace, removed after it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from xmem_engine.tracing.ops import register

#: out overload -> its functional overload (those with no Meta kernel in torch 2.10-2.14)
OUT_OVERLOADS = {"_scaled_mm.out": "_scaled_mm.default", "bmm.dtype_out": "bmm.dtype"}


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet, None), overload, None)


def meta_out(functional: Any) -> Callable[..., Any]:
    """A Meta kernel for ``functional``'s out overload: the result's size and dtype from
    ``functional``'s own meta kernel, written into ``out`` (resized when its size differs)."""

    def kernel(*args: Any, out: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        result = functional(*args, **kwargs)
        if out.dtype != result.dtype:
            raise RuntimeError(f"{functional.name()}: expected out tensor of dtype {result.dtype}, got {out.dtype}")
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out

    return kernel


@contextlib.contextmanager
def out_variant_metas() -> Iterator[list[str]]:
    """Meta kernels for the :data:`OUT_OVERLOADS` this torch lacks, for the block; yields the
    names registered."""
    lib = None
    registered: list[str] = []
    for out_name, functional_name in OUT_OVERLOADS.items():
        op, functional = _overload(out_name), _overload(functional_name)
        if op is None or functional is None or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
            continue
        if lib is None:
            lib = torch.library.Library("aten", "IMPL")
        lib.impl(out_name, meta_out(functional), "Meta")
        registered.append(out_name)
    try:
        yield registered
    finally:
        if lib is not None:
            lib._destroy()


register("meta kernel", OUT_OVERLOADS, __name__)
