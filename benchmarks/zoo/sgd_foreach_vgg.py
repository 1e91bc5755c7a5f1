"""VGG-16 (torchvision) with SGD(foreach=True), momentum and weight decay, batch 64."""
import torch
import torchvision

model = torchvision.models.vgg16(num_classes=1000).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)
criterion = torch.nn.CrossEntropyLoss().cuda()
for step in range(2):
    images, target = torch.randn(64, 3, 224, 224).cuda(), torch.randint(0, 1000, (64,)).cuda()
    loss = criterion(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
