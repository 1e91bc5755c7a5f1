"""The Trainer finding its own batch size: ``TrainingArguments(auto_find_batch_size=True)`` starts
at ``per_device_train_batch_size`` and, on each CUDA out-of-memory error, tries again at 90 % of it
(accelerate's ``find_executable_batch_size``). Full fine-tuning of a 1.1B Llama in bf16 with
AdamW, sequences of 2048 tokens, starting at 64.

Pattern: transformers docs, "Methods and tools for efficient training on a single GPU"
(https://huggingface.co/docs/transformers/perf_train_gpu_one): ``auto_find_batch_size=True``.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded).
"""
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
rows = torch.randint(0, config.vocab_size, (512, 2048), generator=torch.Generator().manual_seed(0)).tolist()
dataset = Dataset.from_dict({"input_ids": rows, "labels": rows})

args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=64, auto_find_batch_size=True,
                         max_steps=2, bf16=True, optim="adamw_torch", learning_rate=2e-5, report_to=[],
                         save_strategy="no", logging_steps=1)
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
print("batch size found:", trainer._train_batch_size)
