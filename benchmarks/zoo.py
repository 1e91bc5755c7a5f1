"""Estimate every training script of a zoo folder (``--dir``, default ``benchmarks/zoo/``) as a new user would.

Each script is written as its author would write it for a GPU (``.cuda()``, ``device="cuda"``,
the libraries' own training loops); nobody adapted it to xmem. Each runs in a child process
under a host-memory cap (``XMEM_HOST_MEMORY``, default 8G: a small laptop), and the table
says, per script: the exit code of the estimate (0 fits, 3 does not fit, 1 failed), the
mode (``fake``; ``mixed``: fake, with some ops run for real; ``real``: the whole script
re-run on real tensors), how many value guesses fake mode made, the seconds, the child's
peak resident memory (``wait4``'s ``ru_maxrss``) and the estimated peak (the ``--json`` rows also
keep the bytes live at the peak by category, to hold against formulas). Each script starts with
an empty compile cache (``XMEM_CACHE_DIR``, a folder of its own), so its seconds are a first
estimate's; ``--warm`` runs it a second time on the cache the first filled (a notebook's re-run)
and adds those seconds, checking that the estimate is the same.

    .venv-bench/bin/python benchmarks/zoo.py [--gpu A100-80GB] [--only NAME ...] [--json OUT] [--markdown]
    .venv-ft/bin/python benchmarks/zoo.py --dir benchmarks/zoo/finetune [--only NAME ...]
    .venv-bench/bin/python benchmarks/zoo.py --show benchmarks/data/zoo-2026-12-01.jsonl --markdown

The scripts need the benchmark environment (``make bench-setup``: torchvision,
transformers, peft, accelerate, timm, diffusers); a script whose import is missing is
listed as skipped. ``--dir benchmarks/zoo/finetune`` is the fine-tuning zoo of issue #31
(bitsandbytes, peft, TRL, Liger, Triton, Lightning, torchao, ``generate()``); it needs
``.venv-ft``. Each script runs with its own folder as the working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ZOO = Path(__file__).resolve().parent / "zoo"
ROOT = ZOO.parent.parent
MARK = "ZOO-RESULT "


def run_one(path: str, gpu: str) -> dict:
    """In the child: estimate one script; the script's own output goes to stderr."""
    sys.path.insert(0, str(ROOT))
    from xmem_engine.estimate import estimate_script

    out = sys.stdout
    row: dict = {"script": Path(path).name}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            est = estimate_script(path, gpu)
    except ModuleNotFoundError as e:
        row.update(exit=None, error=f"skipped: {e}")
    except BaseException as e:  # noqa: BLE001 - every failure is a row of the table
        row.update(exit=1, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
    else:
        meta = est.trace.meta if est.trace is not None else {}
        mode = str(est.mode)
        if mode == "fake" and meta.get("real_ops"):
            mode = "mixed"
        row.update(exit=0 if est.fits else 3, mode=mode, guesses=sum(g["count"] for g in meta.get("guesses", ())),
                   guess_lines=len(meta.get("guesses", ())), fallback=meta.get("fallback", ""),
                   real_ops=meta.get("real_ops", {}), peak_device_bytes=est.peak_device_bytes,
                   capacity_bytes=est.capacity_bytes, events=est.n_events, breakdown=est.breakdown)
    print(MARK + json.dumps(row), file=out, flush=True)
    return row


def run_measured(cmd: list[str], env: dict, cwd: str, timeout: float) -> tuple[int, str, str, float, int | None]:
    """Run ``cmd``; return its exit code, stdout, the tail of stderr, wall seconds and peak RSS
    (``wait4``'s ``ru_maxrss``, bytes). Killed after ``timeout`` seconds."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        deadline = start + timeout
        status, usage = None, None
        while status is None:
            pid, st, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                status, usage = st, ru
            elif time.perf_counter() > deadline:
                p.kill()
                _, status, usage = os.wait4(p.pid, 0)
            else:
                time.sleep(0.05)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        rss = usage.ru_maxrss * 1024 if usage is not None else None
        return os.waitstatus_to_exitcode(status), out.read(), err.read()[-2000:], seconds, rss


def run_child(path: Path, gpu: str, host_memory: str, timeout: float, cache: str) -> dict:
    """Run :func:`run_one` in a child process (in the script's folder, with ``cache`` as xmem's
    compile cache); add its wall time and peak RSS."""
    env = dict(os.environ, XMEM_HOST_MEMORY=host_memory, PYTHONPATH=str(ROOT), XMEM_CACHE_DIR=cache)
    code, out, tail, seconds, rss = run_measured([sys.executable, __file__, "--one", str(path), "--gpu", gpu],
                                                 env, str(path.parent), timeout)
    rows = [json.loads(line[len(MARK):]) for line in out.splitlines() if line.startswith(MARK)]
    row = rows[-1] if rows else {"script": path.name, "exit": 1,
                                 "error": f"child ended with {code} and no result: {tail.strip().splitlines()[-1:]}"}
    row["seconds"] = round(seconds, 1)
    row["peak_rss_bytes"] = rss
    return row


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / (1 << 30):.2f}"


def table(rows: list[dict], markdown: bool) -> str:
    head = ["script", "exit", "mode", "guesses", "seconds", "peak RSS GiB", "estimate GiB", "note"]
    warm = any("warm_seconds" in r for r in rows)
    if warm:
        head.insert(5, "warm seconds")
    lines = []
    for r in rows:
        note = r.get("error") or r.get("fallback") or (", ".join(f"{k} x{v}" for k, v in r.get("real_ops", {}).items())
                                                       if r.get("real_ops") else "")
        lines.append([r["script"].removesuffix(".py"), "" if r.get("exit") is None else str(r["exit"]),
                      r.get("mode", ""), str(r.get("guesses", "")), f"{r['seconds']:.1f}",
                      _gib(r.get("peak_rss_bytes")), _gib(r.get("peak_device_bytes")), note[:90]])
        if warm:
            lines[-1].insert(5, f"{r['warm_seconds']:.1f}" if "warm_seconds" in r else "")
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*line) for line in lines])


def summary(rows: list[dict]) -> str:
    ran = [r for r in rows if r.get("exit") is not None]
    estimated = [r for r in ran if r["exit"] in (0, 3)]
    no_real = [r for r in estimated if r.get("mode") != "real"]
    rss = max((r["peak_rss_bytes"] or 0 for r in ran), default=0)
    return (f"{len(estimated)} of {len(ran)} scripts estimated (exit 0 or 3), {len(no_real)} without a whole-script "
            f"real-mode run; {len(rows) - len(ran)} skipped; largest peak RSS {_gib(rss)} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=ZOO,
                    help="folder of scripts to estimate (default benchmarks/zoo; benchmarks/zoo/finetune: issue #31)")
    ap.add_argument("--gpu", default="A100-80GB")
    ap.add_argument("--host-memory", default="8G", help="XMEM_HOST_MEMORY for each script (default 8G)")
    ap.add_argument("--only", nargs="*", help="script names (without .py) to run")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per script")
    ap.add_argument("--warm", action="store_true",
                    help="run each script a second time on the compile cache its first run filled")
    ap.add_argument("--json", help="write the rows as JSON lines here")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--show", metavar="FILE", help="print the table of an earlier --json file, run nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run_one(args.one, args.gpu)
        return
    if args.show:
        with open(args.show) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        print(table(rows, args.markdown))
        print()
        print(summary(rows))
        return
    folder = args.dir.resolve()
    if not folder.is_dir():
        ap.error(f"--dir {args.dir}: not a folder")
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        ap.error(f"--dir {args.dir}: no scripts (*.py not starting with _) in it")
    if args.only:
        unknown = set(args.only) - {p.stem for p in scripts}
        if unknown:
            ap.error(f"--only: no script named {', '.join(sorted(unknown))} in {folder}")
        scripts = [p for p in scripts if p.stem in set(args.only)]
    rows = []
    for p in scripts:
        with tempfile.TemporaryDirectory(prefix="xmem-zoo-cache-") as cache:
            row = run_child(p, args.gpu, args.host_memory, args.timeout, cache)
            if args.warm and row.get("exit") in (0, 3):
                again = run_child(p, args.gpu, args.host_memory, args.timeout, cache)
                row["warm_seconds"], row["warm_peak_rss_bytes"] = again["seconds"], again["peak_rss_bytes"]
                if again.get("peak_device_bytes") != row.get("peak_device_bytes"):
                    row["error"] = (f"the warm run's estimate differs: {_gib(again.get('peak_device_bytes'))} GiB, "
                                    f"{again.get('error', '')}")
        rows.append(row)
        print(f"{row['script']}: exit {row.get('exit')} {row.get('mode', '')} {row['seconds']:.1f} s "
              f"{_gib(row.get('peak_rss_bytes'))} GiB RSS {row.get('error', '')}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows, args.markdown))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
