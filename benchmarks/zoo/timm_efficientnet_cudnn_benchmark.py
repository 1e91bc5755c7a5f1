"""timm EfficientNet-B0 with cudnn.benchmark on, SGD with Nesterov momentum, batch 192."""
import timm
import torch
import torch.backends.cudnn as cudnn

cudnn.benchmark = True
model = timm.create_model("efficientnet_b0", pretrained=False).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.048, momentum=0.9, nesterov=True, weight_decay=1e-5)

model.train()
for step in range(2):
    x = torch.randn(192, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (192,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
