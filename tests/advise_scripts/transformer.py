"""A GPT-style transformer (explicit attention) trained with AdamW. AMP, CKPT and ACCUM switch
on, by hand, the changes `xmem advise` measures (tests/cli/test_advisor.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

batch_size = 16
seq = 1024
AMP = False
AMP_DTYPE = "float16"  # "bfloat16" where the GPU has it (no GradScaler then)
CKPT = False
ACCUM = 1


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=8000, d=512, heads=8, layers=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if CKPT else blk(x)
        return self.head(x)


model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
DTYPE = getattr(torch, AMP_DTYPE)
scaler = torch.amp.GradScaler("cuda", enabled=AMP and DTYPE == torch.float16)
micro = batch_size // ACCUM
for _ in range(ACCUM):
    idx = torch.randint(0, 8000, (micro, seq), device="cuda")
    with torch.autocast("cuda", dtype=DTYPE, enabled=AMP):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1)) / ACCUM
    scaler.scale(loss).backward()
    del idx, logits, loss  # nothing of this micro-batch outlives it
scaler.step(opt)
scaler.update()
opt.zero_grad(set_to_none=True)
