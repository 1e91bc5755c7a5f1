"""MobileNetV2 training as in the xMem paper's CNN runs (ground-truth workload): 86x86
images, cross-entropy, a torch.optim optimiser at lr 1e-3, zero_grad after the forward.

On the paper's RTX 3060 this model measured 11-16% above xmem's estimate at batch 251-317
and within 2% at 638-764; recording both shows what the allocator (and cuDNN's workspaces)
did. Knobs are plain top-level assignments so tools can override them (`--set VAR=VALUE`).
"""
import torch
import torch.nn.functional as F

from models import MobileNetV2, make_optimizer

device = "cuda"
batch_size = 251
image_size = 86
num_classes = 1000
optimizer_name = "AdamW"
lr = 1e-3
iterations = 4
seed = 0

torch.manual_seed(seed)
model = MobileNetV2(num_classes=num_classes).to(device)
optimizer = make_optimizer(optimizer_name, model.parameters(), lr)
model.train()
for step in range(iterations):
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

print(f"mobilenetv2: {iterations} iterations, final loss {loss.item():.4f}")
