"""A fused RMSNorm written as a torch.library custom op with a backward but no fake
kernel (the author only ever ran it on a GPU), inside a small decoder."""
import torch
import torch.nn as nn


@torch.library.custom_op("zoo::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    with torch.enable_grad():
        xd, wd = x.detach().requires_grad_(), weight.detach().requires_grad_()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + ctx.eps) * wd
        gx, gw = torch.autograd.grad(y, (xd, wd), grad)
    return gx, gw, None


rms_norm.register_autograd(_backward, setup_context=_setup)


class Block(nn.Module):
    def __init__(self, d=1024):
        super().__init__()
        self.w1 = nn.Parameter(torch.ones(d))
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.mlp(rms_norm(x, self.w1, 1e-6))


model = nn.Sequential(*[Block() for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(2):
    x = torch.randn(16, 512, 1024, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
