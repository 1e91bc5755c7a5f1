"""A memory-saving Swish as a custom autograd.Function (saves only the input, recomputes
the sigmoid in backward), in a wide MLP."""
import torch
import torch.nn as nn


class MemoryEfficientSwish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


class Swish(nn.Module):
    def forward(self, x):
        return MemoryEfficientSwish.apply(x)


model = nn.Sequential(nn.Linear(2048, 8192), Swish(), nn.Linear(8192, 8192), Swish(), nn.Linear(8192, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=3e-4)
for step in range(3):
    x, y = torch.randn(512, 2048, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
