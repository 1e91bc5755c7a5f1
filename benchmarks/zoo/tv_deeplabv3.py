"""torchvision DeepLabV3 (ResNet-50) semantic segmentation with the auxiliary head, as in
torchvision's segmentation reference: criterion over "out" and 0.5 * "aux", ignore_index 255."""
import torch
import torch.nn as nn
from torchvision.models.segmentation import deeplabv3_resnet50

model = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True).cuda()
params = [{"params": [p for p in model.backbone.parameters() if p.requires_grad]},
          {"params": [p for p in model.classifier.parameters() if p.requires_grad]},
          {"params": [p for p in model.aux_classifier.parameters() if p.requires_grad], "lr": 0.1}]
optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)


def criterion(inputs, target):
    losses = {name: nn.functional.cross_entropy(x, target, ignore_index=255) for name, x in inputs.items()}
    return losses["out"] + 0.5 * losses["aux"]


for step in range(2):
    image = torch.randn(8, 3, 480, 480).cuda()
    target = torch.randint(0, 21, (8, 480, 480)).cuda()
    loss = criterion(model(image), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
