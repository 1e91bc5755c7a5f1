"""CUDA's autocast cast policy, run on the CPU tensors of the virtual device.

On a GPU, ``torch.autocast("cuda", dtype)`` enables the ``AutocastCUDA`` dispatch key: ops on
CUDA's lists cast their inputs (to the autocast dtype, to float32, or to the widest input type)
before autograd records them, so the casted copies are real allocations, and fp32 -> low
precision casts of leaf ``requires_grad`` tensors (parameters) are kept in a cache for the
region. The tracer's tensors are CPU tensors: only ``AutocastCPU`` is in their dispatch key
set, and CPU autocast has *different* lists (CPU runs softmax / log_softmax / layer_norm /
group_norm / sum / cumsum / exp / pow ... in the lower precision, casts ``cat`` / ``stack``
with "promote", runs pooling / padding / linalg in float32, and leaves ``mv`` / ``addmv`` /
``addr`` / ``einsum`` / the RNN cells / ``convolution`` alone). So plain CPU autocast would
change which activations are half-size.

Mechanism
---------
While a CUDA autocast region is active, the ``AutocastCPU`` kernels are replaced with CUDA's
policy through a ``torch.library.Library("aten", "IMPL", "AutocastCPU")``:

* every op that the running torch registers for ``AutocastCUDA``
  (``torch._C._dispatch_get_registrations_for_dispatch_key``: CUDA's kernels are compiled into
  CPU builds too, so this is the exact op set of the running version) gets a Python kernel
  with CUDA's policy for it, from :data:`POLICY`;
* every op that only CPU autocast lists gets ``fallthrough_kernel`` (no autocast, as on CUDA).

The kernels sit where CUDA's do (above autograd, below the Python API), so composite ops
decompose into listed ops exactly as they do on a GPU, the casts are ``aten::to`` calls that
autograd records and that the tracer's dispatch modes see (they become ``alloc`` events in
fake and real mode alike), and real mode computes real values. Each kernel is a Python
transcription of ``at::autocast::WrapFunction_`` (``aten/src/ATen/autocast_mode.h``): it
excludes the autocast key, casts (``cached_cast``, with CUDA's eligibility: floating, not
float64, on the GPU), and calls the op again. The weight cache follows ``cached_cast``: a
lower-precision cast of a float32 leaf that requires grad and is not a view is cached while
``torch.is_autocast_cache_enabled()`` and not under ``inference_mode``;
``torch.clear_autocast_cache`` (called when the
outermost region exits) drops it, which frees the cached copies.

``virtual_cuda.patched_cuda`` enters the CUDA state *and* the CPU state for each
``autocast("cuda")`` region (``torch.is_autocast_enabled("cuda")`` and
``torch.get_autocast_dtype("cuda")`` answer as on a GPU; the CPU state is what makes the key
fire) and installs the registrations lazily at the first CUDA region; they stay until the
tracer finishes, or until code enters a CPU autocast region outside any CUDA region (which
must then get CPU's own policy). :meth:`CudaAutocastPolicy.uninstall` removes every
registration (``Library._destroy``), which restores the C++ CPU kernels.

Alternatives rejected: a TorchFunctionMode sees Python calls, not aten ops (``F.linear`` /
``Tensor.__matmul__`` / C++ composites such as the LSTM's internal ``linear`` calls would
each need a mapping, and casts made there would not be the ``aten::to`` autograd records on
a GPU); a TorchDispatchMode sits below autograd, so casts there would not be recorded by
autograd (the casted copies would not be the tensors saved for backward).

The lists
---------
:data:`POLICY` transcribes ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` and
``AT_FORALL_PROMOTE`` of ``aten/src/ATen/autocast_mode.h`` (PyTorch 2.13, the header shipped
in the wheel at ``torch/include/ATen/autocast_mode.h``) plus the CUDA-only registrations of
``aten/src/ATen/autocast_mode.cpp`` (``cudnn_convolution``, ``cudnn_convolution_transpose``
lower precision; ``binary_cross_entropy`` banned). Older 2.x releases also list Dimname
overloads (``softmax.Dimname``, ``sum.dim_DimnameList``, ``norm.names_ScalarOpt_dim`` ...)
and lack ``rms_norm``; those entries are in the table, and only what the running torch
registers for ``AutocastCUDA`` is used.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable

import torch
from xmem_engine.tracing.ops import register

LOWER_PRECISION_FP = "lower_precision_fp"
FP32 = "fp32"
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
FP32_APPEND_DTYPE = "fp32_append_dtype"
PROMOTE = "promote"
BANNED = "banned"

_LOWER = (
    "_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d "
    "conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum "
    "mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot "
    "_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention "
    # autocast_mode.cpp, CUDA only
    "cudnn_convolution cudnn_convolution_transpose"
)
_FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan "
    "pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm "
    "group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss "
    "cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss "
    "huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm "
    "logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d "
    "upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d "
    "_upsample_bicubic2d_aa"
)
_FP32_SET_OPT_DTYPE = (
    "prod prod.dim_int prod.dim_Dimname softmax.int softmax.Dimname log_softmax.int "
    "log_softmax.Dimname cumprod cumprod.dimname cumsum cumsum.dimname linalg_vector_norm "
    "linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList sum.dim_DimnameList"
)
_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"

# fp32_append_dtype: the overload without a dtype -> the overload it redispatches to
APPEND_DTYPE_TARGET = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}

POLICY: dict[str, str] = {
    **{n: LOWER_PRECISION_FP for n in _LOWER.split()},
    **{n: FP32 for n in _FP32.split()},
    **{n: FP32_SET_OPT_DTYPE for n in _FP32_SET_OPT_DTYPE.split()},
    **{n: FP32_APPEND_DTYPE for n in APPEND_DTYPE_TARGET},
    **{n: PROMOTE for n in _PROMOTE.split()},
    "binary_cross_entropy": BANNED,
}

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)

AUTOCAST_CPU = _AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)  # the key its kernels use


def _registrations(key: str) -> list[str]:
    """``overload`` names (``linear``, ``pow.Scalar``) the running torch registers for ``key``."""
    try:
        names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    except (AttributeError, RuntimeError):  # pragma: no cover - very old torch
        return []
    return sorted(n.split("::", 1)[1] for n in names if n.startswith("aten::"))


def cuda_ops() -> dict[str, str]:
    """Op overload -> CUDA cast policy, for the ops the running torch registers for
    ``AutocastCUDA`` (the whole table if it cannot tell)."""
    registered = _registrations("AutocastCUDA")
    if not registered:  # pragma: no cover
        return {n: p for n, p in POLICY.items() if aten_op(n) is not None}
    return {n: POLICY[n] for n in registered if n in POLICY}


def unknown_cuda_ops() -> list[str]:
    """Ops the running torch autocasts on CUDA that :data:`POLICY` does not know (kept empty
    by a test; an op here runs without autocast on the virtual device)."""
    return [n for n in _registrations("AutocastCUDA") if n not in POLICY]


def aten_op(name: str) -> Any:
    """``"mm"`` / ``"add_.Tensor"`` -> that aten OpOverload, or None where this torch lacks it."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


