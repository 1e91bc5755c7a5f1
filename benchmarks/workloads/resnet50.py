"""ResNet-50 image-classification training on random data (ground-truth workload).

Knobs are plain top-level assignments so tools can override them (`--set VAR=VALUE`).
"""
import torch
import torch.nn.functional as F

from models import ResNet50, autocast, make_optimizer

device = "cuda"
batch_size = 64
image_size = 224
num_classes = 1000
optimizer_name = "SGD"
lr = 0.1
amp_dtype = None  # e.g. "bfloat16"
iterations = 3
seed = 0

torch.manual_seed(seed)
model = ResNet50(num_classes=num_classes).to(device)
optimizer = make_optimizer(optimizer_name, model.parameters(), lr)
images = torch.randn(batch_size, 3, image_size, image_size, device=device)
labels = torch.randint(0, num_classes, (batch_size,), device=device)

model.train()
for step in range(iterations):
    with autocast(device, amp_dtype):
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

print(f"resnet50: {iterations} iterations, final loss {loss.item():.4f}")
