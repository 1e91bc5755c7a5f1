"""Unsloth's compiled transformer blocks (its conversational notebook's setup: padded batches
through ``DataCollatorForSeq2Seq``, not packed) under ``xmem estimate``, in a process of its own.

Unsloth compiles each decoder layer as one region, with its 4-bit weights, fused-LoRA
``autograd.Function``s and Triton kernels inside. Two things had made that unlike a GPU run:
Dynamo took xmem's fake ``Params4bit`` for a plain object (a graph break at every ``weight.device``
and Triton launch: ``compiler/fake_parameters.py``), and, once it did not, the compile-time
autograd engine gave the fused-LoRA Functions' gradients to the wrong edges (their SymInt
arguments: ``compiler/python_autograd.py``), so the LoRA weights got no gradient and the
8-bit optimizer no state."""

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
from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, LlamaConfig, PreTrainedTokenizerFast
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
    data_collator=DataCollatorForSeq2Seq(tokenizer=tokenizer),
    args=SFTConfig(dataset_text_field="text", max_length=512, per_device_train_batch_size=2, packing=False,
                   gradient_accumulation_steps=2, max_steps=2, learning_rate=2e-4, logging_steps=1,
                   optim="adamw_8bit", output_dir=tempfile.mkdtemp(), report_to="none", seed=3407))
trainer.train()
'''


@pytest.fixture(scope="module")
def estimate(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("unsloth_blocks")  # Unsloth writes its compiled trainers into the working folder
    (work / "blocks.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "xmem_engine", "estimate", "--gpu", "A100-80GB", "--json", "blocks.py"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout[run.stdout.index("{"):])


def test_unsloths_blocks_compile_without_breaks(estimate):
    notes = "\n".join(estimate["notes"])
    assert "compiled for the target GPU by Inductor" in notes, notes
    assert "graph break" not in notes, notes


def test_the_lora_weights_get_their_8bit_optimizer_state(estimate):
    """The peak is in the second step, after the first optimizer step: the 8-bit AdamW holds a
    state for every LoRA weight, which it makes only for weights that got a gradient (there had
    been none). bitsandbytes' rules: two uint8 states and one float32 absmax per 256 elements
    each (every LoRA weight here has 4,096 elements or more), and two 256-entry float32 code
    books, each allocation rounded up to 512 bytes."""

    def allocated(nbytes: int) -> int:
        return -(-nbytes // 512) * 512

    projections = [(HIDDEN, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN // 2, HIDDEN), (HIDDEN, HIDDEN),
                   (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]  # q k v o gate up down (out, in)
    lora = [16 * i for o, i in projections] + [o * 16 for o, i in projections]
    assert min(lora) >= 4096
    states = LAYERS * sum(2 * allocated(n) + 2 * allocated(-(-n // 256) * 4) for n in lora) + 2 * allocated(256 * 4)
    assert estimate["breakdown"].get("optimizer_state") == states, estimate["breakdown"]
