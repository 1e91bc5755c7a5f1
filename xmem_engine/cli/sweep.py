"""``xmem sweep``: a grid of estimates (scripts x ``--set`` values x GPUs x allocator
settings) on all cores or a Ray cluster (:mod:`xmem_engine.sweep`).

Kept beside ``cli.py``, whose conventions it follows: every input checked before anything is
traced (exit 2). A point whose script fails is a row with its error, not the end of the
sweep: exit 1 says some did; 0 that every point ran (fitting or not); 130 that Ctrl-C
stopped it, with the finished rows kept in ``--out``.
"""

from __future__ import annotations

import sys

from xmem_engine.cli.common import EXIT_OK, EXIT_USER_CODE, InputError, add_trace_flags

EXIT_INTERRUPTED = 130  # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)


def add_sweep(sub) -> None:
    p = sub.add_parser(
        "sweep", help="estimate a grid: scripts x --set values x GPUs x allocator settings, on all cores or Ray",
        description="Estimate every combination of SCRIPTs, --set values, --gpu and --alloc-conf, and with "
        "--max-batch the largest value of that variable that fits per script and GPU. One trace per script and "
        "--set values, re-simulated for every GPU and allocator setting (milliseconds each; the trace is made "
        "for the first --gpu; --exact: a trace per GPU). A --set variable of 3 or more whole numbers (the "
        "batch size) is traced once with the variable as a symbol, every value from that trace (a value "
        "past a test the step makes of it gets a trace of its own; where it cannot be a symbol, the smallest "
        "and largest values are traced and the values between are those two traces' family); their rows' "
        "notes say so; --exact traces every value. Rows go to --out as they finish (fits, peak, headroom, mode, seconds, notes; a "
        "failed point with its error); run the same command again to resume: points already in --out are "
        "skipped. Exit codes: 0 every point ran, 1 some point failed (see its row), 2 bad input, 130 "
        "interrupted (finished rows kept).")
    p.add_argument("scripts", nargs="+", metavar="SCRIPT", help="training scripts written for CUDA")
    p.add_argument("--gpu", dest="gpus", action="append", default=[], metavar="GPU[,GPU...]",
                   help="target GPUs (repeatable, or comma-separated; see `xmem gpus`); the trace is made for "
                   "the first; default: $XMEM_GPU or A100-SXM4-40GB")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="VAR=V1,V2,...",
                   help="values of a top-level assignment of the scripts to sweep (repeatable: the cross "
                   "product); commas inside brackets or quotes do not split")
    p.add_argument("--alloc-conf", dest="alloc_confs", action="append", default=None, metavar="STR",
                   help="a PYTORCH_CUDA_ALLOC_CONF setting to sweep (repeatable: each is one setting, "
                   "commas and all); default: $PYTORCH_CUDA_ALLOC_CONF or PyTorch's defaults")
    p.add_argument("--max-batch", metavar="VAR",
                   help="also find the largest value of the scripts' top-level VAR that fits, per script, GPU, "
                   "allocator setting and other --set values (rows of kind max_batch)")
    p.add_argument("--exact", action="store_true",
                   help="trace for every GPU instead of re-simulating the first GPU's trace: a trace per GPU, for "
                   "attention, whose backend the trace picks by the GPU's architecture (rows re-simulated for "
                   "another architecture say so in their notes); and every value of a whole-number --set "
                   "variable")
    p.add_argument("--safe", action="store_true",
                   help="--max-batch judges fitting by the calibrated range's high end")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="results: .csv, .json or .jsonl (JSON Lines, one row a line), or .parquet (needs pyarrow)")
    p.add_argument("--force", action="store_true", help="start --out over instead of resuming it")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine (default); ray: tasks on a Ray cluster "
                   "(pip install 'xmem[ray]'; nodes need xmem and torch, not your files)")
    p.add_argument("--workers", type=int, metavar="N", help="local engine: worker processes (default: all cores)")
    p.add_argument("--address", metavar="ADDR",
                   help="ray engine: the cluster (auto, ray://host:10001, host:6379); default: Ray's own "
                   "($RAY_ADDRESS, else a cluster running here, else a new local one)")
    p.add_argument("--world-size", dest="world_sizes", metavar="N[,N...]",
                   help="scripts written for torchrun: estimate rank 0 of each of these world sizes (re-traced "
                   "per size)")
    add_trace_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args) -> int:
    import os

    from xmem_engine.inputs import default_gpus
    from xmem_engine.sweep import SweepInputError, SweepInterrupted, parse_set, sweep

    gpus = [g.strip() for item in args.gpus for g in item.split(",")] or default_gpus()
    for script in args.scripts:
        if os.path.exists(args.out) and os.path.exists(script) and os.path.samefile(args.out, script):
            raise InputError(f"--out {args.out}: that is the input {script}; write the output to another file")
    worlds = None
    if args.world_sizes:
        try:
            worlds = [int(w) for w in args.world_sizes.split(",")]
        except ValueError:
            raise InputError(f"--world-size {args.world_sizes}: give whole numbers, e.g. --world-size 1,2,8") from None
    from xmem_engine.gpus.cudnn import WorkspaceTableError, check_setting

    try:
        check_setting()  # before any trace: a bad XMEM_CUDNN_WORKSPACES would fail every point
    except WorkspaceTableError as e:
        raise InputError(str(e)) from None
    try:
        settings = parse_set(args.overrides)
        rows = sweep(args.scripts, gpus, settings, args.alloc_confs, max_batch=args.max_batch, mode=args.mode,
                     iterations=args.iterations, torch_version=args.torch_version, safe=args.safe, exact=args.exact,
                     world_sizes=worlds, out=args.out, fresh=args.force, engine=args.engine, workers=args.workers,
                     address=args.address,
                     progress=not args.quiet)
    except SweepInputError as e:
        raise InputError(str(e)) from None
    except SweepInterrupted as e:
        print(f"xmem sweep: interrupted: {len(e.rows)} new row{'s' if len(e.rows) != 1 else ''} kept in "
              f"{args.out}, {e.remaining} point{'s' if e.remaining != 1 else ''} not run; run the same command "
              "again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(summary(rows, args.out))
    return EXIT_USER_CODE if any(r.status == "failed" for r in rows) else EXIT_OK


def summary(rows: list, out: str) -> str:
    """A few lines: per script, GPU and allocator setting, how many points fit, the largest
    fitting value found, and the first error of the failed points."""
    gib = 1 << 30
    lines = []
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.script, r.gpu, r.alloc_conf, r.world_size), []).append(r)
    confs = {r.alloc_conf for r in rows}
    for (script, gpu, conf, world), rs in groups.items():
        points = [r for r in rs if r.kind == "point"]
        ok = [r for r in points if r.status == "ok"]
        fit = [r for r in ok if r.fits]
        text = (f"{script} on {gpu}" + (f" x {world} ranks" if world else "")
                + (f" [{conf or 'defaults'}]" if len(confs) > 1 else "") + ":")
        if points:
            text += f" {len(fit)}/{len(points)} points fit"
        if ok:
            peaks = [r.peak_device_bytes / gib for r in ok]
            text += f", peak {min(peaks):.2f}-{max(peaks):.2f} GiB"
        for r in rs:
            if r.kind == "max_batch":
                where = "".join(f" {k}={v}" for k, v in r.settings.items())
                text += (f"; largest {r.variable}{' (' + where.strip() + ')' if where else ''}: "
                         + (r.answer if r.status == "ok" else "failed"))
        failed = [r for r in rs if r.status == "failed"]
        if failed:
            text += f"; {len(failed)} failed ({failed[0].error})"
        lines.append(text)
    lines.append(f"{len(rows)} rows in {out}")
    return "\n".join(lines)
