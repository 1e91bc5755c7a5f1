"""A small Llama-style language model whose RMSNorm is the user's own Triton kernel: an
``@triton.autotune``-d ``@triton.jit`` forward and a ``@triton.jit`` backward, wrapped in a
``torch.autograd.Function``; bf16 weights, AdamW.

Pattern: Triton's tutorials "Fused Softmax" and "Layer Normalization"
(https://triton-lang.org/main/getting-started/tutorials/05-layer-norm.html): one program per row,
``BLOCK_SIZE = triton.next_power_of_2(N)``, the row statistics saved for backward, the weight
gradient reduced from per-row partial sums (here a full ``M x N`` fp32 buffer summed by torch).

Stands for a 350M-parameter decoder (24 layers, width 1024) at batch 8 x 1024.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["N"])
@triton.jit
def _rms_norm_fwd(X, W, Y, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(DY, X, W, Rstd, DX, DW, stride, N, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(Rstd + row)
    xhat = x * rstd
    wdy = w * dy
    c = tl.sum(xhat * wdy, axis=0) / N
    tl.store(DX + row * stride + cols, ((wdy - xhat * c) * rstd).to(DX.dtype.element_ty), mask=mask)
    tl.store(DW + row * N + cols, dy * xhat, mask=mask)


class TritonRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x = x.reshape(-1, shape[-1]).contiguous()
        M, N = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        _rms_norm_fwd[(M,)](x, weight, y, rstd, x.stride(0), N, eps, BLOCK_SIZE=triton.next_power_of_2(N))
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        M, N = x.shape
        dy = dy.reshape(M, N).contiguous()
        dx = torch.empty_like(x)
        dw_rows = torch.empty((M, N), dtype=torch.float32, device=x.device)
        _rms_norm_bwd[(M,)](dy, x, weight, rstd, dx, dw_rows, x.stride(0), N, BLOCK_SIZE=triton.next_power_of_2(N))
        return dx.view(ctx.shape), dw_rows.sum(0).to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return TritonRMSNorm.apply(x, self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.n_heads, C // self.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLM(nn.Module):
    def __init__(self, vocab=32000, dim=1024, n_layers=24, n_heads=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


model = TinyLM().to(device="cuda", dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(2):
    ids = torch.randint(0, 32000, (8, 1025), device="cuda")
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
