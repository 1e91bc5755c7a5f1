"""Tracing speed: xmem's fake-mode tracer against the paper's approach.

The paper's approach runs the training code for real on the CPU under ``torch.profiler``
with ``profile_memory=True`` and reads the allocations from the profile. xmem runs the same
code under fake tensors. Both do two training iterations of

* ResNet-50, batch 32, 224x224 images, SGD with momentum;
* a GPT-2-small-sized decoder (12 layers, d=768, 12 heads, vocab 50257), batch 8 x 512
  tokens, AdamW.

Run: ``python benchmarks/trace_speed.py [--only resnet50|gpt2] [--skip-profiler]``.
Prints both times and the ratio per model. The first fake trace of a process also pays a
one-time import of torch's fake-tensor machinery (torch._dynamo); it is timed separately.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + idt)


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            seq = []
            for i in range(blocks):
                seq.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
            layers.append(nn.Sequential(*seq))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------- GPT-2 small
class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab: int = 50257, block: int = 1024, d: int = 768, heads: int = 12, layers: int = 12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


# ----------------------------------------------------------------------------- workloads
def resnet50_step(device: str, iters: int = 2) -> Callable[[], None]:
    def run() -> None:
        model = ResNet50().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(iters):
            x = torch.randn(32, 3, 224, 224, device=device)
            y = torch.randint(0, 1000, (32,), device=device)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


def gpt2_step(device: str, iters: int = 2) -> Callable[[], None]:
    def run() -> None:
        model = GPT2().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        for _ in range(iters):
            idx = torch.randint(0, 50257, (8, 512), device=device)
            logits = model(idx)
            F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


WORKLOADS = {"resnet50": resnet50_step, "gpt2": gpt2_step}


def time_fake(name: str) -> tuple[float, int]:
    from xmem_engine.tracer import trace

    t0 = time.perf_counter()
    tr = trace(WORKLOADS[name]("cuda"), mode="fake")
    return time.perf_counter() - t0, sum(1 for e in tr.events if e.kind == "alloc")


def time_profiler(name: str) -> tuple[float, int]:
    """The paper's approach: real CPU execution under the profiler with memory profiling."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        WORKLOADS[name]("cpu")()
    events = prof.events()  # the profile is only useful once its events are read
    allocs = sum(1 for e in events if getattr(e, "cpu_memory_usage", 0) > 0)
    return time.perf_counter() - t0, allocs


def warm_up() -> float:
    """Import torch's fake-tensor machinery once (a one-time cost of the process)."""
    from xmem_engine.tracer import trace

    t0 = time.perf_counter()
    trace(lambda: torch.ones(4, device="cuda").sum(), mode="fake")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(WORKLOADS))
    ap.add_argument("--skip-profiler", action="store_true", help="time only the fake tracer")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print(f"one-time fake-tensor import / warm-up: {warm_up():.2f} s")
    for name in [args.only] if args.only else list(WORKLOADS):
        fake_s, fake_n = time_fake(name)
        line = f"{name}: xmem fake {fake_s:.2f} s ({fake_n} allocs)"
        if not args.skip_profiler:
            prof_s, prof_n = time_profiler(name)
            ratio = prof_s / fake_s if fake_s > 0 else math.inf
            line += f"; torch.profiler(profile_memory) real CPU {prof_s:.2f} s ({prof_n} alloc records); ratio {ratio:.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
