"""The tracer's backward pass against autograd's own, op by op.

The tracer runs user code under dispatch modes, and PyTorch's C++ takes other branches
under a mode (``isTensorSubclassLike`` is true; see xmem_engine/tracing/kernels/grad_accumulation.py). This
script runs one backward pass of a model twice on the CPU: plainly under
``torch.profiler(profile_memory=True)`` (no mode: what a GPU run's engine does), and under
xmem's tracer (real mode). It prints, per aten op, how many allocations each made, and the
ops where they differ.

Reading the differences: the profiler counts an allocation at every level of nested ops
(``reshape`` -> ``clone`` -> ``empty_like``), and counts temporaries inside one kernel
(``contiguous`` inside ``embedding_dense_backward``), which the tracer sees as one op; 4-byte
allocations (Python scalars wrapped as CPU tensors, which stay on the host in a GPU run,
and the 0-d seed gradient ``ones_like(loss)``, which the tracer does count) are left out. Dropout is set to 0: the CPU and CUDA dropout kernels allocate differently
by design.

    .venv/bin/python benchmarks/backward_vs_engine.py                     # a small transformer
    .venv-bench/bin/python benchmarks/backward_vs_engine.py T5-small      # paper_runs.py's LMs
"""

from __future__ import annotations

import argparse
import bisect
import collections
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.model_zoo import TINY_LM  # noqa: E402
from xmem_engine.tracing import trace  # noqa: E402


def build(name: str) -> tuple[str, str]:
    """(source that defines ``model`` on the CPU, the one line that computes ``loss`` from it)."""
    if name == "tiny":
        return TINY_LM + "\ntorch.manual_seed(0)\nmodel = TinyLM()\n", "loss = model(ids[:, :16] % 100)"
    from benchmarks.paper_runs import LMS

    cls, cfg_cls, cfg = LMS[name]
    cfg = {k: (0.0 if "drop" in k else v) for k, v in cfg.items()}
    src = (f"import torch, transformers\nconfig = transformers.{cfg_cls}(**{cfg!r})\n"
           f"torch.manual_seed(0)\nmodel = transformers.{cls}(config)\nmodel.train()\n")
    return src, "loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids.clone()).loss"


def engine_counts(src: str, loss_line: str, ids: torch.Tensor) -> collections.Counter:
    ns = {"ids": ids}
    exec(src + loss_line, ns)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ns["loss"].backward()
    return allocating_ops(prof.profiler.kineto_results.events())


def allocating_ops(raw, more_than: int = 4) -> collections.Counter:
    """Per aten op, how many calls held more than ``more_than`` bytes more when they ended than when they
    began, on their own thread, in integer nanoseconds.

    ``prof.events()`` does the same in float microseconds since the epoch (about 256 ns of
    rounding at today's clock) over all threads, so a free just after an op ended could
    un-count it on a busy machine. Like it, a call whose only child is a call of the same
    name (``mul.Scalar`` -> ``mul.Tensor``) counts once.
    """
    mem = sorted((e.start_thread_id(), e.start_ns(), e.nbytes()) for e in raw
                 if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    keys = [(thread, t) for thread, t, _ in mem]
    ops = sorted((e for e in raw if e.name() != "[memory]" and e.device_type() == DeviceType.CPU),
                 key=lambda e: (e.start_thread_id(), e.start_ns(), -e.end_ns()))
    parent: dict[int, int | None] = {}
    children: dict[int, list[int]] = collections.defaultdict(list)
    stack: list[int] = []
    for i, e in enumerate(ops):
        while stack and (ops[stack[-1]].start_thread_id() != e.start_thread_id()
                         or ops[stack[-1]].end_ns() < e.end_ns()):
            stack.pop()
        parent[i] = stack[-1] if stack else None
        if stack:
            children[stack[-1]].append(i)
        stack.append(i)
    for i in range(len(ops)):  # in start order, so a chain of same-named calls folds from the top
        up = parent[i]
        if up is not None and ops[up].name() == ops[i].name() and children[up] == [i]:
            children[up] = children.pop(i, [])
            for child in children[up]:
                parent[child] = up
            del parent[i]
    counts: collections.Counter = collections.Counter()
    for i in parent:
        e = ops[i]
        if e.name().startswith("aten::"):
            lo = bisect.bisect_left(keys, (e.start_thread_id(), e.start_ns()))
            hi = bisect.bisect_right(keys, (e.start_thread_id(), e.end_ns()))
            if sum(nbytes for _, _, nbytes in mem[lo:hi]) > more_than:
                counts[e.name().split("::")[1]] += 1
    return counts


def tracer_counts(src: str, loss_line: str, ids: torch.Tensor) -> collections.Counter:
    code = src.replace("\nmodel.train()", "") + "model = model.cuda()\nmodel.train()\nids = ids.cuda()\n" + loss_line + "\nloss.backward()\n"
    tr = trace(code, {"ids": ids}, mode="real")
    return collections.Counter(e.op.split(".")[1] for e in tr.events
                               if e.kind == "alloc" and e.phase == "backward" and e.op.startswith("aten."))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="tiny", help="'tiny' or a language model of paper_runs.py")
    args = ap.parse_args(argv)
    src, loss_line = build(args.model)
    ids = torch.randint(3, 1000, (2, 128))
    engine, ours = engine_counts(src, loss_line, ids), tracer_counts(src, loss_line, ids)
    same = sorted(k for k in ours if engine.get(k) == ours[k])
    print(f"{args.model}: allocations in one backward pass, by op")
    print("  equal:", ", ".join(f"{k} {ours[k]}" for k in same))
    for k in sorted(set(engine) | set(ours)):
        if engine.get(k, 0) != ours.get(k, 0):
            print(f"  differ: {k}: engine {engine.get(k, 0)}, tracer {ours.get(k, 0)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
