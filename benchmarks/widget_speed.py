"""Throughput of the notebook widget: build it for a 100,000-tensor trace, and switch GPUs.

    .venv/bin/python benchmarks/widget_speed.py [--tensors 100000]

The trace is synthetic but shaped like training: parameters and optimizer state that live
throughout, then per iteration a forward pass (activations kept, temporaries freed at once),
a backward pass (activations freed in reverse, gradients made) and an optimizer step. Sizes
mix many small tensors with a few large ones, as real models do.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xmem_engine.trace import Trace, TraceEvent  # noqa: E402


def synthetic_trace(n_tensors: int = 100_000, iterations: int = 2, seed: int = 0) -> Trace:
    """A training-shaped trace with about ``n_tensors`` allocations."""
    rng = random.Random(seed)
    ev: list[TraceEvent] = []
    next_id = 0

    def alloc(nbytes: int, cat: str, module: str, phase: str, it: int, op: str = "aten.mm.default") -> int:
        nonlocal next_id
        next_id += 1
        ev.append(TraceEvent("alloc", id=next_id, bytes=nbytes, category=cat, op=op, module=module,
                             phase=phase, dtype="float32", shape=(nbytes // 4,), source="<cell>:7",
                             iteration=it))
        return next_id

    def free(i: int, phase: str, it: int) -> None:
        ev.append(TraceEvent("free", id=i, phase=phase, iteration=it))

    layers = 48
    n_params = max(4, n_tensors // 20)
    params = [alloc(rng.choice([4096, 65536, 1 << 20, 4 << 20]), "parameter", f"layers.{k % layers}", "other", -1,
                    "aten._to_copy.default") for k in range(n_params)]
    per_it = max(10, (n_tensors - 3 * n_params) * 3 // (2 * iterations))
    for it in range(iterations):
        ev.append(TraceEvent("iteration", iteration=it, phase="forward"))
        ev.append(TraceEvent("phase", phase="forward", iteration=it))
        acts = []
        for k in range(per_it // 3):
            mod = f"layers.{(k * layers) // max(1, per_it // 3)}"
            big = rng.random() < 0.02
            acts.append(alloc((16 << 20) if big else rng.choice([512, 2048, 8192, 65536]), "activation", mod,
                              "forward", it, "aten.relu.default"))
            t = alloc(rng.choice([1024, 4096, 1 << 20]), "temporary", mod, "forward", it)
            free(t, "forward", it)
        ev.append(TraceEvent("phase", phase="backward", iteration=it))
        grads = []
        for k, a in enumerate(reversed(acts)):
            if it == 0 and k < n_params:
                grads.append(alloc(4096, "gradient", f"layers.{k % layers}", "backward", it))
            free(a, "backward", it)
        ev.append(TraceEvent("phase", phase="optimizer", iteration=it))
        if it == 0:
            for p in params:
                alloc(4096, "optimizer_state", "", "optimizer", it, "aten.zeros_like.default")
    return Trace(events=ev, mode="fake", seconds=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=100_000)
    args = ap.parse_args(argv)

    from xmem_engine.estimate import estimate_trace
    from xmem_jupyter.widget import XmemWidget

    tr = synthetic_trace(args.tensors)
    n_alloc = sum(e.kind == "alloc" for e in tr.events)
    t0 = time.perf_counter()
    est = estimate_trace(tr, "A100-SXM4-40GB")
    t1 = time.perf_counter()
    w = XmemWidget(est)
    t2 = time.perf_counter()
    w.gpu_dropdown.value = "T4"  # same cuBLAS workspace size: the flame chart is kept
    t3 = time.perf_counter()
    sim_t4, upd_t4 = w.last_switch.simulate_s, w.last_switch.update_s
    w.gpu_dropdown.value = "H100-SXM-80GB"  # other workspace size: the flame chart is rebuilt
    t4 = time.perf_counter()
    print(f"trace: {n_alloc:,} tensors, {len(tr.events):,} events; flame: {w.flame.n_bars:,} bars + "
          f"{w.flame.n_aggregated:,} tensors summed into {len(w.flame.columns['left']):,} rectangles")
    print(f"first simulation (not the widget):   {t1 - t0:7.3f} s")
    print(f"build widget (flame + timeline):     {t2 - t1:7.3f} s")
    print(f"GPU switch A100 -> T4:               {t3 - t2:7.3f} s  (re-simulate {sim_t4:.3f} s, "
          f"redraw {upd_t4:.3f} s)")
    print(f"GPU switch T4 -> H100 (new flame):   {t4 - t3:7.3f} s  (re-simulate "
          f"{w.last_switch.simulate_s:.3f} s, redraw {w.last_switch.update_s:.3f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
