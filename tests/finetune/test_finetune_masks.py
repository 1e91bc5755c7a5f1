"""An all-ones attention mask is dropped as on a GPU (transformers 5.x, tracing/shims/transformers_tracing.py).

transformers counts any FakeTensor as "traced" and then keeps a padding mask it would drop on the
GPU; on an H200 BERT's masked-LM step with ``attention_mask=ones`` measured what the step without
a mask does (benchmarks/data/gpu_groundtruth-nvidia-h200-2026-12-04.jsonl).
"""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

STEP = """
import torch
from transformers import BertConfig, BertForMaskedLM
model = BertForMaskedLM(BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=256, vocab_size=1000)).cuda()
ids = torch.randint(0, 1000, (4, 64), device="cuda")
MASK
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(input_ids=ids, ATTENTION labels=ids).loss
loss.backward()
"""


def _events(mask: str, attention: str) -> list[tuple[str, int, str]]:
    from xmem_engine.tracing import trace

    tr = trace(STEP.replace("MASK", mask).replace("ATTENTION", attention), {}, mode="fake",
               device={"name": "NVIDIA H200", "total_memory": 150_109_880_320, "major": 9, "minor": 0,
                       "multi_processor_count": 132})
    # the mask's own few hundred bytes (made, cast to bool) aside: what the model allocates
    return [(e.kind, e.bytes, e.op) for e in tr.events if e.bytes >= 4096]


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 4.x has no FakeTensor check")
def test_an_all_ones_mask_is_dropped_as_on_the_gpu():
    ones = _events("mask = torch.ones_like(ids)", "attention_mask=mask,")
    none = _events("mask = torch.ones_like(ids)", "")
    assert ones == none  # before: a 32 KiB float mask per layer, and another attention backend
    padded = _events("mask = torch.ones_like(ids); mask[:, 60:] = 0", "attention_mask=mask,")
    assert padded != none  # real padding keeps its mask
