"""A 1.1B Llama (TinyLlama's shape) trained in pure bf16 with AdamW and SDPA attention."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                     attn_implementation="sdpa")
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.95))

for step in range(2):
    batch = torch.randint(0, config.vocab_size, (2, 1024), device="cuda")
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
