"""A fine-tuning run that ends by saving, as most notebooks do: transformers' ``Trainer`` for 2
steps, then ``trainer.save_model(out)`` and ``model.save_pretrained(out, safe_serialization=True)``
(safetensors) with the tokenizer, then a peft LoRA adapter saved the same way. Saving reads the
weights back to the host; with tied embeddings and sharded safetensors it is where a notebook's
last cell can still run out of memory.

Pattern: transformers docs, "Trainer" and "Share a model"
(https://huggingface.co/docs/transformers/trainer, https://huggingface.co/docs/transformers/model_sharing),
peft docs "Quicktour" (https://huggingface.co/docs/peft/quicktour): ``model.save_pretrained("output_dir")``.

Stands for GPT-2 medium (355M; its config, written in code: nothing can be downloaded), batch 8 x 1024.
"""
import os
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomText(Dataset):
    def __init__(self, n=64, block=1024, vocab=50257):
        self.ids = torch.randint(0, vocab, (n, block), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


out = tempfile.mkdtemp()
model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16))
args = TrainingArguments(output_dir=os.path.join(out, "run"), per_device_train_batch_size=8, learning_rate=5e-5,
                         bf16=True, max_steps=2, logging_steps=1, save_strategy="no", report_to="none")
trainer = Trainer(model=model, args=args, train_dataset=RandomText())
trainer.train()
trainer.save_model(os.path.join(out, "final"))
model.save_pretrained(os.path.join(out, "final-safetensors"), safe_serialization=True, max_shard_size="200MB")

# then a LoRA adapter on the fine-tuned model, trained a step and saved (adapter weights only)
peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["c_attn", "c_proj"],
                                              fan_in_fan_out=True, task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=2e-4)
batch = torch.randint(0, 50257, (8, 1024), device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = peft_model(input_ids=batch, labels=batch).loss
loss.backward()
optimizer.step()
peft_model.save_pretrained(os.path.join(out, "adapter"))
