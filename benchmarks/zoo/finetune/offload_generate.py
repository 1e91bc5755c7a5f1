"""A model larger than the GPU share it may take, generating: ``from_pretrained(...,
device_map="auto", max_memory=...)`` keeps what fits in 10 GiB of the GPU and offloads the
other layers to the CPU, whose hooks bring each one's weights to the GPU for its forward; then
batched ``generate()``. fp16.

Pattern: accelerate docs, "Big Model Inference"
(https://huggingface.co/docs/accelerate/usage_guides/big_modeling): ``device_map="auto"`` and
``max_memory={0: "10GiB", "cpu": "64GiB"}``, passed through transformers' ``from_pretrained``.

Stands for Llama-3-8B (its config, written in code: nothing can be downloaded), saved with
``save_pretrained`` into a temporary folder and loaded from it; batch 4, 256-token prompts,
32 new tokens.
"""
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                     bos_token_id=128000, eos_token_id=128001)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.float16).save_pretrained(checkpoint)

model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float16, device_map="auto",
                                             max_memory={0: "10GiB", "cpu": "64GiB"})
print("placed:", {d: sum(1 for v in model.hf_device_map.values() if v == d) for d in set(model.hf_device_map.values())})

prompts = torch.randint(0, config.vocab_size, (4, 256), device="cuda")
with torch.no_grad():
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=32, do_sample=False,
                         pad_token_id=config.eos_token_id)
print(out.shape)
