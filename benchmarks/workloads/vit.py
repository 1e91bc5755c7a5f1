"""ViT-B/16 image-classification training on random data (ground-truth workload).

Knobs are plain top-level assignments so tools can override them (`--set VAR=VALUE`).
"""
import torch
import torch.nn.functional as F

from models import ViT, autocast, make_optimizer

device = "cuda"
batch_size = 32
image_size = 224
patch_size = 16
dim = 768
n_layers = 12
n_heads = 12
mlp_dim = 3072
num_classes = 1000
optimizer_name = "AdamW"
lr = 1e-4
amp_dtype = None  # e.g. "bfloat16"
checkpointing = False
iterations = 3
seed = 0

torch.manual_seed(seed)
model = ViT(image_size=image_size, patch=patch_size, dim=dim, n_layers=n_layers, heads=n_heads,
            mlp_dim=mlp_dim, num_classes=num_classes, checkpointing=checkpointing).to(device)
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

print(f"vit: {iterations} iterations, final loss {loss.item():.4f}")
