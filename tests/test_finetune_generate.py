"""generate() in fake mode (issue #31, item 5): tokens are unknown values, and the loop runs
to max_new_tokens (no early stop token: the most a GPU allocates), whatever the eos id."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from xmem_engine.tracing import trace  # noqa: E402

GENERATE = """
import torch
from transformers import LlamaConfig, AutoModelForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512)
model = AutoModelForCausalLM.from_config(cfg).cuda().eval()
ids = torch.randint(3, 512, (4, 16), device="cuda")
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                         min_new_tokens=0, pad_token_id=EOS, eos_token_id=EOS, KW)
shape = tuple(out.shape)
"""


@pytest.mark.parametrize("eos", [0, 1, 2])
@pytest.mark.parametrize("kw", ["do_sample=False", "do_sample=True, top_k=50, top_p=0.9, temperature=0.7"])
def test_generation_runs_to_max_new_tokens_whatever_the_eos_id(eos, kw):
    """Guessed as ones, a sampled token is 1 and a greedy one argmax(ones) = 0: with eos 0 or 1
    generation stopped after one token. Unknown ids now match no stop token."""
    ns: dict = {}
    tr = trace(GENERATE.replace("EOS", str(eos)).replace("KW", kw), ns, mode="fake")
    assert tr.mode == "fake" and ns["shape"] == (4, 16 + 8)
    assert any(g["kind"] == "rule" and g["what"].startswith("isin") for g in tr.meta["guesses"])
