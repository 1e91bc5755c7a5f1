"""Gemma 3 under Unsloth on a GPU with bf16 (``FastModel``, 4-bit, then ``generate()``): there
Unsloth gives it flex attention, and generate() passes the masks by layer type as flex
attention's ``BlockMask``s. The decode steps made from their pattern
(``tracing/shims/decode_replay.py``) must give the events every step run for real gives."""

from __future__ import annotations

import pytest

# skips this module too where Unsloth is not installed
from tests.unsloth_notebook.test_unsloth_generate import _trace_in_child

SCRIPT = '''
from unsloth import FastModel

import tempfile
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

words = "the model learns to follow instructions about memory and kernels".split()
vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *words])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")
config = Gemma3TextConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=1, head_dim=64, vocab_size=4096, sliding_window=512,
                          layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
                          bos_token_id=1, eos_token_id=2, pad_token_id=3)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
model, tokenizer = FastModel.from_pretrained(model_name=checkpoint, max_seq_length=512, load_in_4bit=True)
FastModel.for_inference(model)
inputs = tokenizer(["the model learns to follow"], return_tensors="pt").to("cuda")
out = model.generate(**inputs, max_new_tokens=80, use_cache=True)
assert out.shape == (1, 5 + 80), out.shape
'''


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("unsloth_gemma3_generate")
    # one hash seed: generate() makes the masks of a set of layer types, in the set's order
    return {flag: _trace_in_child(base / flag, flag, SCRIPT, PYTHONHASHSEED="0") for flag in ("1", "0")}


def test_gemma3_decode_steps_with_block_masks_are_made_and_are_the_real_ones(traces):
    made, real = traces["1"], traces["0"]
    note = made["notes"][0]
    assert note.startswith("generate(): ") and "did not match" not in note
    assert int(note.split()[1]) >= 40  # of 80 calls: the prefill, 18 to fit, the checks
    # the path under test: create_block_mask pads each mask to whole blocks of 128 x 128
    assert any(r[5] == "aten.constant_pad_nd.default" and r[8] == "bool" and r[9].endswith("128, 128)")
               for r in real["rows"])
    first = next((i for i, (a, b) in enumerate(zip(made["rows"], real["rows"])) if a != b), None)
    assert first is None and len(made["rows"]) == len(real["rows"]), \
        (first, made["rows"][first] if first is not None else None, real["rows"][first] if first is not None else None)
    for key in ("gemm_into", "by_sm", "sdpa_calls", "peak"):
        assert made[key] == real[key], key
