"""A mixture-of-experts language model trained on the virtual GPU: transformers 5 runs its
experts as grouped matmuls (``integrations/moe.py``), counting each expert's tokens with
``torch.histc`` of int32 ids, as on CUDA; the CPU kernel refuses integers, and the first expert
layer had stopped the script (``kernels/cuda_dtypes.py``)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3MoeConfig"):
    pytest.skip("this transformers has no Qwen3-MoE", allow_module_level=True)

from xmem_engine.tracing import trace  # noqa: E402

MOE = """
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
torch.manual_seed(0)
cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                     num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, vocab_size=256, output_router_logits=True)
model = AutoModelForCausalLM.from_config(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 256, (4, 32), device="cuda")
out = model(input_ids=ids, labels=ids)
out.loss.backward()
opt.step()
"""


def _stream(tr):
    return [(e.kind, e.bytes, e.op) for e in tr.events if e.kind in ("alloc", "free")]


def test_a_moe_step_traces_and_fake_and_real_events_agree():
    fake, real = trace(MOE, {}, mode="fake"), trace(MOE, {}, mode="real")
    assert fake.mode == "fake" and real.mode == "real"
    counts = [e for e in fake.events if e.kind == "alloc" and e.op == "aten.histc.default"]
    assert len(counts) >= 2 and all(e.bytes == 8 * 4 for e in counts)  # one int32 count per expert, per layer
    assert _stream(fake) == _stream(real)
