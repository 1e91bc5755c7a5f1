"""Beam search with ``model.generate(num_beams=4)``: every prompt is expanded to 4 beams, so the
key/value cache holds batch x 4 sequences and is reordered at each step; batch 8, prompts of 512
tokens (left-padded), 128 new tokens, bf16.

Pattern: transformers docs, "Generation strategies", beam search
(https://huggingface.co/docs/transformers/generation_strategies):
``model.generate(**inputs, num_beams=4, max_new_tokens=..., early_stopping=True)``.

Stands for TinyLlama-1.1B-Chat (its config, written in code: nothing can be downloaded).
"""
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda").eval()

batch, prompt_len = 8, 512
input_ids = torch.randint(3, config.vocab_size, (batch, prompt_len))
attention_mask = torch.ones_like(input_ids)
for i in range(batch):  # left padding, as a tokenizer with padding_side="left" makes it
    pad = (i * 37) % 200
    input_ids[i, :pad] = config.pad_token_id
    attention_mask[i, :pad] = 0
inputs = {"input_ids": input_ids.to("cuda"), "attention_mask": attention_mask.to("cuda")}

outputs = model.generate(**inputs, max_new_tokens=128, num_beams=4, early_stopping=True)
print(outputs.shape)
