"""``scaled_dot_product_attention`` as CUDA runs it on the target GPU.

On the CPU, SDPA picks the CPU flash kernel or the math path (which materialises the
B x H x L x S attention matrix, its softmax and a float dropout noise tensor and saves them
for backward). On a GPU, PyTorch picks flash attention, memory-efficient attention (cutlass),
cuDNN attention or math, by GPU architecture, dtype, head dim, mask, dropout and the user's
``torch.backends.cuda.enable_*_sdp`` / ``torch.nn.attention.sdpa_kernel`` settings; each
backend allocates, saves for backward and allocates in backward differently. The tracer
(``device_mode.DeviceMode``) routes ``F.scaled_dot_product_attention`` on virtual-GPU tensors to
:func:`scaled_dot_product_attention` here, which

1. chooses the backend as ``select_sdp_backend`` (``aten/src/ATen/native/transformers/cuda/
   sdp_utils.cpp``) would for the target GPU's compute capability: :func:`select_backend`;
2. prepares the mask as ``scaled_dot_product_attention`` (``transformers/attention.cpp``)
   does for that backend (``convert_boolean_attn_mask``, ``preprocess_mask``,
   ``pad_last_dim<8>`` for flash);
3. makes the allocations of the backend's CUDA forward and backward, in their order, with
   their shapes and dtypes, and saves for backward what the backend's autograd node saves
   (``tools/autograd/derivatives.yaml``): a custom ``autograd.Function`` per fused backend,
   plain differentiable ops for math (with ``native_dropout``: CUDA's fused dropout keeps a
   bool mask, the CPU's ``_dropout_impl`` a float noise tensor).

In real mode the values are computed on the CPU (a float32 reference of the math path, under
``_disable_current_modes`` so that its temporaries are not recorded) and copied into the
tensors the backend would allocate, so outputs and gradients match plain SDPA; dropout redraws
the same CPU noise in backward from the RNG state saved in forward. In fake mode only the
allocations happen.

Rules followed (PyTorch 2.6 to 2.13; where releases differ the newest rule is used unless noted)
------------------------------------------------------------------------------------------------
* Order: ``at::globalContext().sDPPriorityOrder()`` (``torch._C._get_sdp_priority_order()``;
  default flash, efficient, math, cudnn). ``check_prefer_cudnn_attention`` moves cuDNN first
  on sm90 / sm100 (2.8 and 2.9: cuDNN >= 9.9 builds; 2.10+: runtime cuDNN > 9.15, read from
  the running torch, so never for CPU builds); ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` /
  ``TORCH_CUDNN_SDPA_PREFERRED=0`` turn it off. All four backends disabled: error.
* flash (``can_use_flash_attention``): enabled; 4-D q/k/v; no attn_mask; equal head dims
  <= 256; sm80..sm121 (2.6: ..sm90); training (grad enabled and an input requires grad) on
  sm86/sm89/sm120/sm121 needs head dim <= 192, or > 224 without dropout; ``is_causal`` needs
  seqlen_q == seqlen_k; fp16/bf16; same batch; same heads, or ``enable_gqa`` with
  Hk == Hv dividing Hq; non-zero sequence lengths; last-dim stride 1 (head dim 1 exempt).
* efficient (``can_use_mem_efficient_attention``): enabled; sm50..sm121 (2.6: ..sm90);
  4-D; Dq == Dk, Dq and Dv multiples of ``minimum_gemm_alignment`` (sm80+: 8 for
  fp16/bf16, 4 for fp32; sm70/75: 8 for fp16, 1 for fp32; older: 1) and > 0; on sm80+ the
  storage offsets of q/k/v aligned to that many elements (``check_data_ptr_alignment_
  mem_efficient``, 2.10+); non-zero sequence lengths; last-dim stride 1 for q/k/v and the
  mask; same batch and heads (no GQA, the 2.6 rule); dtypes fp16/fp32, plus bf16 on sm80+.
  Dropout and arbitrary additive masks are supported; a float32 mask with half inputs (which
  ``validate_sdpa_input`` lets through) fails in the kernel ("invalid dtype for bias"), and is
  raised as that error (cuDNN reads it as given, math adds it in place).
* cudnn (``can_use_cudnn_attention``): enabled; not deterministic (unless warn-only);
  fp16/bf16; mask broadcastable as ``check_attn_mask_shape`` wants and not requiring grad;
  sm80..sm121; dropout a multiple of 1/16; B, H <= 65535; head dims multiples of 8 and
  <= 128 (256 on sm90/sm10x when cuDNN is preferred); seqlen_k != 1 (and seqlen_q != 1
  with dropout); last-dim stride 1; GQA as flash.
* math: enabled.

Allocations per backend (CUDA sources named in each function) are documented on
:class:`_Efficient`, :class:`_Flash`, :class:`_Cudnn` and :func:`_math`.

Limits: the choice is made at trace time for the tracer's target GPU, so a trace re-simulated
for a GPU of another architecture keeps the first GPU's backend; cuDNN's own workspaces,
flash's split-KV buffers (inference with few query blocks) and the 16-byte device seeds of
newer flash releases are not modelled; nested-tensor inputs go to PyTorch unchanged.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..frames import as_torch_error

FLASH = "flash_attention"
EFFICIENT = "efficient_attention"
MATH = "math"
CUDNN = "cudnn_attention"
OVERRIDEABLE = "overrideable"
BACKENDS = (FLASH, EFFICIENT, MATH, CUDNN)
# at::SDPBackend values, as torch._C._get_sdp_priority_order() returns them.
_ENUM = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN, 4: OVERRIDEABLE}
DEFAULT_ORDER = (FLASH, EFFICIENT, MATH, CUDNN)

_HALF = (torch.float16, torch.bfloat16)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}

Label = Callable[[torch.Tensor, str, "str | None"], None]


# --------------------------------------------------------------------------- backend choice
def user_flags() -> dict[str, bool]:
    """The ``torch.backends.cuda.enable_*_sdp`` switches (global C++ flags, which
    ``sdpa_kernel`` sets too; readable on CPU-only builds)."""
    b = torch.backends.cuda
    return {FLASH: b.flash_sdp_enabled(), EFFICIENT: b.mem_efficient_sdp_enabled(),
            MATH: b.math_sdp_enabled(), CUDNN: b.cudnn_sdp_enabled()}


def user_order() -> tuple[str, ...]:
    """``at::globalContext().sDPPriorityOrder()`` (``sdpa_kernel(..., set_priority=True)``
    changes it)."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    if get is None:
        return DEFAULT_ORDER
    return tuple(_ENUM.get(int(i), OVERRIDEABLE) for i in get())


def _torch_minor() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):  # pragma: no cover
        return (2, 99)


