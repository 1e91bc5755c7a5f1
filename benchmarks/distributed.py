"""Per-rank memory of distributed training: xmem's estimates of torchrun scripts beside the
ZeRO paper's formulas for model states.

Scripts (``benchmarks/distributed/``, written as for ``torchrun``): ``train_ddp.py``
(DistributedDataParallel, gradients as bucket views) and ``train_fsdp2.py`` (``fully_shard``
per block and on the root, with and without ``reshard_after_forward``), a Llama-style model of
the 1B or 8B shape, AdamW, fp32 parameters, batch 1 x 2048 tokens, two steps. Each is
estimated for one H100-80GB rank at world sizes 1, 2 and 8, in fake mode, in a fresh process.

Model states (parameters, gradients, optimizer states) are read from the trace when the last
optimizer step ends, and compared with Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models" (SC 2020), section 5: with Psi parameters, mixed-precision
Adam (K = 12) takes 2Psi + 2Psi + K Psi per rank unsharded (DDP), and (2 + 2 + K) Psi / N with
everything sharded over N ranks (stage 3, which FSDP is). Here parameters and gradients are
fp32 and AdamW keeps two fp32 moments: 4Psi + 4Psi + 8Psi, the same 16Psi in other parts.
Psi is counted from the config's shapes (``llama.n_params``).

Run: ``.venv/bin/python benchmarks/distributed.py [--sizes 1b,8b] [--worlds 1,2,8] [--json FILE]``.
Prints one row per (script, size, world): the per-rank peak, the model states measured, the
formula's figure and their difference, seconds and the estimate's peak host RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks" / "distributed"
sys.path.insert(0, str(HERE))

GPU = "H100-SXM-80GB"
GiB = 1 << 30
VARIANTS = [  # (label, script, --set values, sharded)
    ("DDP", "train_ddp.py", {}, False),
    ("FSDP2", "train_fsdp2.py", {"reshard_after_forward": "True"}, True),
    ("FSDP2 no reshard", "train_fsdp2.py", {"reshard_after_forward": "False"}, True),
]
MODEL_STATES = ("parameter", "gradient", "optimizer_state")

# One estimate in a fresh process: its JSON, and the model states at the last step's end.
CHILD = r"""
import json, resource, sys
from xmem_engine.estimate import estimate_script
from xmem_engine.tracing.shims.distributed import World
script, gpu, world, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
est = estimate_script(script, gpu, overrides=overrides, mode="fake", world=World(world))
live, states, in_step = {}, {}, False
for e in est.trace.events:
    if e.kind == "alloc":
        live[e.id] = e
    elif e.kind == "free":
        live.pop(e.id, None)
    elif e.kind == "phase":
        if in_step and e.phase != "optimizer":
            states = {}
            for a in live.values():
                states[str(a.category)] = states.get(str(a.category), 0) + a.bytes
        in_step = e.phase == "optimizer"
print(json.dumps({"peak": est.peak_device_bytes, "fits": est.fits, "mode": est.mode,
                  "seconds": est.seconds, "states": states, "breakdown": est.breakdown,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def formula(psi: int, world: int, sharded: bool) -> int:
    """ZeRO's model states per rank (bytes): 16 Psi unsharded, 16 Psi / N at stage 3."""
    return 16 * psi // world if sharded else 16 * psi


def run_one(script: str, world: int, overrides: dict) -> dict:
    ov = {k: v for k, v in overrides.items()}
    with tempfile.TemporaryFile() as err:
        p = subprocess.run([sys.executable, "-c", CHILD, str(HERE / script), GPU, str(world), json.dumps(ov)],
                           stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
        if p.returncode != 0:
            err.seek(0)
            return {"error": err.read().decode()[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1b,8b")
    ap.add_argument("--worlds", default="1,2,8")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON lines")
    args = ap.parse_args()
    from llama import n_params

    import torch

    print(f"# xmem distributed, {platform.node() and 'vm'}: {os.cpu_count()} cores, torch {torch.__version__}, "
          f"one {GPU} rank per estimate, fake mode")
    print(f"{'script':18s} {'model':5s} {'N':>2s} {'peak GiB':>9s} {'fits':>4s} {'states GiB':>10s} "
          f"{'formula GiB':>11s} {'diff':>7s} {'comm GiB':>8s} {'s':>5s} {'RSS GiB':>7s}")
    rows = []
    worst = 0.0
    for size in args.sizes.split(","):
        psi = n_params(size)
        for label, script, sets, sharded in VARIANTS:
            if not (HERE / script).exists():
                continue
            for world in [int(w) for w in args.worlds.split(",")]:
                r = run_one(script, world, {"size": repr(size), **sets})
                row = {"script": label, "size": size, "world": world, **r}
                rows.append(row)
                if "error" in r:
                    print(f"{label:18s} {size:5s} {world:2d} failed: {r['error'].strip().splitlines()[-1]}")
                    continue
                states = sum(r["states"].get(k, 0) for k in MODEL_STATES)
                want = formula(psi, world, sharded)
                diff = states / want - 1
                worst = max(worst, abs(diff))
                row.update(model_states=states, formula=want, diff=diff)
                print(f"{label:18s} {size:5s} {world:2d} {r['peak'] / GiB:9.2f} {'yes' if r['fits'] else 'no':>4s} "
                      f"{states / GiB:10.2f} {want / GiB:11.2f} {diff:+7.2%} "
                      f"{r['breakdown'].get('communication', 0) / GiB:8.2f} {r['seconds']:5.1f} "
                      f"{r['maxrss_kb'] / 2**20:7.2f}")
    print(f"model states vs the formula: largest difference {worst:.2%} (target: within 2%)")
    print("states: parameters + gradients + optimizer states live when the last optimizer step ends; "
          "comm: communication buffers live at the peak; RSS: the estimate process's peak (ru_maxrss)")
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
