"""A VGG-style CNN trained with Adam. AMP, CKPT, ACCUM and COMPILE switch on, by hand, the changes
`xmem advise` measures (tests/cli/test_advisor.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

batch_size = 160
AMP = False
AMP_DTYPE = "float16"  # "bfloat16" where the GPU has it (no GradScaler then)
CKPT = False  # checkpoint each block of `features`
ACCUM = 1  # micro-batches per optimizer step
COMPILE = False  # torch.compile the model


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), block(128, 256))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100))

    def forward(self, x):
        for b in self.features:
            x = checkpoint(b, x, use_reentrant=False) if CKPT else b(x)
        return self.head(x)


model = Net().cuda()
step_model = torch.compile(model) if COMPILE else model
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
DTYPE = getattr(torch, AMP_DTYPE)
scaler = torch.amp.GradScaler("cuda", enabled=AMP and DTYPE == torch.float16)
micro = batch_size // ACCUM
for step in range(2):
    for _ in range(ACCUM):
        x = torch.randn(micro, 3, 224, 224, device="cuda")
        y = torch.randint(0, 100, (micro,), device="cuda")
        with torch.autocast("cuda", dtype=DTYPE, enabled=AMP):
            loss = F.cross_entropy(step_model(x), y) / ACCUM
        scaler.scale(loss).backward()
        del x, y, loss  # nothing of this micro-batch outlives it
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
