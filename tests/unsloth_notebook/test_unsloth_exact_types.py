"""Unsloth's exact-type tests in fake mode (``shims/unsloth_checks.py``), in a process of its own.

FastModel (Gemma 3 and the other non-Llama models) makes the embedding's output require gradients
for gradient checkpointing with a forward hook that tests ``type(output) is torch.Tensor`` and
raises for anything else: a fake tensor is a ``FakeTensor``, so every such script stopped with
"Neither loss, logits, nor last_hidden_state are available for grad post hook". The hook is
registered here as FastModel registers it (``requires_grad_for_gradient_checkpointing``), on a
model shaped as it expects (a backbone with ``get_input_embeddings`` looping over its layers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# skips this module too where Unsloth is not installed
from tests.unsloth_notebook.test_unsloth_qlora import ROOT

SCRIPT = '''
import unsloth  # unsloth_zoo asks for it first
import torch
from unsloth_zoo.peft_utils import requires_grad_for_gradient_checkpointing

class Backbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(100, 32)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 32)])
    def get_input_embeddings(self):
        return self.embed_tokens
    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return x

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Backbone()
    def forward(self, ids):
        return self.model(ids)

model = Model().cuda()
model.model.embed_tokens.weight.requires_grad_(False)
requires_grad_for_gradient_checkpointing(model)
out = model.model.embed_tokens(torch.zeros(2, 5, dtype=torch.long, device="cuda"))
requires_grad = out.requires_grad
'''

_CHILD = """
import json, sys
import unsloth_zoo.peft_utils as peft_utils
from xmem_engine.tracing import trace
ns = {}
tr = trace(sys.stdin.read(), ns, mode="fake")
print(json.dumps({"mode": tr.mode, "requires_grad": ns["requires_grad"], "left": "type" in vars(peft_utils)}))
"""


def test_the_embedding_hook_sees_a_tensor_in_fake_mode():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", "import unsloth\n" + _CHILD], input=SCRIPT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # as on a GPU: the hook made the frozen embedding's output require gradients
    assert out == {"mode": "fake", "requires_grad": True, "left": False}  # and the module is as it was after


RESPONSES_ONLY = """
import types
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from unsloth.chat_templates import train_on_responses_only

words = "the model learns to follow instructions".split()
vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *words])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                    eos_token="</s>", pad_token="<pad>")
ids = tokenizer(["the model learns to follow instructions the model learns to"])["input_ids"]
trainer = types.SimpleNamespace(train_dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(ids[0])]}),
                                eval_dataset=None, tokenizer=tokenizer, processing_class=tokenizer, data_collator=None,
                                args=types.SimpleNamespace(packing=False))
trainer = train_on_responses_only(trainer, instruction_part="the model", response_part="learns to")
labels = trainer.train_dataset["labels"][0]
"""

_RESPONSES_CHILD = """
import json, sys
from xmem_engine.tracing import trace
ns = {}
tr = trace(sys.stdin.read(), ns, mode="fake")
print(json.dumps({"mode": tr.mode, "labels": ns["labels"]}))
"""


def test_train_on_responses_only_runs_in_fake_mode():
    """The conversational notebooks' ``train_on_responses_only`` asks ``isinstance(cls, type)`` in
    one of those modules: a ``type`` that was a plain function stopped it ("isinstance() arg 2
    must be a type"). The labels are masked as without the tracer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", "import unsloth\n" + _RESPONSES_CHILD], input=RESPONSES_ONLY, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"mode": "fake", "labels": [-100, -100, -100, -100, 8, 9, -100, -100, -100, -100]}
