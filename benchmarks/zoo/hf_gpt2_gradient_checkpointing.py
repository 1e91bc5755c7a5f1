"""GPT-2 medium with gradient checkpointing under bf16 autocast, AdamW, batch 8 x 512."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

config = GPT2Config(n_layer=24, n_embd=1024, n_head=16)
model = GPT2LMHeadModel(config).to("cuda")
model.gradient_checkpointing_enable()
model.config.use_cache = False
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

for step in range(2):
    input_ids = torch.randint(0, config.vocab_size, (8, 512)).cuda()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(step, loss.item())
