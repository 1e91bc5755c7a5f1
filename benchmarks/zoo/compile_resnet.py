"""torchvision ResNet-18 wrapped in torch.compile (mode="max-autotune" as blog posts advise)."""
import torch
import torchvision

model = torchvision.models.resnet18(num_classes=100).cuda()
model = torch.compile(model, mode="max-autotune")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(3):
    x = torch.randn(256, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (256,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
