"""Small models in plain torch for the tracer tests (no torchvision in this environment).

Each :class:`ZooModel` builds a model, makes one CPU batch and computes the loss, so a test
can write an ordinary CUDA training loop around it. Sizes are small: the whole zoo trains two
iterations in both tracer modes in a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Conv + BatchNorm + pooling, the classic image classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + idt, inplace=True)


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, 2), BasicBlock(2 * width, 2 * width))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class ConvNeXtBlockNet(nn.Module):
    """Depthwise conv + LayerNorm + MLP, initialised with ``trunc_normal_`` like ConvNeXt
    (whose init reads tensor values and fails under a plain FakeTensorMode)."""

    def __init__(self, dim: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))
        self.head = nn.Linear(dim, classes)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        x = x + (self.gamma * y).permute(0, 3, 1, 2)
        return self.head(x.mean((2, 3)))


class EncoderClassifier(nn.Module):
    """``nn.TransformerEncoder`` (multi-head attention, LayerNorm, dropout) over tokens."""

    def __init__(self, vocab: int = 100, d: int = 32, heads: int = 4, layers: int = 2, classes: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tokens)).mean(1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class DecoderBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer with learned positions and tied embeddings."""

    def __init__(self, vocab: int = 128, d: int = 32, heads: int = 4, layers: int = 2, block: int = 16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(DecoderBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


class Seq2SeqTransformer(nn.Module):
    """``nn.Transformer`` encoder-decoder with a causal target mask."""

    def __init__(self, vocab: int = 64, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        src, tgt = tokens[:, :8], tokens[:, 8:]
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tokens.device)
        return self.out(self.transformer(self.emb(src), self.emb(tgt), tgt_mask=mask, tgt_is_causal=True))


class EmbeddingBagModel(nn.Module):
    """Sparse-feature style model: EmbeddingBag + MLP."""

    def __init__(self, vocab: int = 500, d: int = 16):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(tokens))


class EmbeddingMean(nn.Module):
    """Bag-of-words text model: ``nn.Embedding``, mean pooling, linear head."""

    def __init__(self, vocab: int = 300, d: int = 24, classes: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens).mean(1))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16, hidden: int = 32, classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out[:, -1])


class GRUTagger(nn.Module):
    def __init__(self, d: int = 12, hidden: int = 16, classes: int = 4):
        super().__init__()
        self.gru = nn.GRU(d, hidden, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out)


def _ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _ce


def _images(n: int = 4, size: int = 16, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, size, size), torch.randint(0, classes, (n,))


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", MLP, lambda: (torch.randn(16, 32), torch.randint(0, 10, (16,)))),
        ZooModel("cnn_bn", SmallCNN, _images),
        ZooModel("resnet", TinyResNet, _images),
        ZooModel("convnext_block", ConvNeXtBlockNet, lambda: _images(2, 32)),
        ZooModel("transformer_encoder", EncoderClassifier,
                 lambda: (torch.randint(0, 100, (4, 12)), torch.randint(0, 5, (4,)))),
        ZooModel("gpt_decoder", TinyGPT,
                 lambda: (torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16)))),
        ZooModel("seq2seq_transformer", Seq2SeqTransformer,
                 lambda: (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 8)))),
        ZooModel("embedding_mean", EmbeddingMean,
                 lambda: (torch.randint(0, 300, (6, 9)), torch.randint(0, 4, (6,)))),
        ZooModel("embedding_bag", EmbeddingBagModel,
                 lambda: (torch.randint(0, 500, (8, 6)), torch.randint(0, 2, (8,)))),
        ZooModel("lstm", LSTMClassifier, lambda: (torch.randint(0, 50, (4, 10)), torch.randint(0, 3, (4,)))),
        ZooModel("gru", GRUTagger, lambda: (torch.randn(3, 7, 12), torch.randint(0, 4, (3, 7)))),
    ]
}


def train_fn(name: str, iters: int = 2, opt: str = "adamw") -> Callable[[], None]:
    """An ordinary CUDA training loop over a zoo model, as a user would write it."""
    zm = ZOO[name]

    def run() -> None:
        torch.manual_seed(0)
        model = zm.build().to("cuda")
        if opt == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(iters):
            x, y = zm.batch()
            x, y = x.cuda(), y.cuda()
            loss = zm.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


# Source of a transformer-like step (a string: tests and benchmarks/backward_vs_engine.py
# run it both plainly and as a traced cell) with every way two gradients meet: residual branches, a Python
# RMS norm and tanh-GELU (inputs used two and three times), a bias shared by all layers and
# added in place to the scores (its gradient arrives through AddBackward unchanged), and an
# embedding tied to the output layer.
TINY_LM = """
import math
import torch
import torch.nn as nn

class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
    def norm(self, h):
        return self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
    def forward(self, h, bias):
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2)
        scores += bias
        h = h + scores.softmax(-1) @ v
        x = self.up(self.norm(h))
        x = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return h + self.down(x)

class TinyLM(nn.Module):
    def __init__(self, vocab=100, d=32, n=3, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.bias = nn.Parameter(torch.zeros(seq, seq))
        self.layers = nn.ModuleList(Layer(d) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, ids):
        h = self.emb(ids)
        bias = self.bias * torch.ones(ids.shape[0], 1, 1, device=ids.device)  # scores' shape
        for layer in self.layers:
            h = layer(h, bias)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())
"""