def prefer_cudnn(capability: tuple[int, int]) -> bool:
    """``check_prefer_cudnn_attention``: cuDNN first on sm90 / sm100 with a recent cuDNN.

    2.8 / 2.9 (``CUDNN_VERSION >= 90900``, the cu128 / cu129 wheels ship 9.10): major 9 or 10,
    minor 0. 2.10+: runtime cuDNN > 9.15.0, major 9 or 10 (CUDA < 13 builds: minor 0 or 3) -
    the runtime version is the running torch's, so a CPU build never prefers cuDNN. 2.6 / 2.7:
    never."""
    major, minor = capability
    if major not in (9, 10):
        return False
    version = _torch_minor()
    if version < (2, 8):
        return False
    if version < (2, 10):
        return os.environ.get("TORCH_CUDNN_SDPA_PREFERRED", "1") not in ("0", "false", "False") and minor == 0
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "") in ("1", "true", "True"):
        return False
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if not cudnn or cudnn <= 91500:
        return False
    cuda = torch.version.cuda or "0"
    return int(cuda.split(".")[0]) >= 13 or minor in (0, 3)


@dataclass(frozen=True)
class Inputs:
    """What ``sdp_params`` holds, read from (real or fake) tensors: shapes, strides and flags,
    never values."""

    dtype: torch.dtype
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    q_stride: tuple[int, ...]
    k_stride: tuple[int, ...]
    v_stride: tuple[int, ...]
    offsets: tuple[int, int, int]  # storage offsets of q, k, v (elements)
    element_size: int
    mask_shape: tuple[int, ...] | None = None
    mask_stride_last: int = 1
    mask_requires_grad: bool = False
    dropout_p: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    requires_grad: bool = False  # input_requires_grad: grad mode on and an input requires grad
    nested: bool = False

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False,
           requires_grad: bool | None = None) -> "Inputs":
        if requires_grad is None:
            requires_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        nested = q.is_nested or k.is_nested or v.is_nested
        return cls(
            dtype=q.dtype if q.dtype == k.dtype == v.dtype else torch.uint8,
            q_shape=tuple(q.shape), k_shape=tuple(k.shape), v_shape=tuple(v.shape),
            q_stride=() if nested else tuple(q.stride()), k_stride=() if nested else tuple(k.stride()),
            v_stride=() if nested else tuple(v.stride()),
            offsets=(0, 0, 0) if nested else (q.storage_offset(), k.storage_offset(), v.storage_offset()),
            element_size=q.element_size(),
            mask_shape=None if attn_mask is None else tuple(attn_mask.shape),
            mask_stride_last=1 if attn_mask is None or attn_mask.dim() == 0 else attn_mask.stride(-1),
            mask_requires_grad=bool(attn_mask is not None and attn_mask.requires_grad),
            dropout_p=float(dropout_p), is_causal=bool(is_causal), enable_gqa=bool(enable_gqa),
            requires_grad=bool(requires_grad), nested=nested)

    @property
    def four_d(self) -> bool:  # check_tensor_shapes
        return len(self.q_shape) == len(self.k_shape) == len(self.v_shape) == 4


def _deterministic() -> bool:
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


def _sm_in(cc: tuple[int, int], lo: tuple[int, int], hi: tuple[int, int]) -> bool:
    """``check_sm_version<lo, hi>``: inclusive range."""
    return lo <= cc <= hi


def _batch_and_heads(p: Inputs, supports_gqa: bool) -> bool:
    """``check_batch_size_and_num_heads_dense``."""
    if not (p.q_shape[0] == p.k_shape[0] == p.v_shape[0]):
        return False
    hq, hk, hv = p.q_shape[-3], p.k_shape[-3], p.v_shape[-3]
    if p.enable_gqa and supports_gqa:  # check_grouped_query_attention
        return hk == hv and hk > 0 and hq % hk == 0
    return hq == hk == hv


def _dense_common(p: Inputs, ignore_singleton_dim: bool) -> bool:
    """``check_nonzero_sequence_lengths_dense`` and ``check_last_dim_stride_equals_1_dense``."""
    if p.q_shape[-2] == 0 or p.k_shape[-2] == 0:
        return False
    strides_1 = p.q_stride[-1] == 1 and p.k_stride[-1] == 1 and p.v_stride[-1] == 1
    if ignore_singleton_dim:
        strides_1 = strides_1 or p.q_shape[-1] == 1
    return strides_1 and p.mask_stride_last == 1


