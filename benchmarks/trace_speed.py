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
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The same plain-torch models the GPU ground-truth runs use.
from benchmarks.workloads.models import GPT2, ResNet50  # noqa: E402


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
    from xmem_engine.tracing import trace

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
    from xmem_engine.tracing import trace

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
