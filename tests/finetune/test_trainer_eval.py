"""The Trainer's evaluation with ``compute_metrics``, the form of every Hugging Face
fine-tuning tutorial: its eval loop gathers the predictions on the GPU and hands them to
``compute_metrics`` as numpy arrays. The logits are too large to guess element by element;
they reach the metrics as zeros and the trace stays in fake mode (it had gone to real mode
for the whole script: 9 minutes instead of 9 seconds for a 2-layer model)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from xmem_engine.tracing import trace  # noqa: E402

TRAIN_AND_EVALUATE = """
import tempfile
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000))
rows = lambda n: [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 1000, (n, 64)).tolist()]
seen = []

def compute_metrics(p):
    seen.append(p.predictions.shape)
    preds = p.predictions.argmax(-1)
    return {"accuracy": float((preds[:, :-1] == p.label_ids[:, 1:]).mean())}

args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                         max_steps=2, eval_strategy="steps", eval_steps=1, report_to=[], save_strategy="no")
trainer = Trainer(model=model, args=args, train_dataset=rows(32), eval_dataset=rows(24), compute_metrics=compute_metrics)
trainer.train()
metrics = trainer.evaluate()
"""


def test_compute_metrics_gets_the_predictions_in_fake_mode():
    ns: dict = {}
    tr = trace(TRAIN_AND_EVALUATE, ns, mode="auto")
    assert tr.mode == "fake" and "fallback" not in tr.meta
    assert ns["seen"] == [(24, 64, 1000)] * 3 and "eval_accuracy" in ns["metrics"]  # after each step, and at the end
    zeros = {g["where"]: (g["count"], g["kind"], g["value"].split(":")[0]) for g in tr.meta["guesses"]
             if g["what"] == "Tensor.numpy() of a large tensor"}
    assert zeros == {"<cell>:20": (2, "rule", "zeros (24 x 64 x 1000, float32"),  # trainer.train()
                     "<cell>:21": (1, "rule", "zeros (24 x 64 x 1000, float32")}  # trainer.evaluate()
