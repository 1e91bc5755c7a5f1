"""BERT-base masked-language-model pre-training the way a free T4 notebook does it: fp32 weights,
``torch.autocast("cuda", dtype=torch.float16)`` and ``torch.amp.GradScaler`` (T4s have no bf16),
AdamW, batch 64 x 512 with 15 % of the tokens masked on the GPU.

Pattern: PyTorch recipe "Automatic Mixed Precision"
(https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html) around transformers'
``BertForMaskedLM`` (https://huggingface.co/docs/transformers/model_doc/bert), masking as
``DataCollatorForLanguageModeling`` does (80 % [MASK], no random/keep split here).

Stands for bert-base-uncased (its config, written in code: nothing can be downloaded).
"""
import torch
from transformers import BertConfig, BertForMaskedLM

config = BertConfig()  # bert-base-uncased's shape: 12 layers, 768 wide, vocab 30522
model = BertForMaskedLM(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
scaler = torch.amp.GradScaler("cuda")
mask_token_id = 103

model.train()
for step in range(2):
    input_ids = torch.randint(1000, config.vocab_size, (64, 512), device="cuda")
    labels = input_ids.clone()
    masked = torch.rand(input_ids.shape, device="cuda") < 0.15
    labels[~masked] = -100
    input_ids[masked & (torch.rand(input_ids.shape, device="cuda") < 0.8)] = mask_token_id
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f} scale {scaler.get_scale()}")
