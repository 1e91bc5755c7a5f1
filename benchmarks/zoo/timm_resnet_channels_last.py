"""timm ResNet-50 in channels_last with bf16 autocast (timm's train.py --channels-last --amp)."""
import timm
import torch
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2

model = timm.create_model("resnet50", pretrained=False, num_classes=1000)
model = model.cuda().to(memory_format=torch.channels_last)
optimizer = create_optimizer_v2(model, opt="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4)
loss_fn = LabelSmoothingCrossEntropy(smoothing=0.1).cuda()

for step in range(2):
    images = torch.randn(128, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (128,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
