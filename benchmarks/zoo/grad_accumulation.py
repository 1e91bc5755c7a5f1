"""Gradient accumulation over 4 micro-batches of a ResNet-50 (torchvision), the loss divided
by the accumulation steps, one optimizer step per 4 micro-batches."""
import torch
import torchvision

model = torchvision.models.resnet50().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
accumulation_steps = 4
micro_batch = 32

optimizer.zero_grad()
for i in range(8):
    x = torch.randn(micro_batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (micro_batch,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation_steps
    loss.backward()
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
