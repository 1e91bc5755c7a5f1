"""Knowledge distillation into a ResNet-18 student from a frozen ResNet-50 teacher, with an
EMA copy of the student (copy.deepcopy, lerp_ under no_grad) and a KL + CE loss."""
import copy

import torch
import torch.nn.functional as F
import torchvision

teacher = torchvision.models.resnet50().cuda().eval()
for p in teacher.parameters():
    p.requires_grad_(False)
student = torchvision.models.resnet18().cuda()
ema = copy.deepcopy(student).eval()
optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
T = 4.0
for step in range(3):
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    with torch.no_grad():
        t_logits = teacher(x)
    s_logits = student(x)
    kd = F.kl_div(F.log_softmax(s_logits / T, 1), F.softmax(t_logits / T, 1), reduction="batchmean") * T * T
    loss = 0.9 * kd + 0.1 * F.cross_entropy(s_logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for e, s in zip(ema.parameters(), student.parameters()):
            e.lerp_(s, 1 - 0.999)
