"""timm ViT-S/16 with fp16 autocast and a GradScaler, AdamW, a cosine schedule (timm's
--amp recipe, NativeScaler unrolled)."""
import timm
import torch

model = timm.create_model("vit_small_patch16_224", pretrained=False, drop_path_rate=0.1).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
scaler = torch.amp.GradScaler("cuda")
criterion = torch.nn.CrossEntropyLoss()

for step in range(3):
    x = torch.randn(128, 3, 224, 224).cuda(non_blocking=True)
    y = torch.randint(0, 1000, (128,)).cuda(non_blocking=True)
    with torch.amp.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
