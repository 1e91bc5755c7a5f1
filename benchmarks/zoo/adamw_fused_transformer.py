"""nn.TransformerEncoder (12 layers, d=768) with AdamW(fused=True) and a warm-up schedule."""
import torch
import torch.nn as nn

layer = nn.TransformerEncoderLayer(d_model=768, nhead=12, dim_feedforward=3072, dropout=0.1, batch_first=True,
                                   norm_first=True)
model = nn.TransformerEncoder(layer, num_layers=12).cuda()
head = nn.Linear(768, 1000).cuda()
params = list(model.parameters()) + list(head.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))
for step in range(3):
    x = torch.randn(32, 256, 768, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")
    loss = nn.functional.cross_entropy(head(model(x).mean(1)), y)
    loss.backward()
    optimizer.step()
    warmup.step()
    optimizer.zero_grad()
