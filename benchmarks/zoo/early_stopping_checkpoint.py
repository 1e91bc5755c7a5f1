"""A training loop with validation, early stopping on the validation loss and a best-model
checkpoint written with torch.save (to memory here), as most course notebooks do."""
import io

import torch
import torch.nn as nn

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(128, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.CrossEntropyLoss()
best, patience, bad_epochs, checkpoint = float("inf"), 2, 0, io.BytesIO()
for epoch in range(4):
    model.train()
    for _ in range(2):
        x, y = torch.randn(256, 3, 32, 32).cuda(), torch.randint(0, 10, (256,)).cuda()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        xv, yv = torch.randn(512, 3, 32, 32).cuda(), torch.randint(0, 10, (512,)).cuda()
        val_loss = criterion(model(xv), yv).item()
    if val_loss < best:
        best, bad_epochs = val_loss, 0
        checkpoint.seek(0)
        torch.save(model.state_dict(), checkpoint)
    else:
        bad_epochs += 1
        if bad_epochs >= patience:
            print(f"early stop at epoch {epoch}")
            break