def minimum_gemm_alignment(p: Inputs, cc: tuple[int, int]) -> int:
    """``minimum_gemm_alignment`` (elements) with ``use_tensor_cores``."""
    is_half = p.dtype in _HALF
    use_tc = cc[0] >= 8 or (cc[0] >= 7 and is_half)
    align = 4 if cc[0] >= 8 else 1
    if use_tc:
        align = max(align, 128 // (16 if is_half else 32))
    return align


def can_use_flash(p: Inputs, cc: tuple[int, int], flags: dict[str, bool]) -> bool:
    """``can_use_flash_attention``."""
    if not flags.get(FLASH, True) or p.nested or not p.four_d or p.mask_shape is not None:
        return False
    d = p.q_shape[-1]
    if not (d == p.k_shape[-1] == p.v_shape[-1] and d <= 256):  # check_head_dim_size_flash
        return False
    if not _sm_in(cc, (8, 0), (12, 1)):  # check_flash_attention_hardware_support
        return False
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    if p.requires_grad and (_sm_in(cc, (8, 6), (8, 9)) or _sm_in(cc, (12, 0), (12, 1))):
        if not (d <= 192 or (p.dropout_p <= 0.0 and d > 224)):
            return False
    if p.is_causal and p.q_shape[-2] != p.k_shape[-2]:  # check_flash_causal_non_square_seqlens
        return False
    if p.dtype not in (_HALF if cc[0] >= 8 else (torch.float16,)):  # check_dtypes_low_precision
        return False
    return _batch_and_heads(p, supports_gqa=True) and _dense_common(p, ignore_singleton_dim=True)


def can_use_efficient(p: Inputs, cc: tuple[int, int], flags: dict[str, bool]) -> bool:
    """``can_use_mem_efficient_attention``."""
    if not flags.get(EFFICIENT, True) or p.nested or not p.four_d:
        return False
    if not _sm_in(cc, (5, 0), (12, 1)):  # check_mem_efficient_hardware_support
        return False
    align = minimum_gemm_alignment(p, cc)
    dq, dk, dv = p.q_shape[-1], p.k_shape[-1], p.v_shape[-1]
    if not (dq == dk and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        return False  # check_head_dim_size_mem_efficient
    if cc[0] >= 8:  # check_data_ptr_alignment_mem_efficient
        nbytes = align * p.element_size
        if any((off * p.element_size) % nbytes for off in p.offsets):
            return False
    if not (_dense_common(p, ignore_singleton_dim=False) and _batch_and_heads(p, supports_gqa=False)):
        return False
    allowed = (torch.float16, torch.float32, torch.bfloat16) if cc[0] >= 8 else (torch.float16, torch.float32)
    return p.dtype in allowed


def _cudnn_mask_ok(p: Inputs) -> bool:
    """``check_attn_mask_shape``."""
    m = p.mask_shape
    if m is None:
        return True
    if p.mask_requires_grad or len(m) < 2:
        return False
    b, h, lq, lk = p.q_shape[0], p.q_shape[1], p.q_shape[2], p.k_shape[2]
    if m[-2] not in (lq, 1) or m[-1] not in (lk, 1):
        return False
    return len(m) == 2 or (len(m) == 4 and m[0] in (1, b) and m[1] in (1, h))


def can_use_cudnn(p: Inputs, cc: tuple[int, int], flags: dict[str, bool]) -> bool:
    """``can_use_cudnn_attention`` (with cuDNN 9.x)."""
    if not flags.get(CUDNN, True) or p.nested or not p.four_d:
        return False
    if _deterministic():  # check_cudnn_deterministic
        return False
    if p.dtype not in _HALF or not _cudnn_mask_ok(p) or not _sm_in(cc, (8, 0), (12, 1)):
        return False
    if p.dropout_p * 16.0 != math.floor(p.dropout_p * 16.0):  # check_cudnn_dropout
        return False
    b, h, s_q, d_qk = p.q_shape
    s_k, d_v = p.k_shape[2], p.v_shape[3]
    limit = 256 if prefer_cudnn(cc) else 128  # check_cudnn_tensor_shapes
    if b > 65535 or h > 65535 or d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1 or (p.dropout_p != 0.0 and s_q == 1):
        return False
    return _dense_common(p, ignore_singleton_dim=True) and _batch_and_heads(p, supports_gqa=True)


def select_backend(p: Inputs, capability: tuple[int, int], flags: dict[str, bool] | None = None,
                   order: tuple[str, ...] | None = None) -> str:
    """``select_sdp_backend``: the first backend of the priority order that can run ``p`` on a
    GPU of compute ``capability``. Raises RuntimeError as PyTorch does when none can."""
    flags = user_flags() if flags is None else flags
    if not any(flags.get(b, False) for b in BACKENDS):
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found. "
                           "This is likely due to turning off both the math kernel and the fused kernels.")
    if order is None:
        order = user_order()
        if tuple(b for b in order if b != OVERRIDEABLE) == DEFAULT_ORDER and prefer_cudnn(capability):
            order = (CUDNN, FLASH, EFFICIENT, MATH)
    checks = {FLASH: can_use_flash, EFFICIENT: can_use_efficient, CUDNN: can_use_cudnn}
    for backend in order:
        if backend == MATH:
            if flags.get(MATH, False):
                return MATH
        elif backend in checks and checks[backend](p, capability, flags):
            return backend
    raise RuntimeError("No available kernel. Aborting execution. (xmem: no SDPA backend of the "
                       f"target GPU sm{capability[0]}{capability[1]} accepts these inputs)")


# --------------------------------------------------------------------------- helpers
def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _no_label(t: torch.Tensor, op: str, category: str | None = None) -> None:
    pass


def _no_autocast() -> Any:
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


class _Hidden:
    """Real-mode value computation that the tracer does not record: no dispatch modes (the
    tracer's ``AllocMode``), no torch-function modes, no autograd, no autocast."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import _disable_current_modes

        self._stack = [_disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad(), _no_autocast()]
        for cm in self._stack:
            cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for cm in reversed(self._stack):
            cm.__exit__(*exc)


def _bool_to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``convert_boolean_attn_mask``: ``where(mask.logical_not(), -inf, scalar_tensor(0))``."""
    if mask.dtype != torch.bool:
        return mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), -math.inf, zero)


