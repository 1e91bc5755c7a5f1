"""float8 training with torchao: every eligible ``nn.Linear`` of a Llama swapped for torchao's
``Float8Linear`` (``convert_to_float8_training``, dynamic tensorwise scaling, matmuls in
``torch._scaled_mm``), then ``torch.compile``; bf16 weights, AdamW.

Pattern: torchao docs, "float8 training" README
(https://github.com/pytorch/ao/tree/main/torchao/float8): ``convert_to_float8_training(m,
module_filter_fn=...)`` skipping layers whose dimensions are not divisible by 16, then
``torch.compile(m)``. Written for an H100 (float8 needs compute capability 8.9 or above).

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), batch 4 x 2048.
"""
import torch
import torch.nn as nn
from torchao.float8 import convert_to_float8_training
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)


def module_filter_fn(mod: nn.Module, fqn: str) -> bool:
    # the output head stays in bf16; float8 matmuls need both dimensions divisible by 16
    if fqn == "lm_head":
        return False
    return isinstance(mod, nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0


convert_to_float8_training(model, module_filter_fn=module_filter_fn)
model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
