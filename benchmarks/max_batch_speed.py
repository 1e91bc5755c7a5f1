"""The largest batch that fits, three ways, on the ground-truth workloads: every value traced,
the two-trace batch family, and one trace with the batch a symbol (issue #34).

    .venv/bin/python benchmarks/max_batch_speed.py [--gpu A100-40GB] [--only resnet50 gpt2]

Each way runs in a fresh process (imports warm before the clock starts) on the same machine,
one after the other; per way it prints the answer, the values traced, the seconds of the
search and the process's peak RSS. The answers must agree: a way that differs is a bug.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"resnet50": ("benchmarks/workloads/resnet50.py", 64), "gpt2": ("benchmarks/workloads/gpt2.py", 8)}
WAYS = ("every value", "two-trace family", "symbolic")

_DRIVER = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from functools import partial
from xmem_engine.batch_family import symbolic_family
from xmem_engine.estimate import estimate_script, estimate_trace, max_batch, resolve_gpu
import xmem_engine.tracing  # noqa: F401 - imports before the clock
path, var, start, gpu, way = {path!r}, "batch_size", {start}, {gpu!r}, {way!r}
build = lambda v: estimate_script(path, gpu, overrides={{var: str(v)}}, mode="fake")
est = lambda tr: estimate_trace(tr, gpu)
symbolic = partial(symbolic_family, path, var, device=resolve_gpu(gpu).properties())
t0 = time.perf_counter()
if way == "every value":
    s = max_batch(build, start=start)
elif way == "two-trace family":
    s = max_batch(build, start=start, estimate_trace=est)
else:
    s = max_batch(build, start=start, estimate_trace=est, symbolic=symbolic)
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
print(json.dumps({{"value": s.value, "traced": s.traced, "seconds": seconds, "rss_gib": rss, "family": s.family}}))
"""


def run(path: str, start: int, gpu: str, way: str) -> dict:
    code = _DRIVER.format(root=str(ROOT), path=str(ROOT / path), start=start, gpu=gpu, way=way)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "benchmarks" / "workloads")
    if out.returncode:
        raise SystemExit(f"{path} ({way}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="A100-40GB")
    ap.add_argument("--only", nargs="*", default=list(SCRIPTS))
    args = ap.parse_args()
    print(f"| script | way | largest batch on {args.gpu} | values traced | seconds | peak RSS (GiB) |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        path, start = SCRIPTS[name]
        answers = set()
        for way in WAYS:
            r = run(path, start, args.gpu, way)
            answers.add(r["value"])
            traced = ", ".join(map(str, r["traced"]))
            print(f"| {name} | {way} | {r['value']} | {len(r['traced'])} ({traced}) | {r['seconds']:.1f} | "
                  f"{r['rss_gib']:.2f} |", flush=True)
        if len(answers) != 1:
            raise SystemExit(f"{name}: the ways disagree: {sorted(answers)}")


if __name__ == "__main__":
    main()
