"""BERT-base-sized encoder, masked-LM training on random tokens (ground-truth workload).

Logits are computed over the vocabulary at every position (as BERT's MLM head
does); the loss only counts the ~15% masked positions.  Knobs are plain
top-level assignments so tools can override them (`--set VAR=VALUE`).
"""
import torch
import torch.nn.functional as F

from models import BertMLM, autocast, make_optimizer

device = "cuda"
batch_size = 16
seq_len = 512
max_positions = 512
vocab_size = 30522
dim = 768
n_layers = 12
n_heads = 12
mlp_dim = 3072
mask_fraction = 0.15
optimizer_name = "AdamW"
lr = 1e-4
amp_dtype = None  # e.g. "bfloat16"
checkpointing = False
iterations = 3
seed = 0

torch.manual_seed(seed)
model = BertMLM(vocab_size=vocab_size, max_positions=max_positions, dim=dim, n_layers=n_layers,
                heads=n_heads, mlp_dim=mlp_dim, checkpointing=checkpointing).to(device)
optimizer = make_optimizer(optimizer_name, model.parameters(), lr)
tokens = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
labels = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
labels[torch.rand(batch_size, seq_len, device=device) >= mask_fraction] = -100

model.train()
for step in range(iterations):
    with autocast(device, amp_dtype):
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, vocab_size), labels.view(-1), ignore_index=-100)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

print(f"bert: {iterations} iterations, final loss {loss.item():.4f}")
