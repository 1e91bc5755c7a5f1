"""A 3-layer GCN on a random graph written without PyG: symmetric normalisation, messages
gathered along edges and summed with index_add_, node classification with a train mask."""
import torch
import torch.nn as nn
import torch.nn.functional as F

num_nodes, num_edges, feats, classes = 100_000, 1_000_000, 128, 40
device = "cuda"
edge_index = torch.randint(0, num_nodes, (2, num_edges), device=device)
x = torch.randn(num_nodes, feats, device=device)
y = torch.randint(0, classes, (num_nodes,), device=device)
train_mask = torch.rand(num_nodes, device=device) < 0.3


class GCNLayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, h, edge_index):
        src, dst = edge_index
        deg = torch.zeros(h.size(0), device=h.device).index_add_(0, dst, torch.ones_like(dst, dtype=torch.float))
        norm = deg.clamp(min=1).pow(-0.5)
        msg = self.lin(h)[src] * (norm[src] * norm[dst]).unsqueeze(-1)
        return torch.zeros(h.size(0), msg.size(1), device=h.device).index_add_(0, dst, msg)


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([GCNLayer(feats, 256), GCNLayer(256, 256), GCNLayer(256, classes)])

    def forward(self, h, edge_index):
        for i, layer in enumerate(self.layers):
            h = layer(h, edge_index)
            if i < len(self.layers) - 1:
                h = F.dropout(F.relu(h), 0.5, self.training)
        return h


model = GCN().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
for epoch in range(3):
    optimizer.zero_grad()
    out = model(x, edge_index)
    loss = F.cross_entropy(out[train_mask], y[train_mask])
    loss.backward()
    optimizer.step()
    acc = (out.argmax(1)[train_mask] == y[train_mask]).float().mean()
    print(f"epoch {epoch}: loss {loss.item():.3f} acc {acc.item():.3f}")
