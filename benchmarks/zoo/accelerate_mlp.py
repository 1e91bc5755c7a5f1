"""An MLP classifier trained with accelerate's Accelerator (bf16 mixed precision, a
DataLoader it prepares, accelerator.backward and clip_grad_norm_)."""
import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(mixed_precision="bf16")
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Dropout(0.1), nn.Linear(4096, 4096), nn.GELU(),
                      nn.Linear(4096, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(2048, 1024), torch.randint(0, 10, (2048,)))
loader = DataLoader(data, batch_size=256, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

model.train()
for step, (x, y) in enumerate(loader):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    if step == 2:
        break
