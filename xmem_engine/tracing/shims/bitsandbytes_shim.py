"""bitsandbytes on the virtual GPU: 4-bit and 8-bit parameters quantized where a GPU quantizes
them, 8-bit and paged optimizers.

bitsandbytes registers its kernels as ``torch.library`` custom ops with fake kernels and CPU
kernels, so quantizing (``Params4bit`` / ``Int8Params`` at ``.cuda()``), the 4-bit matmul,
dequantizing and the 8-bit optimizers' updates already run on the virtual GPU in both modes:
the dispatch mode sees each op's outputs (the packed weight, its ``absmax``, the nested
``absmax`` of double quantization, the optimizers' block-wise states) at the sizes the CUDA
kernels allocate. What this module adds, installed when bitsandbytes is imported (nothing is
imported or patched otherwise):

* fake mode: bitsandbytes' parameter classes (``Params4bit``, ``Int8Params``) wrap their data
  with ``torch.Tensor._make_subclass``, which a fake tensor refuses (it already has a Python
  object). Under the trace such a parameter over fake data *is* the fake tensor, its class
  changed to one that derives from both the parameter class and ``FakeTensor``
  (:func:`fake_class`): ``isinstance(w, Params4bit)`` holds, the methods are bitsandbytes'
  own, and FakeTensorMode handles it like any fake tensor.
* the quantization state (``absmax``, the nested state, the code book) belongs to the weight:
  its storages are recorded as ``parameter``.
* ``gemm_4bit`` (the 4-bit forward): where bitsandbytes' CUDA dispatch takes its unfused
  path (``M`` = rows of the input above 1536, an inner size that is not a multiple of the
  block size, or where its per-architecture heuristic says so for the target GPU), it
  dequantizes the whole weight into a temporary in the compute dtype before ``F.linear``; the
  CPU and fake kernels do not. Likewise the int8 matmul's int32 product and fp16 staging
  buffer (``int8_scaled_mm``, a composite on CUDA). Those buffers are added after the op
  (:func:`cuda_temporaries`).
* paged optimizers (``PagedAdamW8bit``, ``PagedAdamW32bit``, ``optim="paged_adamw_8bit"``):
  bitsandbytes allocates the states of parameters of 100,000 elements and more with
  ``cudaMallocManaged`` (``F.get_paged``), outside PyTorch's caching allocator, and never frees
  them. Here they are host tensors (what PyTorch sees on a GPU too), their bytes are summed
  in ``tracer.managed_bytes`` (``trace.meta["managed_bytes"]``), which the estimate adds to the
  device total as ``nvidia-smi`` shows it, and a note says what they are.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch
from xmem_engine.tracing.ops import register
from xmem_engine.tracing.symbolic import hint

# Rows of the input above which bitsandbytes' CUDA gemm_4bit always dequantizes the weight
# and calls F.linear (backends/cuda/ops.py, ``_gemm_4bit_custom_max_m``; ROCm: 256).
GEMM_4BIT_CUSTOM_MAX_M = 1536
_FAKE_CLASSES: dict[type, type] = {}


def fake_class(cls: type) -> type:
    """``cls`` (a ``torch.nn.Parameter`` subclass) as a subclass of ``FakeTensor`` too, named as
    ``cls`` is (libraries test ``weight.__class__.__name__ == "Params4bit"``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if issubclass(cls, FakeTensor):
        return cls
    made = _FAKE_CLASSES.get(cls)
    if made is None:
        made = _FAKE_CLASSES[cls] = type(cls.__name__, (cls, FakeTensor),
                                         {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return made


def fake_make_subclass(orig: Callable, tracer: Any) -> Callable:
    """``torch.Tensor._make_subclass`` that gives a parameter subclass over fake data as the fake
    tensor itself (a detached alias: same storage, so no allocation), of :func:`fake_class`."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    def make_subclass(cls: type, data: torch.Tensor, require_grad: bool = False, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cls, type) and issubclass(cls, torch.nn.Parameter) and not args and not kwargs:
            if not isinstance(data, FakeTensor) and issubclass(cls, FakeTensor) and tracer.fake_mode is not None:
                with _disable_current_modes():  # an empty placeholder (``data=None``) made real
                    data = tracer.fake_mode.from_tensor(data)
            if isinstance(data, FakeTensor):
                t = data.detach()
                t.__class__ = fake_class(cls)
                t.requires_grad_(require_grad)
                return t
        return orig(cls, data, require_grad, *args, **kwargs)

    return make_subclass


def with_fake_subclassing(fn: Callable, tracer: Any) -> Callable:
    """``fn`` (a parameter class's ``__new__`` or constructor) with :func:`fake_make_subclass` in
    place while it runs: only these calls pay for it, not every fake tensor torch makes."""
    orig = torch.Tensor._make_subclass
    patched = staticmethod(fake_make_subclass(orig, tracer))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "_make_subclass" in vars(torch.Tensor):  # nested (Params4bit.to makes a Params4bit)
            return fn(*args, **kwargs)
        torch.Tensor._make_subclass = patched  # type: ignore[assignment]
        try:
            return fn(*args, **kwargs)
        finally:
            del torch.Tensor._make_subclass

    return wrapper


def quant_state_tensors(qs: Any) -> Iterator[torch.Tensor]:
    """The tensors of a bitsandbytes ``QuantState`` (absmax, code, offset, the nested state's)."""
    while qs is not None:
        for name in ("absmax", "code", "offset"):
            t = getattr(qs, name, None)
            if isinstance(t, torch.Tensor):
                yield t
        qs = getattr(qs, "state2", None)


def quantized_as_parameter(orig: Callable, tracer: Any) -> Callable:
    """``Params4bit._quantize`` / ``Int8Params._quantize``: the quantization state is part of the
    weight (``parameter``), as the packed data is."""
    from xmem_engine.trace import Category

    @functools.wraps(orig)
    def _quantize(self: Any, device: Any) -> Any:
        out = orig(self, device)
        for t in (*quant_state_tensors(getattr(out, "quant_state", None)), getattr(out, "SCB", None)):
            if isinstance(t, torch.Tensor):
                tracer._upgrade(t, Category.PARAMETER)
        return out

    return _quantize


def fused_gemm_4bit(m: int, n: int, k: int, dtype: torch.dtype, props: Any) -> bool:
    """Whether bitsandbytes' CUDA ``gemm_4bit`` runs its fused kernel for an ``m x k`` input and
    an ``n x k`` weight on a GPU with ``props``: its own per-architecture heuristic where its
    CUDA backend is imported (bitsandbytes imports it where ``torch.cuda.is_available()``, as
    it is in the trace), else the fused kernel (the heuristic's choice for small ``m``)."""
    if m > GEMM_4BIT_CUSTOM_MAX_M:
        return False
    cuda_ops = sys.modules.get("bitsandbytes.backends.cuda.ops")
    choose = getattr(cuda_ops, "_gemm_4bit_use_custom_cuda", None)
    if choose is None or not hasattr(cuda_ops, "_gpu_dispatch_props"):
        return True
    from xmem_engine.tracing.patches import patched_attr

    # The heuristic reads the SM count and compute capability through a functools.cache: the
    # traced GPU's, not whichever GPU an earlier trace had.
    target = (props.multi_processor_count, props.major, props.minor)
    with patched_attr(cuda_ops, "_gpu_dispatch_props", lambda _index: target):
        return bool(choose(0, dtype, m, n, k))


def gemm_4bit_steps(args: tuple, kwargs: dict, props: Any) -> list[tuple[str, str, int]]:
    """``gemm_4bit``'s unfused path (dequantized nested absmax, then absmax + offset, both fp32;
    the weight in the input's dtype); its fused kernel allocates only the output."""
    a, shape_b, blocksize = args[0], args[2], args[4]
    absmax_8bit = kwargs.get("absmax_8bit", args[7] if len(args) > 7 else None)
    k = a.shape[-1]
    m = a.numel() // k if k else 0
    if k % blocksize == 0 and fused_gemm_4bit(m, shape_b[0], k, a.dtype, props):
        return []
    sizes = {}
    if absmax_8bit is not None:
        sizes["absmax_dq"] = sizes["absmax"] = absmax_8bit.numel() * 4
    sizes["weight"] = shape_b[0] * shape_b[1] * a.element_size()
    return [("alloc", slot, n) for slot, n in sizes.items()] + [("free", slot, 0) for slot in sizes]


def int8_scaled_mm_steps(a: torch.Tensor, cb: torch.Tensor, dtype: torch.dtype | None) -> list[tuple[str, str, int]]:
    """``int8_scaled_mm`` on CUDA is bitsandbytes' default composite: cuBLASLt's int32 product
    (``int8_linear_matmul``), dequantized by a kernel that writes fp16 only, then cast to the
    output dtype (backends/cuda/ops.py ``int8_mm_dequant``)."""
    rows = a.numel() // a.shape[-1] if a.shape[-1] else 0
    steps = [("alloc", "int32", rows * cb.shape[0] * 4)]
    if dtype not in (None, torch.float16):
        steps.append(("alloc", "fp16", rows * cb.shape[0] * 2))
    return steps + [("free", slot, 0) for _, slot, _ in list(steps)]


CUDA_COMPOSITES = ("bitsandbytes::gemm_4bit", "bitsandbytes::int8_scaled_mm", "bitsandbytes::int8_mixed_scaled_mm",
                   "bitsandbytes::int8_vectorwise_quant")


def _threshold(args: tuple, kwargs: dict) -> float:
    return float(kwargs.get("threshold", args[1] if len(args) > 1 else 0.0))


def _outlier_cols(args: tuple, kwargs: dict) -> Any:
    return kwargs.get("outlier_cols", args[5] if len(args) > 5 else None)


def int8_mixed_bound(args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """``int8_mixed_scaled_mm``'s second output, the activations' outlier columns in their own
    dtype (``A[:, outlier_cols]``): sized by the outlier columns :func:`int8_outliers_bound`
    bounded (exact given them)."""
    A, CA, CB = args[0], args[1], args[2]
    cols = _outlier_cols(args, kwargs)
    empty = torch.ops.aten.empty.memory_format
    out = empty([*CA.shape[:-1], CB.shape[0]], dtype=A.dtype, device=torch.device("cpu"))
    n = cols.numel() if cols is not None else 0
    sub = empty([A.shape[0], n], dtype=A.dtype, device=torch.device("cpu")) if n else None
    return (out, sub), None


def int8_outliers_bound(args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """``int8_vectorwise_quant``'s outlier columns (LLM.int8(), ``threshold > 0``) are the
    columns of the activations with a value at or above the threshold: a size that depends on
    values, which fake tensors lack. Its upper bound, every column, as other data-dependent
    sizes take theirs (``guesses.BOUNDS``, which this joins for the trace)."""
    A = args[0]
    rows = A.numel() // A.shape[-1]
    empty = torch.ops.aten.empty.memory_format  # inside the dispatch mode: FakeTensorMode makes them
    out = (empty(list(A.shape), dtype=torch.int8, device=torch.device("cpu")),
           empty([rows], dtype=torch.float32, device=torch.device("cpu")))
    if _threshold(args, kwargs) == 0.0:
        return (*out, None), None
    return (*out, empty([A.shape[-1]], dtype=torch.int64, device=torch.device("cpu"))), \
        f"{hint(A.shape[-1]):,} outlier columns (every column at or above LLM.int8()'s threshold)"


def cuda_temporaries(tracer: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Op hook: buffers bitsandbytes' CUDA implementations allocate inside one op, which the
    CPU and fake kernels do not (:func:`gemm_4bit_steps`, :func:`int8_scaled_mm_steps`), added
    after the op's outputs, freed before the next op."""
    name = func.name()
    if name not in CUDA_COMPOSITES or not tracer.is_gpu(args[0]):
        return
    if name == "bitsandbytes::gemm_4bit":
        steps = gemm_4bit_steps(args, kwargs, tracer.vc.props)
    elif name == "bitsandbytes::int8_scaled_mm":
        steps = int8_scaled_mm_steps(args[0], args[1], kwargs.get("dtype", args[5] if len(args) > 5 else None))
    elif name == "bitsandbytes::int8_mixed_scaled_mm":  # (A, CA, CB, ...): its output in A's dtype
        steps = int8_scaled_mm_steps(args[1], args[2], args[0].dtype)
        cols, CB = _outlier_cols(args, kwargs), args[2]
        if cols is not None and cols.numel():  # the weights' outlier columns: int8, dequantized, cast
            n = CB.shape[0] * cols.numel()
            steps = [("alloc", "cb_cols", n), ("alloc", "dequant", n * 4), ("free", "cb_cols", 0),
                     ("alloc", "sub_b", n * args[0].element_size()), ("free", "dequant", 0),
                     *steps, ("free", "sub_b", 0)]
    elif name == "bitsandbytes::int8_vectorwise_quant":  # CUDA finds outliers as A.abs() >= threshold
        A = args[0]
        steps = [("alloc", "abs", A.numel() * A.element_size()), ("alloc", "mask", A.numel()),
                 ("free", "abs", 0), ("free", "mask", 0)] if _threshold(args, kwargs) > 0.0 else []
    if steps:
        tracer.transients(func, steps)


MANAGED_HEADLINE = "paged optimizer states:"
MANAGED_NOTE = (MANAGED_HEADLINE + " {size} of unified memory (cudaMallocManaged, bitsandbytes' paged "
                "optimizers) outside PyTorch's caching allocator, counted in the device total as nvidia-smi shows "
                "it while resident; the driver pages it out to host memory when the GPU runs short, so it does not "
                "by itself cause an out-of-memory error")


def paged_buffer(tracer: Any) -> Callable:
    """``bitsandbytes.functional.get_paged``: a host tensor of the state's size (what PyTorch sees
    of managed memory on a GPU as well: ``torch.frombuffer`` of it), its bytes added to
    ``tracer.managed_bytes``. In fake mode a fake one: a real one held the whole state in the
    host's memory (PagedAdamW32bit's 8 bytes a parameter: 2.4 GB of RSS on a 300M model)."""

    def get_paged(*shape: int, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
        if tracer.fake:
            from torch._subclasses.fake_tensor import FakeTensor

            out = FakeTensor(tracer.fake_mode, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cpu"))
        else:
            out = torch.zeros(shape, dtype=dtype, device="cpu")
        out.is_paged = True
        out._xmem_paged = True
        out.page_deviceid = getattr(device, "index", None) or 0
        tracer.managed_bytes += out.numel() * out.element_size()
        note = MANAGED_NOTE.format(size=f"{tracer.managed_bytes / 2**20:,.1f} MiB")
        tracer.notes[:] = [n for n in tracer.notes if not n.startswith(MANAGED_HEADLINE)] + [note]
        return out

    return get_paged


def paged_fill(orig: Callable) -> Callable:
    """``F.fill`` of a paged buffer (a C call on its pointer): filled in place, as on the GPU."""

    def fill(A: torch.Tensor, value: float, device: Any = None, prefetch: bool = True) -> None:
        if getattr(A, "_xmem_paged", False):
            A.fill_(value)
            return None
        return orig(A, value, device, prefetch)

    return fill


def paged_prefetch(orig: Callable) -> Callable:
    """``F.prefetch_tensor``: moving managed pages between host and GPU allocates nothing."""

    def prefetch_tensor(A: torch.Tensor, to_cpu: bool = False) -> None:
        if getattr(A, "_xmem_paged", False):
            return None
        return orig(A, to_cpu)

    return prefetch_tensor


def install(stack: contextlib.ExitStack, tracer: Any) -> None:
    """Patch bitsandbytes (imported) for the rest of the trace; ``stack`` undoes it."""
    from xmem_engine.tracing.patches import patched_attr

    import bitsandbytes.functional as F
    from bitsandbytes.nn import modules

    if tracer.fake:
        for cls in (modules.Params4bit, modules.Int8Params):
            stack.enter_context(patched_attr(cls, "__new__", staticmethod(with_fake_subclassing(cls.__new__, tracer))))
        prequantized = vars(modules.Params4bit).get("from_prequantized")
        if isinstance(prequantized, classmethod):
            stack.enter_context(patched_attr(modules.Params4bit, "from_prequantized",
                                             classmethod(with_fake_subclassing(prequantized.__func__, tracer))))
    # The code book bitsandbytes caches on the device at its first blockwise quantization: a
    # trace starts from an empty cache, as a new process does, and leaves the user's as it was.
    stack.enter_context(patched_attr(F, "name2qmap", {}))
    for cls in (modules.Params4bit, modules.Int8Params):
        stack.enter_context(patched_attr(cls, "_quantize", quantized_as_parameter(cls._quantize, tracer)))
    stack.enter_context(patched_attr(F, "get_paged", paged_buffer(tracer)))
    stack.enter_context(patched_attr(F, "fill", paged_fill(F.fill)))
    stack.enter_context(patched_attr(F, "prefetch_tensor", paged_prefetch(F.prefetch_tensor)))
    tracer.op_hooks.append(cuda_temporaries)
    stack.callback(tracer.op_hooks.remove, cuda_temporaries)
    from xmem_engine.tracing.fake.guesses import BOUNDS
    from xmem_engine.tracing.patches import patched_item

    stack.enter_context(patched_item(BOUNDS, "bitsandbytes.int8_vectorwise_quant.default", int8_outliers_bound))
    stack.enter_context(patched_item(BOUNDS, "bitsandbytes.int8_mixed_scaled_mm.default", int8_mixed_bound))


@contextlib.contextmanager
def bitsandbytes_on_gpu(tracer: Any) -> Iterator[None]:
    """For the trace's duration: bitsandbytes patched (:func:`install`) if it is imported, or as
    soon as the traced code imports it."""
    from xmem_engine.tracing.patches import on_import

    with contextlib.ExitStack() as stack:
        stack.enter_context(on_import(["bitsandbytes"], lambda module: install(stack, tracer)))
        yield


register("cuda composite", CUDA_COMPOSITES, __name__)
