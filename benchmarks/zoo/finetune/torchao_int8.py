"""INT8 mixed-precision training with torchao: the Llama's linear layers' matmuls run in INT8
with dynamic row-wise scaling (``quantize_(model, int8_mixed_precision_training())``; weights
stay bf16), and torchao's own 8-bit AdamW (``torchao.optim.AdamW8bit``) for the states.

Pattern: torchao docs, "Quantized training" README
(https://github.com/pytorch/ao/tree/main/torchao/prototype/quantized_training) and "Low-bit
optimizers" (https://github.com/pytorch/ao/tree/main/torchao/optim): ``quantize_(model,
int8_mixed_precision_training())`` then an ordinary loop.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), batch 4 x 2048.
"""
import torch
from torchao import quantize_
from torchao.optim import AdamW8bit
from torchao.prototype.quantized_training import int8_mixed_precision_training
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
# every linear layer but the output head, as the README's examples do
quantize_(model.model, int8_mixed_precision_training())
optimizer = AdamW8bit(model.parameters(), lr=1e-4)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
