"""A mixture-of-experts MLP (8 experts, top-2 routing) in the common hand-written style:
each expert takes the tokens routed to it (torch.where on the router's choice, index_add_)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MoE(nn.Module):
    def __init__(self, d=1024, hidden=4096, n_experts=8, top_k=2):
        super().__init__()
        self.router = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(
            [nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)) for _ in range(n_experts)])
        self.top_k = top_k

    def forward(self, x):
        b, t, d = x.shape
        x = x.view(-1, d)
        weights, chosen = torch.topk(F.softmax(self.router(x), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            token_idx, slot = torch.where(chosen == i)
            if token_idx.numel() == 0:
                continue
            out.index_add_(0, token_idx, expert(x[token_idx]) * weights[token_idx, slot, None])
        return out.view(b, t, d)


model = nn.Sequential(*[MoE() for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(2):
    x = torch.randn(8, 256, 1024, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
