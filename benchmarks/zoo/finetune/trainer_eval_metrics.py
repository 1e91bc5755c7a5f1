"""Causal-LM fine-tuning with the ``Trainer``, evaluated every few steps with token accuracy as
``compute_metrics``: the eval loop gathers each batch's logits on the GPU, hands them to
``preprocess_logits_for_metrics`` (argmax, so the logits need not all be kept), and gives the
predictions to ``compute_metrics`` as numpy arrays. bf16, AdamW, batch 8 x 512.

Pattern: transformers' example ``examples/pytorch/language-modeling/run_clm.py``
(https://github.com/huggingface/transformers/tree/main/examples/pytorch/language-modeling):
``preprocess_logits_for_metrics`` returning ``logits.argmax(dim=-1)`` and ``compute_metrics``
comparing ``preds[:, :-1]`` with ``labels[:, 1:]``, ``eval_strategy="steps"``.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), 512 eval rows (the predictions, 2 MiB, too large to guess element by element, reach the metrics as zeros).
"""
import tempfile

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(config)
generator = torch.Generator().manual_seed(0)


def rows(n: int) -> list[dict]:
    ids = torch.randint(3, config.vocab_size, (n, 512), generator=generator).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


def preprocess_logits_for_metrics(logits, labels):
    return logits.argmax(dim=-1)


def compute_metrics(eval_preds):
    preds, labels = eval_preds
    labels, preds = labels[:, 1:].reshape(-1), preds[:, :-1].reshape(-1)
    mask = labels != -100
    return {"accuracy": float((preds[mask] == labels[mask]).mean())}


args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, per_device_eval_batch_size=16,
                         max_steps=4, eval_strategy="steps", eval_steps=2, bf16=True, learning_rate=2e-5,
                         logging_steps=1, save_strategy="no", report_to=[])
trainer = Trainer(model=model, args=args, train_dataset=rows(64), eval_dataset=rows(512),
                  compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
trainer.train()
print(trainer.evaluate())
