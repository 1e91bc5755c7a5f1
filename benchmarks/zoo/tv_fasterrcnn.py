"""torchvision Faster R-CNN (ResNet-50 FPN) training step as in torchvision's detection
reference: a list of images, targets with boxes and labels, SGD, the summed loss dict."""
import torch
import torchvision
from torchvision.models.detection import fasterrcnn_resnet50_fpn

device = torch.device("cuda")
model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91).to(device)
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)


def random_target(n):
    xy = torch.rand(n, 2) * 600
    wh = torch.rand(n, 2) * 150 + 10
    return {"boxes": torch.cat([xy, xy + wh], 1), "labels": torch.randint(1, 91, (n,))}


model.train()
for step in range(2):
    images = [torch.rand(3, 640, 800).to(device) for _ in range(4)]
    targets = [{k: v.to(device) for k, v in random_target(5).items()} for _ in range(4)]
    loss_dict = model(images, targets)
    losses = sum(loss for loss in loss_dict.values())
    optimizer.zero_grad()
    losses.backward()
    optimizer.step()
    print({k: round(v.item(), 3) for k, v in loss_dict.items()})
