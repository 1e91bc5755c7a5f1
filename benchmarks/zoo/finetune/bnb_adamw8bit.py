"""GPT-2 medium trained from scratch with bitsandbytes' 8-bit AdamW (blockwise-quantised optimizer
states: 2 bytes per parameter instead of 8), fp32 weights under bf16 autocast.

Pattern: bitsandbytes docs, "8-bit optimizers"
(https://huggingface.co/docs/bitsandbytes/optimizers): replace ``torch.optim.AdamW`` with
``bnb.optim.AdamW8bit(model.parameters(), lr=..., betas=(0.9, 0.995))``; the docs suggest
``bnb.nn.StableEmbedding`` for from-scratch NLP models, which GPT-2's code does not use, so
users mostly don't either.

Stands for GPT-2 medium (355M; its config, written in code: nothing can be downloaded), batch 8 x 1024.
"""
import bitsandbytes as bnb
import torch
from transformers import GPT2Config, GPT2LMHeadModel

config = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, vocab_size=50257)
model = GPT2LMHeadModel(config).cuda()
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=3e-4, betas=(0.9, 0.995), weight_decay=0.1)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
