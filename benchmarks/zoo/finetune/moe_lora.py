"""LoRA on a mixture-of-experts model: Qwen3-30B-A3B's shape (48 layers, 128 experts of which 8
run per token), bf16 weights, LoRA adapters on the attention projections with peft, gradient
checkpointing, AdamW on the adapters. transformers 5 runs the experts as grouped matmuls
(``torch._grouped_mm``), counting each expert's tokens with ``torch.histc``.

Pattern: peft docs, "LoRA" quicktour (https://huggingface.co/docs/peft/quicktour):
``get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=[...]))``; the Qwen3 model
card's bf16 loading.

Stands for Qwen/Qwen3-30B-A3B (its config, written in code: nothing can be downloaded), batch 2 x 1024.
"""
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

config = Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                        num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                        head_dim=128, vocab_size=151936, max_position_embeddings=40960, norm_topk_prob=True)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda")
model.gradient_checkpointing_enable()
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

for step in range(2):
    ids = torch.randint(0, config.vocab_size, (2, 1024), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
