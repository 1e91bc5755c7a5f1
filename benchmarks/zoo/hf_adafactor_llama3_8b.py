"""Llama-3-8B's shape (config written in code) fine-tuned in bf16 with transformers'
Adafactor and gradient checkpointing, 3 steps, batch 1 x 128: the largest model of the zoo."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.optimization import Adafactor

config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
optimizer = Adafactor(model.parameters(), lr=1e-5, relative_step=False, scale_parameter=False, warmup_init=False)

for step in range(3):
    ids = torch.randint(0, config.vocab_size, (1, 128), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f}")
