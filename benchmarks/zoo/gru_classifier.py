"""A 2-layer bidirectional GRU sentence classifier on fixed-length batches, the final hidden
states of both directions concatenated."""
import torch
import torch.nn as nn


class GRUClassifier(nn.Module):
    def __init__(self, vocab=30000, emb=256, hidden=384, classes=5):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, num_layers=2, bidirectional=True, dropout=0.2)
        self.fc = nn.Linear(hidden * 2, classes)

    def forward(self, text):  # text: (seq_len, batch)
        _, hidden = self.gru(self.embedding(text))
        return self.fc(torch.cat((hidden[-2], hidden[-1]), dim=1))


device = "cuda"
model = GRUClassifier().to(device)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
for step in range(3):
    text = torch.randint(0, 30000, (200, 128), device=device)
    label = torch.randint(0, 5, (128,), device=device)
    optimizer.zero_grad()
    loss = criterion(model(text), label)
    loss.backward()
    optimizer.step()
