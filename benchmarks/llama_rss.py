"""Trace a Llama-2-7B-sized training step in fake mode and report time and peak RSS.

A decoder with Llama-2-7B's shape (32 layers, d=4096, 32 heads, SwiGLU 11008, vocab 32000,
RMSNorm, rotary embeddings; config written in code), built and moved to ``cuda`` inside the
traced code, AdamW, batch 1 x 512 tokens, one iteration by default. Its GPU footprint is over
100 GB in fp32; under fake tensors the CPU process stays small.

Prints one JSON object: seconds, peak_rss_bytes (ru_maxrss), events, parameter_bytes and
peak_live_bytes (the largest sum of live GPU storages), mode.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, heads)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = MLP(d, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int = 32000, d: int = 4096, layers: int = 32, heads: int = 32, hidden: int = 11008):
        super().__init__()
        self.hd = d // heads
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, device=idx.device).float() / self.hd))
        freqs = torch.outer(torch.arange(t, device=idx.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def train_step(iters: int = 1, seq: int = 512, batch: int = 1) -> None:
    model = Llama().to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for _ in range(iters):
        idx = torch.randint(0, 32000, (batch, seq), device="cuda")
        logits = model(idx)
        F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=1)
    args = ap.parse_args()
    from xmem_engine.tracing import trace

    t0 = time.perf_counter()
    tr = trace(lambda: train_step(args.iters), mode="fake")
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1024 if sys.platform != "darwin" else 1)
    params = sum(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "parameter")
    live = peak = 0
    for e in tr.events:
        if e.kind == "alloc":
            live += e.bytes
            peak = max(peak, live)
        elif e.kind == "free":
            live -= e.bytes
    print(json.dumps({"seconds": round(seconds, 2), "peak_rss_bytes": rss, "events": len(tr.events),
                      "parameter_bytes": params, "peak_live_bytes": peak, "mode": tr.mode}))


if __name__ == "__main__":
    main()
