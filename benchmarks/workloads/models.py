"""Plain-torch models for the ground-truth workloads.

Written here instead of imported from torchvision / transformers so the GPU
machine needs nothing beyond torch, and so the CPU estimator sees exactly the
same code the GPU ran.  Architectures follow the reference sizes (ResNet-50 as
in torchvision, ViT-B/16, BERT-base, GPT-2 small); only memory-relevant
structure matters, so weight-init details are left at torch defaults.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


# --------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    """torchvision Bottleneck (v1.5: stride on the 3x3 conv)."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision resnet50: stem, Bottleneck stages [3, 4, 6, 3], avgpool, fc."""

    def __init__(self, num_classes: int = 1000, layers: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_ch = [], 64
        for i, blocks in enumerate(layers):
            width = 64 * 2**i
            for j in range(blocks):
                stages.append(Bottleneck(in_ch, width, stride=2 if (i > 0 and j == 0) else 1))
                in_ch = width * Bottleneck.expansion
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


# ------------------------------------------------------------------ MobileNetV2
def _conv_bn_relu6(in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(out_ch), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """torchvision MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 project (+ residual)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_ch * expand
        layers = [_conv_bn_relu6(in_ch, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision mobilenet_v2 (width 1.0): the xMem paper's RTX 3060 runs at batch 251-317
    measured 11-16% above xmem's estimate, the same model at 638-764 within 2%."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers, in_ch = [_conv_bn_relu6(3, 32, stride=2)], 32
        for expand, out_ch, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(in_ch, out_ch, stride if i == 0 else 1, expand))
                in_ch = out_ch
        layers.append(_conv_bn_relu6(in_ch, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ------------------------------------------------------------------ transformers
class SelfAttention(nn.Module):
    """Fused-QKV multi-head attention through F.scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Transformer block; pre-LN (ViT, GPT-2) or post-LN (BERT)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, causal: bool, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """Apply blocks in order, each under non-reentrant activation checkpointing if asked."""
    for block in blocks:
        if checkpointing and torch.is_grad_enabled():
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    return x


class ViT(nn.Module):
    """ViT-B/16 defaults: patch 16, dim 768, 12 layers, 12 heads, MLP 3072, cls token."""

    def __init__(self, image_size: int = 224, patch: int = 16, dim: int = 768, n_layers: int = 12,
                 heads: int = 12, mlp_dim: int = 3072, num_classes: int = 1000,
                 checkpointing: bool = False) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        n_patches = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n_patches + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_dim, False, True) for _ in range(n_layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = run_blocks(self.blocks, x, self.checkpointing)
        return self.head(self.ln(x[:, 0]))


class BertMLM(nn.Module):
    """BERT-base encoder (post-LN) with the MLM head tied to the word embeddings."""

    def __init__(self, vocab_size: int = 30522, max_positions: int = 512, dim: int = 768,
                 n_layers: int = 12, heads: int = 12, mlp_dim: int = 3072,
                 checkpointing: bool = False) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.word = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(max_positions, dim)
        self.token_type = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_dim, False, False) for _ in range(n_layers))
        self.head_dense = nn.Linear(dim, dim)
        self.head_ln = nn.LayerNorm(dim)
        self.decoder = nn.Linear(dim, vocab_size)
        self.decoder.weight = self.word.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word(tokens) + self.position(pos) + self.token_type(torch.zeros_like(tokens))
        x = run_blocks(self.blocks, self.ln(x), self.checkpointing)
        return self.decoder(self.head_ln(F.gelu(self.head_dense(x))))


class GPT2(nn.Module):
    """GPT-2 small decoder: learned positions, pre-LN causal blocks, tied LM head."""

    def __init__(self, vocab_size: int = 50257, max_positions: int = 1024, dim: int = 768,
                 n_layers: int = 12, heads: int = 12, checkpointing: bool = False) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(max_positions, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, 4 * dim, True, True) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = run_blocks(self.blocks, self.wte(tokens) + self.wpe(pos), self.checkpointing)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------- helpers
def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The two optimizers the runs use, with their usual settings (torch default impl)."""
    if name == "SGD":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "AdamW":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"unknown optimizer_name {name!r}; expected 'SGD' or 'AdamW'")


def autocast(device: str, amp_dtype: str | None) -> ContextManager:
    """torch.autocast on the script's device for amp_dtype (e.g. "bfloat16"), or a no-op."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, amp_dtype))
