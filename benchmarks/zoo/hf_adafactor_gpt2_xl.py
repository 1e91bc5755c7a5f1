"""GPT-2 XL (1.5B parameters) fine-tuned with transformers' Adafactor, as its model card's
recipe goes (relative step, warm-up init, parameter scaling): 3 steps, batch 1 x 128."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.optimization import Adafactor

batch_size = 1
seq_len = 128
steps = 3

config = GPT2Config(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024)
model = GPT2LMHeadModel(config).cuda()
model.train()
optimizer = Adafactor(model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None)

for step in range(steps):
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), device="cuda")
    outputs = model(input_ids=input_ids, labels=input_ids)
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {loss.item():.4f}")
