"""``attn_implementation="flash_attention_2"`` and ``flash_attn`` calls on the virtual GPU
(``tracing/shims/flash_attention.py``): the package is CUDA-only and not installed here; its
stand-in allocates what FlashAttention-2's kernels allocate, by the formulas of its
``mha_fwd`` / ``mha_bwd`` / ``mha_varlen_*``, and in real mode gives the attention's values."""

from __future__ import annotations

import sys

import pytest

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("the FlashAttention-2 stand-in is for transformers 5 (4.x keeps its ImportError)",
                allow_module_level=True)

from xmem_engine.tracing import trace  # noqa: E402

B, S, H, HK, D, LAYERS = 2, 200, 8, 4, 64, 2
MODEL = f"""
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
cfg = LlamaConfig(hidden_size={H * D}, intermediate_size=512, num_hidden_layers={LAYERS}, num_attention_heads={H},
                  num_key_value_heads={HK}, vocab_size=300)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation=ATTN).to(torch.bfloat16).cuda()
ids = torch.randint(0, 300, ({B}, {S}), device="cuda")
mask = torch.ones_like(ids)
PAD
labels = ids.masked_fill(mask == 0, -100)
out = model(input_ids=ids, attention_mask=mask, labels=labels)
out.loss.backward()
"""


def _allocs(tr, op: str) -> list[tuple]:
    return [(tuple(e.shape), e.dtype) for e in tr.events if e.kind == "alloc" and e.op == op]


def test_flash_attention_2_loads_and_allocates_the_kernels_buffers():
    """Unpadded batch: ``flash_attn_func`` per layer. Forward: the output like q (B, S, H, D),
    softmax_lse (B, H, S) float32, the rng state (2 int64). Backward: dq/dk/dv, softmax_d
    (B, H, round128(S)) and dq_accum (B, round128(S), H, round32(D)) float32, and for GQA the
    keys' and values' gradients over all query heads (B, S, H, D), summed after."""
    tr = trace(MODEL.replace("ATTN", '"flash_attention_2"').replace("PAD", ""), {}, mode="fake")
    fwd = _allocs(tr, "aten._flash_attention_forward")
    assert fwd == [((B, S, H, D), "bfloat16"), ((B, H, S), "float32")] * LAYERS
    assert _allocs(tr, "flash_attn.fwd") == [((2,), "int64")] * LAYERS
    bwd = _allocs(tr, "aten._flash_attention_backward")
    s128 = -(-S // 128) * 128
    assert bwd == [((B, S, H, D), "bfloat16"), ((B, S, HK, D), "bfloat16"), ((B, S, HK, D), "bfloat16"),
                   ((B, H, s128), "float32"), ((B, s128, H, 64), "float32"),
                   ((B, S, H, D), "bfloat16"), ((B, S, H, D), "bfloat16")] * LAYERS
    assert any("FlashAttention-2" in n for n in tr.meta["notes"])
    assert "flash_attn" not in sys.modules  # nothing left behind


PADDED = "mask[0, -37:] = 0"  # right padding: no query row of SDPA's mask is all masked


def test_a_padded_batch_runs_unpadded_through_the_varlen_kernel():
    """With padding, transformers unpads to the tokens that count (here B x S - 37) and calls
    ``flash_attn_varlen_func``: softmax_lse (H, total) float32; backward softmax_d
    (B, H, round128(max_seqlen)) and dq_accum (H, total + 128 x B, round32(D)) float32."""
    tr = trace(MODEL.replace("ATTN", '"flash_attention_2"').replace("PAD", PADDED), {}, mode="fake")
    total = B * S - 37
    fwd = _allocs(tr, "flash_attn.varlen_fwd")
    assert fwd == [((total, H, D), "bfloat16"), ((H, total), "float32"), ((2,), "int64")] * LAYERS
    bwd = _allocs(tr, "flash_attn.varlen_bwd")
    assert bwd == [((total, H, D), "bfloat16"), ((total, HK, D), "bfloat16"), ((total, HK, D), "bfloat16"),
                   ((B, H, 256), "float32"), ((H, total + 128 * B, 64), "float32"),
                   ((total, H, D), "bfloat16"), ((total, H, D), "bfloat16")] * LAYERS


@pytest.mark.parametrize("pad", ["", PADDED])
def test_real_mode_values_are_the_attentions(pad):
    """Real mode: the stand-in computes attention (bottom-right causal, per sequence when
    unpadded); the loss is SDPA's within bf16 rounding, and so are the gradients."""
    results = {}
    for attn in ("flash_attention_2", "sdpa"):
        ns: dict = {}
        src = MODEL.replace("ATTN", f'"{attn}"').replace("PAD", pad) + (
            "loss = out.loss.item()\ngrad = model.model.layers[0].self_attn.q_proj.weight.grad.float().norm().item()\n")
        trace(src, ns, mode="real")
        results[attn] = (ns["loss"], ns["grad"])
    (fa_loss, fa_grad), (sd_loss, sd_grad) = results["flash_attention_2"], results["sdpa"]
    assert abs(fa_loss - sd_loss) < 1e-2 * abs(sd_loss)
    assert abs(fa_grad - sd_grad) < 5e-2 * abs(sd_grad)


def test_flash_attn_called_directly_and_a_float32_input_refused_as_the_package_does():
    src = """
import torch
from flash_attn import flash_attn_func
q = torch.randn(2, 128, 4, 48, device="cuda", dtype=torch.float16, requires_grad=True)
out = flash_attn_func(q, q, q, causal=True)
shape = tuple(out.shape)
out.sum().backward()
try:
    flash_attn_func(q.float(), q.float(), q.float())
    refused = False
except RuntimeError as e:
    refused = "only support fp16 and bf16" in str(e)
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["shape"] == (2, 128, 4, 48) and ns["refused"]
    # the head dim 48 is a multiple of 8: no padding; dq_accum rounds it to 64
    assert ((2, 128, 4, 64), "float32") in _allocs(tr, "aten._flash_attention_backward")


def test_a_compiled_model_keeps_flash_attention_in_its_graph():
    """Under ``torch.compile`` the package's custom ops (2.7+) stay in the graph; the stand-in
    puts PyTorch's copy of the kernel there (``aten._flash_attention_forward``) instead of
    breaking the graph at every attention (it made 13 graphs of this model, with 4 breaks)."""
    from xmem_engine.tracing.compiler.torch_compile import compile_unavailable

    if compile_unavailable() is not None:
        pytest.skip(compile_unavailable())
    # (no mask: transformers reads a mask's values to see whether it pads, a graph break on a GPU too)
    src = MODEL.replace("ATTN", '"flash_attention_2"').replace("PAD", "").replace(
        "out = model(input_ids=ids, attention_mask=mask, ", "out = torch.compile(model)(input_ids=ids, ")
    tr = trace(src, {}, mode="fake")
    info = tr.meta["compile"]
    assert info["graphs"] == 1 and info["backward_graphs"] == 1 and not info["graph_breaks"], tr.meta["notes"]
    assert "_flash_attention_forward" in open(info["wrappers"][0]).read()
    assert any("FlashAttention-2" in n for n in tr.meta["notes"])
