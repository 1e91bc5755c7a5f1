"""A small CNN training script written for CUDA, as a user would write it.

    xmem estimate examples/train_cnn.py --gpu RTX-4060-8GB
    xmem estimate examples/train_cnn.py --gpu T4 --max-batch batch_size
"""

import torch
from torch import nn

batch_size = 128
iterations = 3
device = "cuda"


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(256 * 16 * 16, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


model = SmallCNN().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for step in range(iterations):
    images = torch.randn(batch_size, 3, 64, 64).to(device)
    labels = torch.randint(0, 10, (batch_size,)).to(device)
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(images), labels)
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.3f}, allocated {torch.cuda.memory_allocated() / 2**20:.0f} MiB")
