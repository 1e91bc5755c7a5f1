"""FlashAttention-2 (the ``flash_attn`` package) on the virtual GPU, while the code is traced.

Fine-tuning scripts ask for it by name (``attn_implementation="flash_attention_2"``, or
``from flash_attn import flash_attn_func``). The package is CUDA-only: it does not install on a
machine without ``nvcc`` and would not run without a GPU, so such a script stopped at load
(transformers: "the package for FlashAttention2 doesn't seem to be installed"). For the trace a
stand-in is importable as ``flash_attn`` (2.8.3, with its distribution's metadata, which
transformers checks): ``flash_attn_func`` and ``flash_attn_varlen_func`` allocate what the
package's ``mha_fwd`` / ``mha_varlen_fwd`` and their backwards allocate on the target GPU
(``kernels/sdpa.py``: :func:`~xmem_engine.tracing.kernels.sdpa.flash_attn`), and
``flash_attn.bert_padding`` unpads and pads as the package's does (gather and zeros +
index-put). ``flash_attn_with_kvcache`` (paged caches) is not modelled and says so. A real
``flash_attn`` already imported is set aside for the trace and put back after, as are
transformers' cached answers about it; a note says the package was stood in for.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator

import torch

from xmem_engine.tracing.kernels import sdpa

VERSION = "2.8.3"
NOTE = ("FlashAttention-2: flash_attn is not installed here (a CUDA-only package); a stand-in ran in its place, "
        "allocating what its kernels allocate on the GPU (flash_attn_func, flash_attn_varlen_func and their backward; "
        "in a compiled graph, PyTorch's copy of its kernel, as an extern kernel, its backward's workspaces not counted)")
#: transformers' cached answers that depend on flash_attn being importable
_CACHED = ("_package_distribution_mapping", "is_flash_attn_2_available", "is_flash_attn_greater_or_equal",
           "is_flash_attn_greater_or_equal_2_10", "is_torch_cuda_available")
_LAZY = ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn", "_unpad_fn",
         "_process_flash_kwargs_fn", "_process_with_kvcache_kwargs_fn")


class _IndexFirstAxis(torch.autograd.Function):
    """``bert_padding.IndexFirstAxis``: a gather of rows; its backward scatters into zeros."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.first_axis_dim, other = input.shape[0], input.shape[1:]
        flat = input.reshape(input.shape[0], -1)
        return torch.gather(flat, 0, indices.unsqueeze(1).expand(-1, flat.shape[1])).reshape(-1, *other)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (indices,) = ctx.saved_tensors
        other = grad.shape[1:]
        flat = grad.reshape(grad.shape[0], -1)
        out = torch.zeros([ctx.first_axis_dim, flat.shape[1]], device=grad.device, dtype=grad.dtype)
        out.scatter_(0, indices.unsqueeze(1).expand(-1, flat.shape[1]), flat)
        return out.reshape(ctx.first_axis_dim, *other), None


