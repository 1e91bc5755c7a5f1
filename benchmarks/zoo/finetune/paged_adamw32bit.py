"""A 1.1B Llama fine-tuned in bf16 with bitsandbytes' paged 32-bit AdamW: the optimizer states
live in CUDA unified (managed) memory that the driver pages out to host RAM under pressure, so a
step can run past the GPU's memory without an out-of-memory error.

Pattern: bitsandbytes docs, "Paged optimizers"
(https://huggingface.co/docs/bitsandbytes/optimizers#paged-optimizers):
``bnb.optim.PagedAdamW32bit(model.parameters(), lr=...)`` in place of ``torch.optim.AdamW``.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), batch 4 x 1024
with gradient checkpointing.
"""
import bitsandbytes as bnb
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
optimizer = bnb.optim.PagedAdamW32bit(model.parameters(), lr=2e-5, weight_decay=0.0)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (4, 1024), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
