"""A Llama-style decoder in plain torch, for the distributed benchmark's scripts.

Shapes follow the published configs: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads, 8 KV
heads, MLP 8192, vocabulary 128,256) and Llama-3-8B (4096, 32, 32, 8, 14,336, 128,256). The
1B's embedding and head are kept apart here (the published model ties them): built on the
meta device and materialised with ``Module.to_empty``, as FSDP scripts do, a tied pair comes
apart anyway (PyTorch makes each parameter anew), and the benchmark compares like with like. Attention is grouped-query through ``scaled_dot_product_attention``; rotary
embeddings are left out (a few small tensors per layer, no parameters).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, mlp=8192, vocab=128256, tied=False),
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, mlp=14336, vocab=128256, tied=False),
}


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, mlp, **_):
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, hidden // heads
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.dh, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, mlp, bias=False)
        self.up = nn.Linear(hidden, mlp, bias=False)
        self.down = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.heads, self.dh).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.dh).permute(2, 0, 3, 1, 4)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, size: str = "1b"):
        super().__init__()
        c = CONFIGS[size]
        self.embed = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Block(**c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        self.head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        if c["tied"]:
            self.head.weight = self.embed.weight

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def n_params(size: str) -> int:
    """Parameters of the config, counted from its shapes (not from a built model)."""
    c = CONFIGS[size]
    tied = c["tied"]
    d, kv = c["hidden"], 2 * c["kv_heads"] * (c["hidden"] // c["heads"])
    block = d * d * 2 + d * kv + 3 * d * c["mlp"] + 2 * d
    emb = c["vocab"] * d
    return emb * (1 if tied else 2) + c["layers"] * block + d