# --------------------------------------------------------------------------- argument kinds
_TENSOR, _OPT_TENSOR, _TENSOR_LIST = 1, 2, 3


def _tensor_args(op: Any) -> list[tuple[int, str, int]]:
    """(position, name, kind) of the arguments ``cached_cast`` touches: Tensor, Tensor? and
    Tensor[] (not ``Tensor?[]``, which the C++ template passes through)."""
    out = []
    for i, a in enumerate(op._schema.arguments):
        t = str(a.type)
        kind = {"Tensor": _TENSOR, "Optional[Tensor]": _OPT_TENSOR, "List[Tensor]": _TENSOR_LIST}.get(t)
        if kind is not None:
            out.append((-1 if a.kwarg_only else i, a.name, kind))
    return out


class CudaAutocastPolicy:
    """CUDA's autocast policy as ``AutocastCPU`` kernels; see the module docstring.

    ``on_device(t)`` says whether a tensor is on the (virtual) CUDA device, i.e. eligible for
    casting (CUDA autocast leaves CPU tensors alone); by default every tensor is.
    """

    def __init__(self, on_device: Callable[[torch.Tensor], bool] | None = None):
        self.on_device = on_device
        self.lib: Any = None
        self.cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    # ------------------------------------------------------------------ install
    @property
    def installed(self) -> bool:
        return self.lib is not None

    def install(self) -> None:
        if self.lib is not None:
            return
        ops = cuda_ops()
        lib = torch.library.Library("aten", "IMPL", "AutocastCPU")
        try:
            with warnings.catch_warnings():
                # "Overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore")
                for name, policy in ops.items():
                    op = aten_op(name)
                    if op is not None:
                        lib.impl(name, self.kernel(op, name, policy))
                for name in _registrations("AutocastCPU"):
                    if name not in ops:
                        lib.impl(name, torch.library.fallthrough_kernel)
        except BaseException:
            lib._destroy()
            raise
        self.lib = lib

    def uninstall(self) -> None:
        self.cache.clear()
        lib, self.lib = self.lib, None
        if lib is not None:
            lib._destroy()

    def clear_cache(self) -> None:
        self.cache.clear()

    # ------------------------------------------------------------------ casting
    def _on_device(self, t: torch.Tensor) -> bool:
        if self.on_device is None:
            return True
        try:
            return self.on_device(t)
        except (RuntimeError, NotImplementedError):  # no storage to ask about (sparse, nested)
            return True

    def _eligible(self, t: Any) -> bool:
        """``is_eligible``: a defined floating tensor on the device, not float64."""
        return (
            isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not torch.float64
            and self._on_device(t)
        )

    def cached_cast(self, to: torch.dtype, t: Any, low: torch.dtype) -> Any:
        if not self._eligible(t) or t.dtype is to:
            return t
        # Not under inference_mode (autocast_mode.cpp, pytorch/pytorch#158232, in every
        # supported release): its casts could not serve a later training step.
        if (to is low and t.dtype is torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
                and torch.is_autocast_cache_enabled() and not torch.is_inference_mode_enabled()):
            hit = self.cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
            casted = torch.ops.aten.to.dtype(t, to)
            self.cache[id(t)] = (weakref.ref(t), casted)
            return casted
        return torch.ops.aten.to.dtype(t, to)

    def _cast_all(self, to: torch.dtype, low: torch.dtype, spec: list, args: tuple, kwargs: dict) -> tuple[list, dict]:
        args, kwargs = list(args), dict(kwargs)
        for pos, name, kind in spec:
            if 0 <= pos < len(args):
                holder, key = args, pos
            elif name in kwargs:
                holder, key = kwargs, name  # type: ignore[assignment]
            else:
                continue
            v = holder[key]
            if v is None:
                continue
            if kind == _TENSOR_LIST:
                holder[key] = [self.cached_cast(to, x, low) for x in v]
            else:
                holder[key] = self.cached_cast(to, v, low)
        return args, kwargs

    def _promote_type(self, low: torch.dtype, spec: list, args: tuple, kwargs: dict) -> torch.dtype:
        """``promote_type``: float32 if any eligible Tensor / Tensor[] argument is float32."""
        current = low
        for pos, name, kind in spec:
            if kind == _OPT_TENSOR:
                continue  # prioritize() has no overload for optional tensors
            v = args[pos] if 0 <= pos < len(args) else kwargs.get(name)
            for t in (v if kind == _TENSOR_LIST else (v,)):
                if not (isinstance(t, torch.Tensor) and t.is_floating_point() and self._on_device(t)):
                    continue
                nxt = t.dtype
                if nxt is torch.float64:
                    continue
                if current is torch.float32 or nxt is torch.float32:
                    current = torch.float32
                elif current is low and nxt is low:
                    current = low
                else:
                    raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
        return current

    # ------------------------------------------------------------------ kernels
    def kernel(self, op: Any, name: str, policy: str) -> Callable:
        spec = _tensor_args(op)
        guard = torch._C._ExcludeDispatchKeyGuard
        no_tf = torch._C.DisableTorchFunction
        first = spec[0] if spec else None

        def plain(*args: Any, **kwargs: Any) -> Any:
            with guard(_AUTOCAST_CPU), no_tf():
                return op(*args, **kwargs)

        def first_arg(args: tuple, kwargs: dict) -> Any:
            if first is None:
                return None
            pos, argname, _ = first
            return args[pos] if 0 <= pos < len(args) else kwargs.get(argname)

        if policy == BANNED:
            def kernel(*args: Any, **kwargs: Any) -> Any:
                if not torch.is_autocast_enabled("cuda"):
                    return plain(*args, **kwargs)
                raise RuntimeError(_BCE_BANNED)

        elif policy in (LOWER_PRECISION_FP, FP32, PROMOTE):
            def kernel(*args: Any, **kwargs: Any) -> Any:
                if not torch.is_autocast_enabled("cuda"):
                    return plain(*args, **kwargs)
                with guard(_AUTOCAST_CPU), no_tf():
                    low = torch.get_autocast_dtype("cuda")
                    if policy == LOWER_PRECISION_FP:
                        to = low
                    elif policy == FP32:
                        to = torch.float32
                    else:
                        to = self._promote_type(low, spec, args, kwargs)
                    a, k = self._cast_all(to, low, spec, args, kwargs)
                    return op(*a, **k)

        elif policy == FP32_SET_OPT_DTYPE:
            schema_args = op._schema.arguments
            dtype_pos = next(i for i, a in enumerate(schema_args) if a.name == "dtype")
            dtype_kwonly = schema_args[dtype_pos].kwarg_only

            def kernel(*args: Any, **kwargs: Any) -> Any:
                if not torch.is_autocast_enabled("cuda"):
                    return plain(*args, **kwargs)
                with guard(_AUTOCAST_CPU), no_tf():
                    if not self._eligible(first_arg(args, kwargs)):
                        return op(*args, **kwargs)  # no dtype set: it could change promotion
                    if not dtype_kwonly and dtype_pos < len(args):
                        if args[dtype_pos] is None:
                            args = args[:dtype_pos] + (torch.float32,) + args[dtype_pos + 1:]
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                    return op(*args, **kwargs)

        elif policy == FP32_APPEND_DTYPE:
            target = aten_op(APPEND_DTYPE_TARGET[name])
            names = [a.name for a in op._schema.arguments]
            defaults = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}

            def kernel(*args: Any, **kwargs: Any) -> Any:
                if not torch.is_autocast_enabled("cuda"):
                    return plain(*args, **kwargs)
                with guard(_AUTOCAST_CPU), no_tf():
                    bound = {**defaults, **dict(zip(names, args)), **kwargs}
                    x = bound[names[0]]
                    out_type = torch.float32 if self._eligible(x) else x.dtype
                    return target(*[bound[n] for n in names], dtype=out_type)

        else:  # pragma: no cover
            raise ValueError(f"unknown autocast policy {policy!r}")

        kernel.__name__ = f"xmem_cuda_autocast_{name.replace('.', '_')}"
        return kernel


__all__ = [
    "BANNED",
    "FP32",
    "FP32_APPEND_DTYPE",
    "FP32_SET_OPT_DTYPE",
    "LOWER_PRECISION_FP",
    "POLICY",
    "PROMOTE",
    "CudaAutocastPolicy",
    "cuda_ops",
    "unknown_cuda_ops",
]


register("autocast", POLICY, __name__)
