"""pytorch/examples' MNIST CNN (Adadelta, StepLR, log_softmax + nll_loss), with a random
dataset in place of torchvision's download, through a DataLoader with workers and pinning."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_kwargs = {"batch_size": 64, "num_workers": 1, "pin_memory": True, "shuffle": True}
dataset = TensorDataset(torch.randn(640, 1, 28, 28), torch.randint(0, 10, (640,)))
train_loader = DataLoader(dataset, **train_kwargs)
model = Net().to(device)
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
model.train()
for batch_idx, (data, target) in enumerate(train_loader):
    data, target = data.to(device), target.to(device)
    optimizer.zero_grad()
    loss = F.nll_loss(model(data), target)
    loss.backward()
    optimizer.step()
    if batch_idx % 2 == 0:
        print(f"[{batch_idx * len(data)}/{len(train_loader.dataset)}] loss: {loss.item():.6f}")
    if batch_idx == 3:
        break
scheduler.step()
