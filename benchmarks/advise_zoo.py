"""``xmem advise`` on the zoo's scripts that do not fit a GPU: what each lever measures.

For each script of ``benchmarks/zoo/`` whose estimate (``benchmarks/data/zoo-*.jsonl``) is
above 8 GiB, the GPU is the largest of a few common ones that it does not fit (a near miss,
where a lever can matter); the script's batch variable, where it has a top-level one, adds
gradient accumulation and a smaller batch. Each runs ``xmem advise --json`` in a child process
under a host-memory cap, and the table shows, per script, the baseline, each lever's measured
peak (GiB; ``-`` not applicable, ``!`` failed) and the cheapest change that fits.

    .venv-bench/bin/python benchmarks/advise_zoo.py [--only NAME ...] [--json OUT] [--markdown]
    .venv-bench/bin/python benchmarks/advise_zoo.py --show benchmarks/data/advise_zoo-2026-12-01.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.zoo import ROOT, ZOO, run_measured

# bf16-capable GPUs only (compute capability 8.0+): a script written for bf16 raises on a T4, as it would there
GPUS = ["RTX-4060-8GB", "RTX-3060-12GB", "L4", "A100-SXM4-40GB", "A100-SXM4-80GB"]
SHORT = {"expandable segments": "expand", "zero_grad(set_to_none=True)": "set_none", "for-loop optimizer": "for-loop",
         "fused optimizer": "fused", "garbage-collection threshold": "gc 0.6", "activation checkpointing": "ckpt",
         "Adafactor instead of Adam(W)": "adafactor", "gradient accumulation x2": "accum x2",
         "gradient accumulation x4": "accum x4", "largest batch that fits": "largest batch",
         "smaller batch": "largest batch"}  # the last lever's name before 2026-12-01


def latest_zoo() -> dict[str, dict]:
    files = sorted((ROOT / "benchmarks" / "data").glob("zoo-*.jsonl"))
    rows = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    return {r["script"]: r for r in rows}


def target_gpu(peak: int) -> str | None:
    """The largest of GPUS that ``peak`` does not fit, by the catalog's capacity."""
    from xmem_engine.gpus import get_gpu

    below = [g for g in GPUS if get_gpu(g).total_memory_bytes < peak]
    return below[-1] if below else None


def batch_var(path: Path) -> str | None:
    from xmem_engine.overrides import parse_script, top_level_literals

    values = top_level_literals(parse_script(path))
    names = [k for k, v in values.items() if "batch" in k.lower() and isinstance(v, int) and not isinstance(v, bool)
             and v >= 2]
    return names[0] if names else None


def run(path: Path, gpu: str, var: str | None, host_memory: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "xmem_engine", "advise", str(path), "--gpu", gpu, "--json"]
    if var:
        cmd += ["--batch-var", var]
    env = dict(os.environ, XMEM_HOST_MEMORY=host_memory, PYTHONPATH=str(ROOT))
    code, out, tail, seconds, rss = run_measured(cmd, env, str(ZOO), timeout)
    row: dict = {"script": path.name, "gpu": gpu, "batch_var": var, "exit": code, "seconds": round(seconds, 1),
                 "peak_rss_bytes": rss}
    try:
        row["advice"] = json.loads(out)
    except (ValueError, IndexError):
        row["error"] = tail.strip().splitlines()[-1:] or [f"exit {code}"]
    return row


COLUMNS = ["expandable segments", "zero_grad(set_to_none=True)", "for-loop optimizer", "fused optimizer",
           "garbage-collection threshold", "autocast", "activation checkpointing", "Adafactor instead of Adam(W)",
           "gradient accumulation x2", "gradient accumulation x4", "largest batch that fits"]


def _cell(levers: dict[str, dict], name: str) -> str:
    lv = next((v for k, v in levers.items() if k == name or (name == "autocast" and k.startswith("autocast"))), None)
    if lv is None:
        return ""
    if lv["error"]:
        return "!"
    if not lv["applicable"]:
        return "-"
    return f"{lv['peak_device_bytes'] / 2**30:.2f}" + ("" if lv["fits"] else "*")


def table(rows: list[dict], markdown: bool) -> str:
    """GiB per lever; ``*`` still does not fit, ``-`` not applicable, ``!`` failed."""
    head = ["script", "GPU", "GiB", "baseline", *(SHORT.get(c, c) for c in COLUMNS), "cheapest change that fits",
            "s", "RSS GiB"]
    lines = []
    for r in rows:
        a = r.get("advice") or {}
        by = {lv["lever"]: lv for lv in a.get("levers", [])}
        if not by:
            lines.append([r["script"].removesuffix(".py"), r["gpu"], "", "", *([""] * len(COLUMNS)),
                          str(a.get("message") or r.get("error", ""))[:60], f"{r['seconds']:.0f}", ""])
            continue
        lines.append([r["script"].removesuffix(".py"), r["gpu"], f"{a['capacity_bytes'] / 2**30:.1f}",
                      f"{a['peak_device_bytes'] / 2**30:.2f}", *(_cell(by, c) for c in COLUMNS),
                      "(fits already)" if a["fits"] else " + ".join(a["combination"]) or "none", f"{r['seconds']:.0f}",
                      f"{(r['peak_rss_bytes'] or 0) / 2**30:.2f}"])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*line) for line in lines])


def summary(rows: list[dict]) -> str:
    done = [r for r in rows if (r.get("advice") or {}).get("levers")]
    fitted = [r for r in done if r["advice"]["combination"]]
    failed = sum(1 for r in done for lv in r["advice"]["levers"] if lv["error"])
    return (f"{len(done)} of {len(rows)} scripts advised; a change that fits found for {len(fitted)}; "
            f"{failed} lever measurements failed; largest peak RSS "
            f"{max((r['peak_rss_bytes'] or 0) for r in rows) / 2**30 if rows else 0:.2f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host-memory", default="8G")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per script")
    ap.add_argument("--json", help="append the rows as JSON lines here")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--show", metavar="FILE", help="print the table of an earlier --json file, run nothing")
    args = ap.parse_args()
    if args.show:
        rows = [json.loads(line) for line in Path(args.show).read_text().splitlines() if line.strip()]
    else:
        rows = []
        for name, z in sorted(latest_zoo().items()):
            peak = z.get("peak_device_bytes") or 0
            gpu = target_gpu(peak)
            if gpu is None or (args.only and name.removesuffix(".py") not in args.only):
                continue
            path = ZOO / name
            row = run(path, gpu, batch_var(path), args.host_memory, args.timeout)
            rows.append(row)
            print(f"{name} on {gpu}: exit {row['exit']} {row['seconds']:.0f} s", file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(table(rows, args.markdown))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
