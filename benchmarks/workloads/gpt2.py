"""GPT-2-small-sized decoder, causal-LM training on random tokens (ground-truth workload).

Knobs are plain top-level assignments so tools can override them (`--set VAR=VALUE`).
"""
import torch
import torch.nn.functional as F

from models import GPT2, autocast, make_optimizer

device = "cuda"
batch_size = 8
seq_len = 1024
max_positions = 1024
vocab_size = 50257
dim = 768
n_layers = 12
n_heads = 12
optimizer_name = "AdamW"
lr = 3e-4
amp_dtype = None  # e.g. "bfloat16"
checkpointing = False
compiled = False  # torch.compile(model)
compile_mode = None  # torch.compile's mode, e.g. "reduce-overhead" (CUDA graphs)
iterations = 3
seed = 0

torch.manual_seed(seed)
model = GPT2(vocab_size=vocab_size, max_positions=max_positions, dim=dim, n_layers=n_layers,
             heads=n_heads, checkpointing=checkpointing).to(device)
optimizer = make_optimizer(optimizer_name, model.parameters(), lr)
if compiled:
    model = torch.compile(model, mode=compile_mode)
tokens = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
targets = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)

model.train()
for step in range(iterations):
    with autocast(device, amp_dtype):
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

print(f"gpt2: {iterations} iterations, final loss {loss.item():.4f}")
