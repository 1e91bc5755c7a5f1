"""Liger Kernel's Triton kernels patched into a Llama (``apply_liger_kernel_to_llama()``: RoPE,
RMSNorm, SwiGLU and the fused linear cross-entropy that never materialises the logits), then a
plain PyTorch training loop in bf16 with AdamW.

Pattern: Liger Kernel docs, "Getting Started", 2. "Apply Model-Specific Patching APIs"
(https://linkedin.github.io/Liger-Kernel/Getting-Started): call ``apply_liger_kernel_to_llama()``
before the model is instantiated.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded), batch 4 of
2048 tokens, where the logits Liger avoids (4 x 2048 x 32000 floats) are a large part of the peak.
"""
import torch
from liger_kernel.transformers import apply_liger_kernel_to_llama
from transformers import AutoModelForCausalLM, LlamaConfig

apply_liger_kernel_to_llama()

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda")
model.gradient_checkpointing_enable()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)

model.train()
for step in range(2):
    input_ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    outputs = model(input_ids=input_ids, labels=input_ids)
    outputs.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {outputs.loss.item():.3f}")