class _IndexPutFirstAxis(torch.autograd.Function):
    """``bert_padding.IndexPutFirstAxis``: rows put into zeros; its backward gathers them."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
        ctx.save_for_backward(indices)
        out = torch.zeros(first_axis_dim, *values.shape[1:], device=values.device, dtype=values.dtype)
        out[indices] = values
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (indices,) = ctx.saved_tensors
        return grad[indices], None, None


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return _IndexFirstAxis.apply(input, indices)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """``bert_padding.unpad_input`` (2.7+: five results)."""
    masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(masks.flatten(), as_tuple=False).flatten()
    max_seqlen = seqlens.max().item()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    out = _IndexPutFirstAxis.apply(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *out.shape[1:])


def _package(tracer: Any) -> dict[str, types.ModuleType]:
    """The stand-in ``flash_attn`` and ``flash_attn.bert_padding`` for this trace."""
    props = tracer.vc.props
    label = sdpa.tracer_label(tracer)

    @torch._dynamo.assume_constant_result  # run for real while Dynamo captures the call
    def noted() -> bool:
        if NOTE not in tracer.notes:
            tracer.notes.append(NOTE)
        return True

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float | None,
            causal: bool, deterministic: bool, return_attn_probs: bool, varlen: tuple | None = None) -> Any:
        if return_attn_probs:
            raise NotImplementedError("flash_attn with return_attn_probs=True (a testing option) is not modelled")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")  # as the package says
        noted()
        with tracer.call_scope(args=(q, k, v)):
            return sdpa.flash_attn(q, k, v, dropout_p, softmax_scale, causal, deterministic,
                                   capability=(props.major, props.minor), sm_count=props.multi_processor_count,
                                   real=not tracer.fake, label=label, varlen=varlen)

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        if torch.compiler.is_compiling():  # one op in the graph, as the package's custom op
            noted()
            return sdpa.compiled_flash_attn(q, k, v, dropout_p, softmax_scale, causal)
        return run(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, block_table=None):
        if block_table is not None:
            raise NotImplementedError("flash_attn_varlen_func with a block_table (a paged KV cache) is not modelled")
        if torch.compiler.is_compiling():
            noted()
            return sdpa.compiled_flash_attn(q, k, v, dropout_p, softmax_scale, causal,
                                            varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
        return run(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs,
                   varlen=(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q)))

    def flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("flash_attn_with_kvcache (decoding into a paged KV cache) is not modelled by xmem")

    root = types.ModuleType("flash_attn", "FlashAttention-2, stood in for by xmem while tracing")
    padding = types.ModuleType("flash_attn.bert_padding")
    for name, fn in (("index_first_axis", index_first_axis), ("unpad_input", unpad_input), ("pad_input", pad_input)):
        setattr(padding, name, fn)
    for name, fn in (("flash_attn_func", flash_attn_func), ("flash_attn_varlen_func", flash_attn_varlen_func),
                     ("flash_attn_with_kvcache", flash_attn_with_kvcache)):
        setattr(root, name, fn)
    root.__version__, root.bert_padding = VERSION, padding
    root.__path__ = []  # a package: ``import flash_attn.bert_padding`` finds the submodule in sys.modules
    modules = {"flash_attn": root, "flash_attn.bert_padding": padding}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=hasattr(module, "__path__"))
    return modules


def _clear_transformers_caches() -> None:
    mod = sys.modules.get("transformers.utils.import_utils")
    for name in _CACHED if mod is not None else ():
        fn = getattr(mod, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _older_transformers() -> bool:
    """transformers before 5 takes another FlashAttention-2 path (its own mask handling; it
    imports the package's rotary kernel too), which the stand-in is not checked against: left as
    it was there."""
    import importlib.metadata

    try:
        return int(importlib.metadata.version("transformers").split(".")[0]) < 5
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


@contextlib.contextmanager
def flash_attn_on_gpu(tracer: Any) -> Iterator[None]:
    """``flash_attn`` importable for the block as the stand-in; everything as it was after."""
    if _older_transformers():
        yield
        return
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    lazy = sys.modules.get("transformers.modeling_flash_attention_utils")
    lazy_values = {n: getattr(lazy, n) for n in _LAZY if hasattr(lazy, n)} if lazy is not None else {}
    with tempfile.TemporaryDirectory(prefix="xmem-flash-attn-") as where:
        info = Path(where) / f"flash_attn-{VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {VERSION}\n")
        (info / "top_level.txt").write_text("flash_attn\n")
        for n in saved:
            del sys.modules[n]
        sys.modules.update(_package(tracer))
        sys.path.insert(0, where)
        _clear_transformers_caches()
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(where)
            for n in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
                del sys.modules[n]
            sys.modules.update(saved)
            _clear_transformers_caches()
            lazy = sys.modules.get("transformers.modeling_flash_attention_utils")
            for n in _LAZY if lazy is not None else ():
                if hasattr(lazy, n):
                    setattr(lazy, n, lazy_values.get(n))