def _gqa_expand(k: torch.Tensor, v: torch.Tensor, hq: int, enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``pre_process_group_query_attention_input``."""
    if enable_gqa and k.dim() >= 3 and k.shape[-3] != hq:
        k = k.repeat_interleave(hq // k.shape[-3], dim=-3)
        v = v.repeat_interleave(hq // v.shape[-3], dim=-3)
    return k, v


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool,
               grad_out: torch.Tensor | None = None, rng: torch.Tensor | None = None) -> Any:
    """The math path on (B, H, L, D) tensors in float32, for real-mode values: forward output,
    or, with ``grad_out``, the gradients (q, k, v, bias) by hand (no autograd inside the
    engine). The dropout noise is drawn as CPU ``_dropout_impl`` draws it
    (``empty_like(attn).bernoulli_(1 - p)``), after restoring ``rng`` when given."""
    dtype = q.dtype
    hq, hk = q.shape[-3], k.shape[-3]
    qf, kf, vf = q.float(), k.float(), v.float()
    kf, vf = _gqa_expand(kf, vf, hq, enable_gqa)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    attn = torch.matmul(qf, kf.transpose(-2, -1)) * sc
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn = attn.masked_fill(keep.logical_not(), -math.inf)
    if bias is not None:
        attn = attn + _bool_to_additive(bias, torch.float32).float()
    probs = torch.softmax(attn, -1)
    noise = None
    if dropout_p > 0.0:
        saved = torch.get_rng_state() if rng is not None else None
        if rng is not None:
            torch.set_rng_state(rng)
        noise = torch.empty_like(probs).bernoulli_(1 - dropout_p)
        noise.div_(1 - dropout_p)
        if saved is not None:
            torch.set_rng_state(saved)
    dropped = probs * noise if noise is not None else probs
    if grad_out is None:
        return torch.matmul(dropped, vf).to(dtype)
    g = grad_out.float()
    grad_v = torch.matmul(dropped.transpose(-2, -1), g)
    grad_dropped = torch.matmul(g, vf.transpose(-2, -1))
    grad_probs = grad_dropped * noise if noise is not None else grad_dropped
    grad_attn = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_q = torch.matmul(grad_attn, kf) * sc
    grad_k = torch.matmul(grad_attn.transpose(-2, -1), qf) * sc
    if enable_gqa and hk != hq:
        shape = (*grad_k.shape[:-3], hk, hq // hk, *grad_k.shape[-2:])
        grad_k = grad_k.reshape(shape).sum(-3)
        grad_v = grad_v.reshape((*grad_v.shape[:-3], hk, hq // hk, *grad_v.shape[-2:])).sum(-3)
    return grad_q, grad_k, grad_v, grad_attn


# --------------------------------------------------------------------------- fused backends
class _Fused(torch.autograd.Function):
    """One fused SDPA call: ``plan`` makes the backend's allocations and values."""

    @staticmethod
    def forward(ctx: Any, plan: "_Plan", q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.plan = plan
        out, saved = plan.forward(q, k, v, bias)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> Any:
        if grad is None:  # "if (!grad_out_.defined()) return {}"
            return None, None, None, None, None
        grads = ctx.plan.backward(grad, ctx.saved_tensors, ctx.needs_input_grad[4])
        return (None, *grads)


@dataclass
class _Plan:
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    capability: tuple[int, int]
    real: bool
    label: Label
    compute_lse: bool = True
    rng: torch.Tensor | None = None

    def _values(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Real mode: the output (B, H, L, Dv) of the math path, drawing the dropout noise."""
        with _Hidden():
            if self.dropout_p > 0.0:
                self.rng = torch.get_rng_state()
            return _reference(q, k, v, bias, self.dropout_p, self.is_causal, self.scale, self.enable_gqa)

    def _grads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               grad_out: torch.Tensor) -> tuple:
        with _Hidden():
            return _reference(q, k, v, bias, self.dropout_p, self.is_causal, self.scale, self.enable_gqa,
                              grad_out=grad_out, rng=self.rng)

    def _fill_grads(self, targets: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    bias: torch.Tensor | None, go: torch.Tensor) -> None:
        """Real mode: write the true gradients into the backend's buffers (q / k / v / grad_out
        and the query, key, value gradients in (B, L, H, D) layout; the bias gradient as is)."""
        if not self.real:
            return
        grads = self._grads(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, go.transpose(1, 2))
        with _Hidden():
            for i, dst in enumerate(targets):
                if dst is not None:
                    dst.copy_(grads[i] if i == 3 else grads[i].transpose(1, 2))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        raise NotImplementedError

    def backward(self, grad: torch.Tensor, saved: tuple, bias_grad: bool) -> tuple:
        raise NotImplementedError


def _cutlass_backward_kernel(dtype: torch.dtype, cc: tuple[int, int], max_k: int,
                             dropout: bool) -> tuple[int, int, int]:
    """(kBlockSizeI, kBlockSizeJ, kMaxK) of the kernel ``dispatch_cutlassB`` launches
    (``mem_eff_attention/kernels/cutlassB.h``: the first compatible entry of the arch's list).
    128x128 kernels are skipped on GPUs with ~100 KiB of shared memory per block (sm86, sm89,
    sm12x), which cannot hold their ``SharedStorage``."""
    sm = cc[0] * 10 + cc[1]
    half = dtype in _HALF
    big_smem = sm in (80, 87, 90, 100, 103)
    if sm >= 80 and half:
        cands = [(64, 64, 32), (64, 64, 64)]
        if sm in (86, 89) and not dropout:
            cands.append((128, 64, 96))
        if big_smem:
            cands.append((128, 128, 128))
        cands += [(64, 64, 128), (128, 64, 65536), (64, 64, 65536)]
    elif sm >= 80:
        cands = [(64, 64, 32), (64, 64, 64), (128, 64, 128), (64, 64, 128), (128, 64, 65536), (64, 64, 65536)]
        if not big_smem:
            cands.remove((128, 64, 128))
            cands.remove((128, 64, 65536))
    else:
        cands = [(64, 64, 32), (64, 64, 64), (64, 64, 128), (64, 64, 65536)]
    for bi, bj, kmax in cands:
        if kmax >= max_k:
            return bi, bj, kmax
    return cands[-1]


def efficient_backward_workspace(dtype: torch.dtype, cc: tuple[int, int], b: int, h: int, m: int, n: int,
                                 k: int, kv: int, dropout: bool, deterministic: bool = False) -> int:
    """Bytes of the workspace ``_efficient_attention_backward`` allocates: ``p.workspace_size()``
    of ``AttentionBackwardKernel`` (``mem_eff_attention/kernel_backward.h``): per (batch, head)
    fp32 staging for grad_q (``kNeedsAccumGradQ``: sm70+ or fp16/bf16; ``GradQTempStorage``
    tiles of kBlockSizeI x kBlockSizeJ floats plus a 16-byte lock) and for grad_k / grad_v
    when they do not fit in registers (``kNeedsAccumGradK``: fp16/bf16 with kMaxK > kBlockSizeI),
    times the key splits of the split-keys heuristic."""
    bi, bj, kmax = _cutlass_backward_kernel(dtype, cc, max(k, kv), dropout)
    half = dtype in _HALF
    split_keys = cc[0] >= 7  # kEnableSplitKeys
    accum_q = split_keys or half
    accum_kv = half and not (kmax <= bi)  # !kOutputInRF && output_t != float
    splits = 1
    if split_keys and accum_kv:  # (only grad_k / grad_v are split: no guards on a symbolic batch where not)
        splits = -(-n // bj)
        if b * h >= 256 and n <= 2 * bj:
            splits = 1
        splits = min(splits, 200 // (b * h)) if b * h else splits
        if splits < 1 or deterministic:
            splits = 1
    gk = splits * bj * _round_up(k, bi) if accum_kv else 0
    gv = splits * bj * _round_up(kv, bi) if accum_kv else 0
    gq = (-(-m // bi)) * (-(-k // bj)) * (bi * bj + 4) if accum_q else 0
    return b * h * _round_up(gk + gv + gq, 4) * 4


@dataclass
class _Efficient(_Plan):
    """Memory-efficient attention (cutlass), on (B, M, H, K) views of q/k/v.

    Forward (``_scaled_dot_product_efficient_attention_cuda`` -> ``_efficient_attention_forward``,
    ``transformers/cuda/attention.cu``): ``res`` (B, M, H, Kv) in the input dtype; ``logsumexp``
    (B, H, ceil(M/32)*32) float32 when ``compute_log_sumexp`` (grad enabled and an input
    requires grad; else 0 elements); for fp16/bf16 with head dim > 128 (kernels with
    ``kNeedsOutputAccumulatorBuffer``) a float32 ``output_accum`` like ``res``, freed at once.
    Seed and offset are CPU scalars outside graph capture. Saved (derivatives.yaml): query, key,
    value, attn_bias, output, log_sumexp.

    Backward (``_scaled_dot_product_efficient_attention_backward_cuda`` ->
    ``_efficient_attention_backward``, ``attention_backward.cu``): ``grad_out.contiguous()``
    (a copy unless the incoming gradient is (B, M, H, Kv)-contiguous); grad_q, grad_k, grad_v
    (``at::empty(query.sizes())``, contiguous (B, M, H, *)); grad_bias (last dim padded to 16)
    when the bias requires grad; ``delta`` (B, H, M) float32 when the kernel computes it
    (fp16/bf16), else ``(grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()``
    with its temporaries; then the workspace (:func:`efficient_backward_workspace`). Delta and
    workspace die when the call returns."""

    def forward(self, q, k, v, bias):
        b, m, h, kd = q.shape
        kv = v.shape[-1]
        op = "aten._efficient_attention_forward"
        res = q.new_empty((b, m, h, kv))
        self.label(res, op, None)
        lse = q.new_empty((b, h, _round_up(m, 32) if self.compute_lse else 0), dtype=torch.float32)
        self.label(lse, op, None)
        if q.dtype in _HALF and max(kd, kv) > 128:
            acc = q.new_empty((b, m, h, kv), dtype=torch.float32)
            self.label(acc, op, "workspace")
            del acc
        if self.real:
            out = self._values(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               None if bias is None else bias)
            with _Hidden():
                res.copy_(out.transpose(1, 2))
        return res, (q, k, v, bias, res, lse)

    def backward(self, grad, saved, bias_grad):
        q, k, v, bias, res, lse = saved
        b, m, h, kd = q.shape
        n, kv = k.shape[1], v.shape[-1]
        op = "aten._efficient_attention_backward"
        go = grad.contiguous()
        gq, gk, gv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        for t in (gq, gk, gv):
            self.label(t, op, None)
        gb = None
        if bias is not None and bias_grad:
            gb = bias.new_empty((*bias.shape[:-1], _round_up(bias.shape[-1], 16)))[..., :bias.shape[-1]]
            self.label(gb, op, None)
        bi, _, kmax = _cutlass_backward_kernel(q.dtype, self.capability, max(kd, kv), self.dropout_p > 0)
        computes_delta = q.dtype in _HALF and (kmax <= bi or self.capability[0] * 10 + self.capability[1] != 70)
        if computes_delta:
            delta = q.new_empty((b, h, m), dtype=torch.float32)
        else:
            delta = (go.to(torch.float32) * res.to(torch.float32)).sum(-1).transpose(-2, -1).contiguous()
        self.label(delta, op, "workspace")
        size = efficient_backward_workspace(q.dtype, self.capability, b, h, m, n, kd, kv, self.dropout_p > 0,
                                            _deterministic())
        workspace = q.new_empty((size,), dtype=torch.uint8) if size else None
        if workspace is not None:
            self.label(workspace, op, "workspace")
        self._fill_grads((gq, gk, gv, gb), q, k, v, bias, go)
        del workspace, delta, go
        return gq, gk, gv, gb


@dataclass
class _Flash(_Plan):
    """Flash attention 2, on (B, L, H, D) views of q/k/v (head dim padded to a multiple of 8).

    Forward (``_scaled_dot_product_flash_attention_cuda`` -> ``_flash_attention_forward`` ->
    ``mha_fwd``, ``flash_attn/flash_api.cpp``): ``out = empty_like(q)``; ``softmax_lse``
    (B, H, L) float32. Seed/offset are scalars (CPU, or 16 bytes on the device in newer
    releases: not modelled); no split-KV buffers with dropout or training-sized grids. Saved:
    query, key, value, output, logsumexp.

    Backward (``_flash_attention_backward`` -> ``mha_bwd``): ``grad_out.contiguous()`` and
    ``out.contiguous()`` (copies unless (B, L, H, D)-contiguous: ``out`` is laid out like q, so
    a q made contiguous as (B, H, L, D) costs a copy of the output here); dq, dk, dv
    (``empty_like``); ``softmax_d`` (B, H, round128(L)) float32; ``dq_accum``
    (B, round128(L), H, round32(D)) float32 (deterministic mode: zeros with
    ceil(SMs / (B*H)) splits); for GQA ``dk_expanded`` / ``dv_expanded`` with all query heads.
    All but dq/dk/dv die when the call returns."""

    sm_count: int = 108

    @staticmethod
    def _prepared(t: torch.Tensor) -> torch.Tensor:
        """How the backward takes the output and its gradient: ``.contiguous()``."""
        return t.contiguous()

    def _is_deterministic(self) -> bool:
        return _deterministic()

    def forward(self, q, k, v, bias):
        b, m, h, d = q.shape
        op = "aten._flash_attention_forward"
        res = torch.empty_like(q)
        self.label(res, op, None)
        lse = q.new_empty((b, h, m), dtype=torch.float32)
        self.label(lse, op, None)
        if self.real:
            out = self._values(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)
            with _Hidden():
                res.copy_(out.transpose(1, 2))
        return res, (q, k, v, res, lse)

    def backward(self, grad, saved, bias_grad):
        q, k, v, res, lse = saved[:5]
        b, m, h, d = q.shape
        n, hk = k.shape[1], k.shape[2]
        op = "aten._flash_attention_backward"
        go = self._prepared(grad)
        out = self._prepared(res)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for t in (dq, dk, dv):
            self.label(t, op, None)
        m128 = _round_up(m, 128)
        softmax_d = q.new_empty((b, h, m128), dtype=torch.float32)
        self.label(softmax_d, op, "workspace")
        d_round = _round_up(d, 32 if d <= 128 else 64)
        if self._is_deterministic():
            splits = -(-self.sm_count // max(1, b * h))
            dq_accum = q.new_zeros((splits, b, m128, h, d_round), dtype=torch.float32)
        else:
            dq_accum = q.new_empty((b, m128, h, d_round), dtype=torch.float32)
        self.label(dq_accum, op, "workspace")
        expanded = ()
        if hk != h:
            expanded = (q.new_empty((b, n, h, d)), q.new_empty((b, n, h, v.shape[-1])))
            for t in expanded:
                self.label(t, op, "workspace")
        self._fill_grads((dq, dk, dv), q, k, v, None, go)
        del dq_accum, expanded, softmax_d, go, out
        return dq, dk, dv, None


def _bottom_right_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                            scale: float) -> torch.Tensor:
    """FlashAttention-2's values on (B, H, L, D): its causal mask is aligned to the bottom right
    (a decode step's one query sees every key), where SDPA's is aligned to the top left."""
    qf, kf, vf = q.float(), k.float(), v.float()
    kf, vf = _gqa_expand(kf, vf, q.shape[-3], True)
    attn = torch.matmul(qf, kf.transpose(-2, -1)) * scale
    if causal:
        m, n = q.shape[-2], k.shape[-2]
        attn = attn.masked_fill(torch.ones(m, n, dtype=torch.bool).tril(n - m).logical_not(), -math.inf)
    return torch.matmul(torch.softmax(attn, -1).nan_to_num(0.0), vf).to(q.dtype)


@dataclass
class _FlashPackage(_Flash):
    """FlashAttention-2's own package (``flash_attn``, Dao-AILab, 2.x): ``flash_attn_func`` runs
    the same ``mha_fwd`` / ``mha_bwd`` as PyTorch's copy (:class:`_Flash`), entered through
    ``flash_attn_interface.py``: its tensors are only made contiguous in the last dim
    (``maybe_contiguous``: no copy of the output or its gradient in backward), and the forward
    keeps an ``rng_state`` of 2 int64 on the device for the backward. Real mode: values with the
    bottom-right causal mask; dropout, ``window_size``, ``softcap`` and ``alibi_slopes`` change
    values only (none of them allocates), and real-mode values leave them out."""

    deterministic: bool = False  # the call's own flag (the package reads no global setting)

    @staticmethod
    def _prepared(t: torch.Tensor) -> torch.Tensor:
        return t if t.stride(-1) == 1 else t.contiguous()

    def _is_deterministic(self) -> bool:
        return self.deterministic

    def _values(self, q, k, v, bias):
        with _Hidden():
            return _bottom_right_reference(q, k, v, self.is_causal, self.scale)

    def forward(self, q, k, v, bias):
        res, saved = super().forward(q, k, v, bias)
        rng = q.new_empty((2,), dtype=torch.int64)
        self.label(rng, "flash_attn.fwd", None)
        return res, (*saved, rng)


@dataclass
class _FlashVarlen(_FlashPackage):
    """``flash_attn_varlen_func``: sequences packed along one token axis, q (total_q, H, D), their
    bounds in ``cu_seqlens`` (``mha_varlen_fwd`` / ``mha_varlen_bwd``). Forward: ``out``
    like q, ``softmax_lse`` (H, total_q) float32, the rng state. Backward: dq, dk, dv;
    ``softmax_d`` (batch, H, round128(max_seqlen_q)) and ``dq_accum`` (H, total_q + 128 x batch,
    round32(D)) float32 (deterministic: zeros with ceil(SMs / (batch x H)) splits); for GQA
    ``dk_expanded`` / ``dv_expanded`` (total_k, H, D)."""

    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    max_q: int = 0

    def _segments(self) -> Iterator[tuple[slice, slice]]:
        """Each sequence's rows: of the queries, of the keys and values."""
        bq, bk = self.cu_q.tolist(), self.cu_k.tolist()
        for i in range(len(bq) - 1):
            yield slice(bq[i], bq[i + 1]), slice(bk[i], bk[i + 1])

    def forward(self, q, k, v, bias):
        total, h, d = q.shape
        op = "flash_attn.varlen_fwd"
        res = torch.empty_like(q)
        self.label(res, op, None)
        lse = q.new_empty((h, total), dtype=torch.float32)
        self.label(lse, op, None)
        rng = q.new_empty((2,), dtype=torch.int64)
        self.label(rng, op, None)
        if self.real:
            with _Hidden():
                for rq, rk in self._segments():
                    out = _bottom_right_reference(q[rq].transpose(0, 1), k[rk].transpose(0, 1), v[rk].transpose(0, 1),
                                                  self.is_causal, self.scale)
                    res[rq].copy_(out.transpose(0, 1))
        return res, (q, k, v, res, lse, rng)

    def backward(self, grad, saved, bias_grad):
        q, k, v, res, lse = saved[:5]
        total, h, d = q.shape
        hk = k.shape[1]
        op = "flash_attn.varlen_bwd"
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for t in (dq, dk, dv):
            self.label(t, op, None)
        go, out = self._prepared(grad), self._prepared(res)
        batch = self.cu_q.shape[0] - 1
        softmax_d = q.new_empty((batch, h, _round_up(self.max_q, 128)), dtype=torch.float32)
        self.label(softmax_d, op, "workspace")
        d_round = _round_up(d, 32 if d <= 128 else 64)
        rows = total + 128 * batch
        if self.deterministic:
            splits = -(-self.sm_count // max(1, batch * h))
            dq_accum = q.new_zeros((splits, h, rows, d_round), dtype=torch.float32)
        else:
            dq_accum = q.new_empty((h, rows, d_round), dtype=torch.float32)
        self.label(dq_accum, op, "workspace")
        expanded = ()
        if hk != h:
            expanded = (q.new_empty((k.shape[0], h, d)), q.new_empty((k.shape[0], h, v.shape[-1])))
            for t in expanded:
                self.label(t, op, "workspace")
        if self.real:  # the true gradients, one sequence at a time
            for rq, rk in self._segments():
                grads = self._grads(*(t.transpose(0, 1).unsqueeze(0) for t in (q[rq], k[rk], v[rk])), None,
                                    go[rq].transpose(0, 1).unsqueeze(0))
                with _Hidden():
                    for dst, rows, g in ((dq, rq, grads[0]), (dk, rk, grads[1]), (dv, rk, grads[2])):
                        dst[rows].copy_(g[0].transpose(0, 1))
        del dq_accum, expanded, softmax_d, go, out
        return dq, dk, dv, None


def _on_padded_head(kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A FlashAttention-2 kernel's call (``kernel(q, k, v)``, its scale that of the unpadded head
    dim) as its entry points make it: the head dim padded with zeros to a multiple of 8
    (``pad_last_dim<8>``: q.k and the output are unchanged), the output cut back
    (``post_process_flash_output``)."""
    d = q.shape[-1]
    if d % 8:
        q, k, v = (torch.nn.functional.pad(t, (0, 8 - d % 8)) for t in (q, k, v))
    out = kernel(q, k, v)
    return out[..., :d] if d % 8 else out


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float | None,
               causal: bool, deterministic: bool, *, capability: tuple[int, int], sm_count: int, real: bool,
               label: Label, varlen: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> torch.Tensor:
    """``flash_attn_func`` (q, k, v as (B, L, H, D)) or, with ``varlen`` = (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q), ``flash_attn_varlen_func`` (as (total, H, D)) of the
    FlashAttention-2 package, on the target GPU: the head dim padded to a multiple of 8 as the
    package pads it, the output cut back."""
    sc = scale if scale is not None else q.shape[-1] ** -0.5  # the package's default

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        common = dict(dropout_p=float(dropout_p), is_causal=bool(causal), scale=sc, enable_gqa=True,
                      capability=capability, real=real, label=label, sm_count=sm_count,
                      deterministic=bool(deterministic))
        plan = _FlashPackage(**common) if varlen is None else _FlashVarlen(
            **common, cu_q=varlen[0], cu_k=varlen[1], max_q=int(varlen[2]))
        return _Fused.apply(plan, q, k, v, None)

    return _on_padded_head(kernel, q, k, v)


def compiled_flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float | None,
                        causal: bool, varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None = None) -> torch.Tensor:
    """:func:`flash_attn` while Dynamo captures a graph: PyTorch's own FlashAttention-2 op
    (``aten._flash_attention_forward``, whose derivative is ``_flash_attention_backward``), which
    stays in the graph as the package's custom ops (2.7+) do on a GPU, and Inductor runs it as an
    extern kernel. ``varlen``: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    cu_q, cu_k, max_q, max_k = varlen if varlen is not None else (None, None, q.shape[1], k.shape[1])
    sc = scale if scale is not None else q.shape[-1] ** -0.5  # the package's default
    return _on_padded_head(lambda q, k, v: torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, float(dropout_p), bool(causal), False, scale=sc)[0], q, k, v)


def _matching_layout(q: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``alloc_with_matching_layout``: a tensor of ``shape`` whose dims are ordered in memory as
    q's are."""
    if tuple(q.shape) == tuple(shape):
        return torch.empty_like(q)
    order = sorted(range(4), key=lambda i: q.stride()[i], reverse=True)
    strides = [0] * 4
    s = 1
    for i in reversed(order):
        strides[i] = s
        s *= shape[i]
    return q.new_empty_strided(shape, strides)


def cudnn_backward_workspace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes cuDNN's SDPA backward graph asks the caching allocator for, as read off an H200's
    recordings (cuDNN 9.19, torch 2.11; benchmarks/data/gpu_groundtruth-nvidia-h200-2026-12-04.jsonl:
    34,078,976 B for B 8, H 16, L 1024, D 64; 33,816,832 B for Llama's B 2, H 32, 4 key/value heads):
    a float32 dQ accumulator (B, H, Lq, D) and a float32 row sum (B, H, Lq) plus 256 B; with fewer
    key/value heads than query heads, dK and dV widened to the query's heads in the inputs' dtype."""
    b, h, m, d = q.shape
    n, dv = k.shape[-2], v.shape[-1]
    size = b * h * m * d * 4 + b * h * m * 4 + 256
    if k.shape[1] != h:
        size += b * h * n * (d + dv) * q.element_size()
    return size


@dataclass
class _Cudnn(_Plan):
    """cuDNN attention, on (B, H, L, D) q/k/v.

    Forward (``_scaled_dot_product_cudnn_attention_cuda`` -> ``_cudnn_attention_forward``):
    ``out`` (B, H, L, Dv) laid out like q (``alloc_with_matching_layout``); ``softmaxstats``
    (B, H, L, 1) float32; seed and offset int64 scalars on the device (an H200's forward asked for
    nothing more). Saved: query, key, value, attn_bias, output, logsumexp, seed, offset.

    Backward (``_cudnn_attention_backward``): the incoming gradient copied to out's layout when
    its strides differ; dq, dk, dv (``empty_like``); then the cuDNN graph's workspace
    (:func:`cudnn_backward_workspace`), freed at once."""

    def forward(self, q, k, v, bias):
        b, h, m, _ = q.shape
        op = "aten._cudnn_attention_forward"
        res = _matching_layout(q, (b, h, m, v.shape[-1]))
        self.label(res, op, None)
        lse = q.new_empty((b, h, m, 1), dtype=torch.float32)
        self.label(lse, op, None)
        seed, offset = q.new_empty((), dtype=torch.int64), q.new_empty((), dtype=torch.int64)
        for t in (seed, offset):
            self.label(t, op, None)
        if self.real:
            out = self._values(q, k, v, bias)
            with _Hidden():
                res.copy_(out)
        return res, (q, k, v, bias, res, lse, seed, offset)

    def backward(self, grad, saved, bias_grad):
        q, k, v, bias, res, lse, seed, offset = saved
        op = "aten._cudnn_attention_backward"
        go = grad
        if grad.stride() != res.stride():
            go = res.new_empty_strided(res.shape, res.stride())
            go.copy_(grad)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for t in (dq, dk, dv):
            self.label(t, op, None)
        workspace = q.new_empty((cudnn_backward_workspace(q, k, v),), dtype=torch.uint8)
        self.label(workspace, op, "workspace")
        del workspace  # freed when the cuDNN graph has run
        if self.real:
            grads = self._grads(q, k, v, bias, go)
            with _Hidden():
                dq.copy_(grads[0])
                dk.copy_(grads[1])
                dv.copy_(grads[2])
        return dq, dk, dv, None


# --------------------------------------------------------------------------- math
def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
          is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` (``transformers/attention.cpp``) as a CUDA device
    runs it: fp16/bf16 inputs computed in float32 (unless
    ``allow_fp16_bf16_reduction_math_sdp``); q and k each scaled by sqrt(scale); a causal mask
    built as ``ones(L, S, bool).tril()`` made additive; ``attn.add_(mask)``; softmax; dropout
    through ``at::dropout``, which on CUDA is the fused ``native_dropout`` (bool mask saved);
    ``matmul(attn, v)`` and ``attn`` cast back to the input dtype."""
    dtype = q.dtype
    allow = getattr(torch._C, "_get_math_sdp_allow_fp16_bf16_reduction", lambda: False)()
    if dtype in _HALF and not q.is_nested and not allow:
        q, k, v = q.to(torch.float32), k.to(torch.float32), v.to(torch.float32)
    negative = scale is not None and scale < 0.0
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else abs(scale)
    factor = math.sqrt(sc)
    query = q * (-factor if negative else factor)
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = _bool_to_additive(mask, q.dtype)
    k, v = _gqa_expand(k, v, q.shape[-3] if q.dim() >= 3 else 1, enable_gqa)
    attn = torch.matmul(query, k.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)
    attn = torch.softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    out = torch.matmul(attn, v)
    if out.dtype != dtype:
        out = out.to(dtype)
        attn.to(dtype)  # the op's second output, dropped at once
    return out


# --------------------------------------------------------------------------- entry points
def _autocast_dtype() -> torch.dtype | None:
    """The dtype a CUDA autocast region would cast SDPA's inputs to (``scaled_dot_product_
    attention`` is on CUDA's lower-precision list), or None outside one. The virtual device's
    regions are CPU autocast regions (``virtual_cuda``), possibly answering for "cuda" too."""
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                return torch.get_autocast_dtype(device)
        except (RuntimeError, TypeError, AttributeError):  # pragma: no cover - old torch
            continue
    return None


def _cast_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """``t``'s dtype after autocast's cast to ``dtype`` (None: no autocast): ``cached_cast``
    eligibility, floating point and not float64."""
    return dtype if dtype is not None and t.is_floating_point() and t.dtype != torch.float64 else t.dtype


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None or _cast_dtype(t, dtype) == t.dtype:
        return t
    return t.to(dtype)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                 *, capability: tuple[int, int] = (8, 0), sm_count: int = 108, real: bool = True,
                                 label: Label = _no_label, backend: str | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention on a GPU of compute ``capability``: the backend
    :func:`select_backend` picks (or ``backend``), with that backend's allocations. ``real``:
    compute values (real CPU tensors) or only allocate (fake tensors). ``label(tensor, op,
    category)`` names the CUDA op (and, for scratch, the category) of each allocation."""
    dt = _autocast_dtype()
    with contextlib.ExitStack() as stack:
        if dt is not None:  # the autocast wrapper casts, then runs the op with autocast excluded
            query, key, value, attn_mask = _cast(query, dt), _cast(key, dt), _cast(value, dt), _cast(attn_mask, dt)
            stack.enter_context(_no_autocast())
        if backend is None:
            params = Inputs.of(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
            backend = select_backend(params, capability)
        return _run(backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                    capability, sm_count, real, label)


def _run(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
         dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool, cc: tuple[int, int],
         sm_count: int, real: bool, label: Label) -> torch.Tensor:
    if backend == MATH:
        mask = None if attn_mask is None else _bool_to_additive(attn_mask, q.dtype)
        return _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    compute_lse = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    common = dict(dropout_p=float(dropout_p), is_causal=bool(is_causal), scale=scale, enable_gqa=bool(enable_gqa),
                  capability=cc, real=real, label=label, compute_lse=compute_lse)
    if backend == EFFICIENT:
        bias = None
        if attn_mask is not None:  # convert_boolean_attn_mask, then preprocess_mask
            bias = _check_bias(_bool_to_additive(attn_mask, q.dtype), q)
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            if bias.shape[-1] % 16:  # pad_bias<16>
                bias = torch.nn.functional.pad(bias, (0, 16 - bias.shape[-1] % 16))[..., :k.shape[2]]
            elif bias.stride(0) % 16 or bias.stride(1) % 16 or bias.stride(2) % 16:
                bias = bias.contiguous()
        res = _Fused.apply(_Efficient(**common), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias)
        return res.transpose(1, 2)
    if backend == FLASH:
        common["scale"] = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])  # og_scale
        return _on_padded_head(lambda q, k, v: _Fused.apply(
            _Flash(**common, sm_count=sm_count), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            None).transpose(1, 2), q, k, v)
    if backend == CUDNN:
        bias = None
        if attn_mask is not None:  # convert_boolean_attn_mask_cudnn
            bias = _bool_to_additive(attn_mask, q.dtype)
            if bias.dim() < 4:
                bias = bias.expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return _Fused.apply(_Cudnn(**common), q, k, v, bias)
    raise RuntimeError(f"unknown SDPA backend {backend!r}")


def _check_bias(bias: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The memory-efficient kernel's own check (``mem_eff_attention/kernel_forward.h``): nothing
    before it converts a float32 additive mask to half inputs' dtype, so on the GPU the call
    fails there; the same error, raised as torch raises it (cuDNN reads such a mask and math
    adds it in place: they run)."""
    if bias.dtype != q.dtype:
        got, want = (str(t.dtype).removeprefix("torch.") for t in (bias, q))
        raise as_torch_error(RuntimeError(
            f"invalid dtype for bias - should match query's dtype (CUDA's memory-efficient attention, which "
            f"the target GPU picks for these inputs, got a {got} attn_mask with {want} query, key and value: "
            f"cast the mask to the query's dtype)"))
    return bias


def _bind(args: tuple, kwargs: dict) -> dict[str, Any]:
    if len(args) > len(_NAMES):
        raise TypeError("too many arguments")
    bound = dict(_DEFAULTS)
    bound.update(zip(_NAMES, args))
    for name, value in kwargs.items():
        if name not in _NAMES:
            raise TypeError(f"unexpected argument {name!r}")
        bound[name] = value
    return bound


def _valid(b: dict[str, Any]) -> bool:
    """Inputs whose checks (``validate_sdpa_input``) or edge cases are left to PyTorch."""
    q, k, v, m = b["query"], b["key"], b["value"], b["attn_mask"]
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or (m is not None and not isinstance(m, torch.Tensor)):
        return False
    if q.is_nested or k.is_nested or v.is_nested or q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        return False
    low = _autocast_dtype()  # the dtypes after autocast's cast: rotary embeddings leave q, k float32, v half
    dq = _cast_dtype(q, low)
    if not (dq == _cast_dtype(k, low) == _cast_dtype(v, low)) or not q.is_floating_point():
        return False
    # validate_sdpa_input: a mask is bool, float32 or the query's dtype (a float32 one with half
    # inputs passes here and fails in the memory-efficient kernel: _check_bias)
    if m is not None and (_cast_dtype(m, low) not in (torch.bool, torch.float32, dq) or b["is_causal"]):
        return False
    return isinstance(b["dropout_p"], (int, float)) and isinstance(b["is_causal"], bool)


def tracer_label(tracer: Any) -> Label:
    """``label`` for the tracer: a kernel's allocation named by its CUDA op (and category)."""

    def label(t: torch.Tensor, op: str, category: str | None = None) -> None:
        rec = tracer.live.get(t.untyped_storage()._cdata)
        if rec is not None and rec.event is not None:
            rec.event.op = op
            if category is not None:
                rec.event.category = category

    return label


def tracer_handler(tracer: Any) -> Callable[[Any, tuple, dict], Any]:
    """The ``DeviceMode.special`` handler for ``F.scaled_dot_product_attention``: virtual-GPU
    inputs go to :func:`scaled_dot_product_attention` for the tracer's target GPU, anything
    else to PyTorch."""
    label = tracer_label(tracer)

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            b = _bind(args, kwargs)
        except TypeError:
            return func(*args, **kwargs)
        if not _valid(b) or not tracer.is_gpu(b["query"]):
            return func(*args, **kwargs)
        props = tracer.vc.props
        tracer.sdpa_calls += 1
        # Tensors the kernels make without tensor inputs (a causal mask, a scalar) are on the
        # GPU, as for any torch function called with GPU tensors (Tracer.factory_on_gpu).
        with tracer.call_scope(args=args):
            return scaled_dot_product_attention(
                b["query"], b["key"], b["value"], b["attn_mask"], float(b["dropout_p"]), b["is_causal"], b["scale"],
                bool(b["enable_gqa"]), capability=(props.major, props.minor), sm_count=props.multi_processor_count,
                real=not tracer.fake, label=label)

    return handle


def compiled_attention(capability: tuple[int, int]) -> Callable[..., torch.Tensor]:
    """``F.scaled_dot_product_attention`` for ``torch.compile`` on the virtual GPU: the fused
    aten op of the backend the target GPU picks, which AOTAutograd differentiates and Inductor
    runs as an extern kernel, as on a GPU. (Without a driver the C++ op's own choice,
    ``_fused_sdp_choice``, answers MATH, and Inductor would compile attention as bmm + softmax.)
    It is put in the graph whole (``allow_in_graph``): the choice reads flags Dynamo need not
    trace, and is made again, identically, when AOTAutograd traces the graph."""

    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
        aten = torch.ops.aten
        if torch.is_autocast_enabled("cuda"):  # autocast's cast, before the choice (as CUDA's wrapper)
            dt = torch.get_autocast_dtype("cuda")
            query, key, value, attn_mask = (_cast(t, dt) for t in (query, key, value, attn_mask))
        backend = select_backend(Inputs.of(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa), capability)
        if backend == MATH or not _valid(dict(query=query, key=key, value=value, attn_mask=attn_mask,
                                              dropout_p=dropout_p, is_causal=is_causal)):
            return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                             scale=scale, enable_gqa=enable_gqa)
        lse = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)):
            if backend == FLASH:
                sc = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
                return _on_padded_head(lambda q, k, v: aten._scaled_dot_product_flash_attention(
                    q, k, v, float(dropout_p), bool(is_causal), False, scale=sc)[0], query, key, value)
            key, value = _gqa_expand(key, value, query.shape[-3], enable_gqa)
            bias = None if attn_mask is None else _bool_to_additive(attn_mask, query.dtype)
            if backend == EFFICIENT:
                if bias is not None:
                    bias = _check_bias(bias, query).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
                return aten._scaled_dot_product_efficient_attention(query, key, value, bias, lse, float(dropout_p),
                                                                    bool(is_causal), scale=scale)[0]
            return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, lse, float(dropout_p),
                                                            bool(is_causal), False, scale=scale)[0]

    return torch._dynamo.allow_in_graph(attention)
