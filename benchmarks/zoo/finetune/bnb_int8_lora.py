"""LoRA on a base model loaded in 8-bit (LLM.int8(): ``BitsAndBytesConfig(load_in_8bit=True)``),
prepared with peft's ``prepare_model_for_kbit_training`` (norms cast to fp32, input gradients
on, gradient checkpointing), a plain PyTorch loop with AdamW on the adapters.

Pattern: peft docs, "Quantization" (https://huggingface.co/docs/peft/developer_guides/quantization)
and transformers docs "bitsandbytes" 8-bit (https://huggingface.co/docs/transformers/quantization/bitsandbytes):
``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_8bit=True))``,
``prepare_model_for_kbit_training(model)``, ``get_peft_model(model, LoraConfig(...))``.

Stands for TinyLlama-1.1B (its config, written in code: nothing can be downloaded); the local
checkpoint is the config's model saved with ``save_pretrained`` into a temporary folder.
"""
import tempfile

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
checkpoint = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config, dtype=torch.float16).save_pretrained(checkpoint)

model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                             device_map="auto")
model = prepare_model_for_kbit_training(model)
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                                         task_type="CAUSAL_LM"))
model.print_trainable_parameters()
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (4, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
