"""A CLIP-style dual encoder (ViT-B/16-sized image tower from torchvision, a 12-layer text
transformer) with a learned temperature clamped as open_clip does, symmetric InfoNCE loss."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class TextTower(nn.Module):
    def __init__(self, vocab=49408, width=512, layers=12, ctx=77, out=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(ctx, width))
        layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.ln = nn.LayerNorm(width)
        self.proj = nn.Linear(width, out, bias=False)

    def forward(self, text):
        mask = torch.triu(torch.full((text.size(1), text.size(1)), float("-inf"), device=text.device), 1)
        x = self.ln(self.blocks(self.tok(text) + self.pos, mask=mask))
        return self.proj(x[torch.arange(x.size(0)), text.argmax(-1)])


image_tower = torchvision.models.vit_b_16(num_classes=512).cuda()
text_tower = TextTower().cuda()
logit_scale = nn.Parameter(torch.ones([], device="cuda") * math.log(1 / 0.07))
params = list(image_tower.parameters()) + list(text_tower.parameters()) + [logit_scale]
optimizer = torch.optim.AdamW(params, lr=5e-4, weight_decay=0.2)
for step in range(2):
    images = torch.randn(64, 3, 224, 224, device="cuda")
    text = torch.randint(0, 49408, (64, 77), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        img = F.normalize(image_tower(images), dim=-1)
        txt = F.normalize(text_tower(text), dim=-1)
        logits = logit_scale.exp() * img @ txt.t()
        labels = torch.arange(len(images), device="cuda")
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        logit_scale.clamp_(0, math.log(100))
