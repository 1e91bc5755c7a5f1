"""Unsloth's QLoRA notebook under ``xmem estimate``, in a process of its own (``make test-unsloth``).

Unsloth patches transformers, peft and TRL when it is imported, so the script runs in a child
process, as a user runs ``xmem estimate``: ``FastLanguageModel.from_pretrained(load_in_4bit=True)``
from a local checkpoint, ``get_peft_model`` with Unsloth's gradient checkpointing, TRL's
``SFTTrainer`` with ``adamw_8bit``, two steps. What it checks: the run is estimated in fake mode
(its untrained-token check, which reads weights, skipped and said; its Triton kernels recorded),
and the GPU holds the 4-bit weights at the sizes bitsandbytes gives them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.find_spec("unsloth")
if _spec is None or _spec.origin is None:  # not installed (a namespace package is not Unsloth)
    pytest.skip("unsloth is not installed (make test-unsloth sets up .venv-unsloth)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

HIDDEN, INTER, LAYERS, VOCAB = 512, 1536, 2, 32000

SCRIPT = f'''
from unsloth import FastLanguageModel

import random, sys, tempfile
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

words = "the model learns to follow instructions about memory and kernels".split()
rng = random.Random(0)
dataset = Dataset.from_dict({{"text": [" ".join(rng.choice(words) for _ in range(rng.randint(100, 300)))
                                      for _ in range(16)]}})
vocab = {{w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *words])}}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                    eos_token="</s>", pad_token="<pad>")
config = LlamaConfig(hidden_size={HIDDEN}, intermediate_size={INTER}, num_hidden_layers={LAYERS},
                     num_attention_heads=8, num_key_value_heads=4, vocab_size={VOCAB}, tie_word_embeddings=True,
                     bos_token_id=1, eos_token_id=2, pad_token_id=3)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)

model, tokenizer = FastLanguageModel.from_pretrained(model_name=checkpoint, max_seq_length=512, dtype=None,
                                                     load_in_4bit=True)
model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, bias="none",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    use_gradient_checkpointing="unsloth", random_state=3407, max_seq_length=512)
trainer = SFTTrainer(model=model, train_dataset=dataset, processing_class=tokenizer,
    args=SFTConfig(dataset_text_field="text", max_length=512, per_device_train_batch_size=2,
                   gradient_accumulation_steps=2, max_steps=2, learning_rate=2e-4, logging_steps=1,
                   optim="adamw_8bit", output_dir=tempfile.mkdtemp(), report_to="none", seed=3407))
trainer.train()
'''


def estimate_in_child(work: Path, script: str, gpu: str) -> dict:
    """``xmem estimate --json`` of ``script`` in a child process run in ``work`` (Unsloth writes
    its compiled trainers into the working folder); its JSON answer."""
    (work / "script.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "xmem_engine", "estimate", "--gpu", gpu, "--json", "script.py"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout[run.stdout.index("{"):])


@pytest.fixture(scope="module")
def estimate(tmp_path_factory) -> dict:
    return estimate_in_child(tmp_path_factory.mktemp("unsloth"), SCRIPT, "T4")


def test_unsloth_qlora_is_estimated_in_fake_mode(estimate):
    notes = "\n".join(estimate["notes"])
    assert estimate["mode"] == "fake" and estimate["fits"] and estimate["steps"] == 2
    assert "fix_untrained_tokens (unsloth_zoo) was skipped" in notes
    for kernel in ("_nf4_dequant_kernel", "_rms_layernorm_forward", "_rope_embedding_QK", "_fg_kernel"):
        assert f"Triton kernel {kernel} " in notes, kernel


def test_unsloth_keeps_the_weights_in_4_bit_on_the_gpu(estimate):
    """The parameters at the peak are bitsandbytes' own NF4 tensors with double quantization
    (Unsloth's default: the packed weight, its uint8 absmax, the nested float32 absmax, code books
    and offset) for every projection, the 16-bit embedding (tied to the LM head) and norms, and the
    LoRA adapters in float32: each rounded up to the 512 bytes the allocator gives the smallest."""
    import torch
    from bitsandbytes.functional import quantize_4bit

    def allocated(t: torch.Tensor) -> int:
        return -(-t.numel() * t.element_size() // 512) * 512

    projections = [(HIDDEN, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN, HIDDEN),
                   (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]  # q k v o gate up down (out, in)
    four_bit = 0
    for shape in projections * LAYERS:
        packed, state = quantize_4bit(torch.empty(shape, dtype=torch.bfloat16), quant_type="nf4",
                                      compress_statistics=True)
        four_bit += sum(allocated(t) for t in (packed, state.absmax, state.code, state.offset,
                                              state.state2.absmax, state.state2.code))
    sixteen_bit = allocated(torch.empty(VOCAB, HIDDEN, dtype=torch.bfloat16)) \
        + (2 * LAYERS + 1) * allocated(torch.empty(HIDDEN, dtype=torch.bfloat16))
    lora = sum(allocated(torch.empty(16, i)) + allocated(torch.empty(o, 16)) for o, i in projections) * LAYERS
    assert estimate["breakdown"]["parameter"] == four_bit + sixteen_bit + lora
