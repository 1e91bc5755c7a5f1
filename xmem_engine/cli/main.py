"""The ``xmem`` command line: one subcommand per job, all over the same engine.

Exit codes, the same for every subcommand: 0 success ("fits"), 3 "does not fit" (or a
conformance check that did not match), 2 bad input (checked before any tracing starts), 1 the
user's script failed (its own ``sys.exit(n != 0)`` included) or xmem itself failed. With
``--json`` a failure prints one JSON object too (``ok``, ``error``, ``message``, ``exit_code``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys

from xmem_engine.cli.common import (  # noqa: F401  (REPORT_HINT and the errors: part of the CLI's API)
    EXIT_OK,
    EXIT_USER_CODE,
    EXIT_USAGE,
    EXIT_MISMATCH,
    MAX_CAPACITY,
    REPORT_HINT,
    CLIError,
    InputError,
    ScriptFailed,
    HostMemoryShort,
    Interrupted,
    OutputFailed,
    XmemFailed,
    check_environment,
    check_output,
    running_script,
    print_json,
    script_inputs,
    batch_value,
    check_script,
    alloc_conf_arg,
    add_target_flags,
    add_trace_flags,
)
from xmem_engine.trace import MODES

class _Parser(argparse.ArgumentParser):
    """argparse, keeping its last error's message: with ``--json`` a usage error is one JSON
    object on stdout too, as every other failure is."""

    last_error = ""

    def error(self, message: str):  # type: ignore[override]
        _Parser.last_error = f"{self.prog}: error: {message}"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xmem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``: its words; None: ``sys.argv``, as the ``xmem`` command, which
    then runs a script command in a child process, see :func:`_in_child`)."""
    parser = build_parser()
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare "--" is the script's own command line (xmem estimate train.py -- 50 10).
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    try:
        args = parser.parse_args(own)
        if script_args and not hasattr(args, "script_args"):
            parser.error(f"xmem {args.command} takes no script arguments after --")
    except SystemExit as e:
        if e.code == EXIT_USAGE and "--json" in own:
            print_json(InputError(_Parser.last_error).json())
        raise
    if hasattr(args, "script_args"):
        args.script_args = script_args
    if argv_given is None and args.command in _SCRIPT_COMMANDS and hasattr(os, "fork"):
        return _in_child(lambda: _run(args), args)
    return _run(args)


# Commands that run the user's script: from the command line, in a child process whose end
# xmem always sees (the script may kill its own process, or the interpreter may die).
_SCRIPT_COMMANDS = ("estimate", "advise", "trace")


def _run(args) -> int:
    try:
        try:
            check_environment()
            return args.func(args)
        except KeyboardInterrupt:
            raise _said(args, Interrupted("interrupted (Ctrl-C); nothing was written after it")) from None
        except MemoryError:
            raise _said(args, HostMemoryShort("this machine ran out of host memory; nothing was changed. "
                                              "Free memory, or estimate in fake mode (--mode fake)")) from None
    except CLIError as e:
        if isinstance(e, InputError):
            print(f"xmem {args.command}: error: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # stdout still carries one JSON object
            print_json(e.json())
        return e.code


def _said(args, err: CLIError) -> CLIError:
    """``err``, after saying it on stderr (as the script's failures are said where they are raised)."""
    print(f"xmem {args.command}: {err}", file=sys.stderr)
    return err


def _in_child(run, args) -> int:
    """``run()`` in a forked child; its exit code, or the contract's answer when the child did
    not get to give one (issue #36): a script that kills its own process (a signal, an abort
    in a native library) gets exit 1 and, with ``--json``, one JSON object saying how it
    ended, where a scheduler would have read a signal's status or nothing at all. After the
    child has answered, its stdout goes to stderr: what libraries print at exit cannot follow
    the JSON object. Ctrl-C reaches both: the child answers "interrupted"; the parent waits."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        code = EXIT_USER_CODE
        try:
            code = run()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(write_end, bytes([code & 0xFF]))
            os.close(write_end)
            os.dup2(2, 1)
        return code
    os.close(write_end)
    interrupted = []
    old = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        _, status = os.waitpid(pid, 0)  # (a signal handler that returns: PEP 475 retries the wait)
        answer = os.read(read_end, 1)
    finally:
        signal.signal(signal.SIGINT, old)
        os.close(read_end)
    if answer:
        return answer[0]
    if interrupted:
        err: CLIError = Interrupted("interrupted (Ctrl-C)")
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        err = ScriptFailed(f"the script ended the process with signal {sig} ({name}) before xmem could "
                           "answer" + (" (killed: out of host memory?)" if sig == signal.SIGKILL else ""),
                           status=-sig)
    else:
        err = ScriptFailed(f"the script ended the process with status {os.WEXITSTATUS(status)} before "
                           "xmem could answer", status=os.WEXITSTATUS(status))
    _said(args, err)
    if getattr(args, "json", False):
        print_json(err.json())
    return err.code


# --------------------------------------------------------------------------- replay
def _add_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recorded torch.cuda memory snapshot through the allocator simulator",
        description="Replay the requests of a snapshot recorded with torch.cuda.memory._record_memory_history "
        "and _dump_snapshot. --check compares every decision with the real allocator's; --alloc-conf "
        "re-simulates the same requests under other allocator settings.",
    )
    p.add_argument("snapshot", help="a .pickle written by torch.cuda.memory._dump_snapshot()")
    p.add_argument("--check", action="store_true",
                   help="compare block addresses, cudaMalloc calls / page maps, out-of-memory errors and the final "
                   "layout; exit 3 on any mismatch")
    p.add_argument("--device", default="0", type=_device_arg, metavar="N|all",
                   help="the device whose trace to replay (default 0), or all: one report per device under "
                   "\"devices\"")
    p.add_argument("--alloc-conf", metavar="STR",
                   help='PYTORCH_CUDA_ALLOC_CONF to re-simulate with, e.g. "expandable_segments:True"')
    p.add_argument("--snapshot-out", metavar="FILE", help="write the simulated run as a snapshot pickle")
    p.add_argument("--force", action="store_true", help="overwrite an existing --snapshot-out file")
    p.set_defaults(func=_cmd_replay)


def _device_arg(text: str) -> str | int:
    """``--device``: a device index or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a device index (0, 1, ...) or all, got {text!r}")
    return n


def _cmd_replay(args) -> int:
    from xmem_engine.simulation.alloc_conf import AllocConfError
    from xmem_engine.simulation.replay import recorded_devices, replay_snapshot
    from xmem_engine.simulation.snapshot import SnapshotFormatError, UnsafeSnapshotError, load_snapshot

    cfg = alloc_conf_arg(args.alloc_conf)
    check_output(args.snapshot_out, "--snapshot-out", args.force, (args.snapshot,))
    try:
        snap = load_snapshot(args.snapshot)
    except (FileNotFoundError, SnapshotFormatError, UnsafeSnapshotError) as e:
        raise InputError(str(e)) from None
    present = recorded_devices(snap)
    if args.device == "all":
        devices = present or [0]
    else:
        if args.device != 0 and args.device not in present:
            raise InputError(f"{args.snapshot}: no events or segments for device {args.device} "
                             f"(it has device{'s' if len(present) != 1 else ''} "
                             f"{', '.join(map(str, present)) or 'none'})")
        devices = [args.device]
    reports = []
    try:
        for device in devices:
            recorded = replay_snapshot(snap, device=device, check=args.check or cfg is None)
            other = replay_snapshot(snap, config=cfg, device=device, check=False) if cfg is not None else None
            out = recorded.to_json()
            if other is not None:
                out["what_if"] = {
                    "alloc_conf": cfg.source,
                    "peak_allocated_bytes": other.peak_allocated_bytes,
                    "peak_reserved_bytes": other.peak_reserved_bytes,
                    "reserved_saved_bytes": recorded.peak_reserved_bytes - other.peak_reserved_bytes,
                }
            reports.append((recorded, out))
        if args.snapshot_out:
            from xmem_engine.simulation.snapshot import dump_snapshot

            dump_snapshot(_simulated_devices(snap, cfg, devices), args.snapshot_out)
    except AllocConfError as e:
        raise InputError(f"{args.snapshot}: its allocator_settings: {e}") from None
    except (ValueError, RuntimeError) as e:  # well-formed fields whose requests cannot happen
        raise InputError(f"{args.snapshot}: its requests cannot be replayed: {e}") from None
    if args.device == "all":
        print_json({"snapshot": args.snapshot, "devices": [out for _, out in reports],
                     "ok": all(r.ok for r, _ in reports)})
    else:
        print_json({**reports[0][1], "snapshot": args.snapshot})
    if args.check and not all(r.ok for r, _ in reports):
        return EXIT_MISMATCH
    return EXIT_OK


def _simulated_devices(snap: dict, cfg, devices: list[int]) -> dict:
    """The replayed devices' runs as one snapshot, each under its own device index."""
    from xmem_engine.simulation.replay import simulated_snapshot

    out: dict = {"segments": [], "device_traces": [[] for _ in range(max(devices) + 1)]}
    for device in devices:
        sim = simulated_snapshot(snap, cfg, device)
        out["segments"] += [{**seg, "device": device} for seg in sim["segments"]]
        out["device_traces"][device] = sim["device_traces"][0]
        out["allocator_settings"] = sim["allocator_settings"]
    return out


# --------------------------------------------------------------------------- simulate
def _add_simulate(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a trace (JSON lines from `xmem trace --events`) through the allocator simulator",
    )
    p.add_argument("events", help="trace file: one JSON event a line")
    p.add_argument("--alloc-conf", metavar="STR", help="PYTORCH_CUDA_ALLOC_CONF string")
    p.add_argument("--capacity", metavar="BYTES", type=_bytes_arg,
                   help="device memory the allocator may reserve (e.g. 40GiB, 8e9); unlimited by default")
    p.add_argument("--snapshot", metavar="FILE",
                   help="write the simulated run as a snapshot pickle for torch.cuda._memory_viz")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    p.add_argument("--force", action="store_true", help="overwrite an existing --snapshot file")
    p.set_defaults(func=_cmd_simulate)


def _bytes_arg(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
             "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1}
    t = text.strip().lower().replace("_", "")
    for u, mult in units.items():
        if t.endswith(u):
            num = t[: -len(u)]
            break
    else:
        num, mult = t, 1
    try:
        value = float(num) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (try 40GiB or 8e9)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"byte count must be positive: {text!r}")
    if not math.isfinite(value) or value > MAX_CAPACITY:
        raise argparse.ArgumentTypeError(f"byte count {text!r} is beyond any device (at most 1 PiB)")
    return int(value)


def _cmd_simulate(args) -> int:
    from xmem_engine.simulation.simulate import simulate
    from xmem_engine.simulation.snapshot import dump_snapshot, make_snapshot
    from xmem_engine.trace import Trace
    from xmem_engine.simulation.allocator import CachingAllocator

    cfg = alloc_conf_arg(args.alloc_conf)
    check_output(args.snapshot, "--snapshot", args.force, (args.events,))
    try:
        trace = Trace.read_jsonl(args.events)
    except FileNotFoundError:
        raise InputError(f"no such trace file: {args.events}") from None
    except IsADirectoryError:
        raise InputError(f"{args.events} is a folder, not a trace file") from None
    except OSError as e:
        raise InputError(f"cannot read {args.events}: {e.strerror}") from None
    except ValueError as e:
        raise InputError(str(e)) from None
    history: list | None = [] if args.snapshot else None
    alloc = CachingAllocator(cfg, capacity=args.capacity, history=history)
    try:
        res = simulate(trace, allocator=alloc)
    except (ValueError, RuntimeError) as e:  # requests that cannot happen on any device
        raise InputError(f"{args.events}: {e}") from None
    if args.snapshot:
        dump_snapshot(make_snapshot(alloc), args.snapshot)
    summary = {
        "events": len(trace),
        "peak_allocated_bytes": res.peak_allocated_bytes,
        "peak_reserved_bytes": res.peak_reserved_bytes,
        "device_mallocs": res.device_mallocs,
        "oom": res.oom,
        "oom_event": res.oom_event,
        "breakdown": res.breakdown,
        "seconds": round(res.seconds, 4),
    }
    if args.json:
        print_json(summary)
    else:
        gib = 1 << 30
        print(f"{len(trace):,} events: peak allocated {res.peak_allocated_bytes / gib:.3f} GiB, "
              f"peak reserved {res.peak_reserved_bytes / gib:.3f} GiB, {res.device_mallocs} cudaMalloc calls"
              + (f"; OUT OF MEMORY at event {res.oom_event}" if res.oom else ""))
    return EXIT_MISMATCH if res.oom else EXIT_OK


# --------------------------------------------------------------------------- trace
def _add_trace(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="run a CUDA training script on the CPU and write the GPU memory requests it would make",
        description="Run SCRIPT, written for the cuda device, on the CPU under a virtual GPU and write its "
        "trace (allocations, frees, phase / iteration markers) as JSON lines. --mode fake uses fake "
        "tensors (no arithmetic, little memory), real runs real CPU tensors (for data-dependent code), "
        "auto tries fake and falls back to real.",
    )
    p.add_argument("script", help="a training script written for CUDA")
    p.add_argument("--mode", choices=MODES, default="auto")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="VAR=VALUE",
                   help="override a top-level assignment of the script, e.g. --set batch_size=64 (repeatable)")
    p.add_argument("--events", required=True, metavar="FILE", help="where to write the trace (JSON lines)")
    p.add_argument("--max-iterations", type=int, metavar="N",
                   help="stop the script when training iteration N+1 would start (default: run it all)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --events file")
    p.set_defaults(func=_cmd_trace)


def _cmd_trace(args) -> int:
    from xmem_engine.overrides import parse_overrides
    from xmem_engine.tracing import trace_script

    check_script(args.script)
    if args.max_iterations is not None and args.max_iterations < 1:
        raise InputError(f"--max-iterations must be at least 1, not {args.max_iterations}")
    check_output(args.events, "--events", args.force, (args.script,))
    with running_script("trace", args.script, args.mode):
        overrides = parse_overrides(args.overrides)
        tr = trace_script(args.script, mode=args.mode, overrides=overrides, max_iterations=args.max_iterations)
    try:
        tr.write_jsonl(args.events)
    except OSError as e:
        raise InputError(f"cannot write {args.events}: {e}") from None
    allocs = sum(1 for e in tr.events if e.kind == "alloc")
    frees = sum(1 for e in tr.events if e.kind == "free")
    note = f" ({tr.meta['fallback']})" if tr.meta.get("fallback") else ""
    print(f"xmem trace: {len(tr.events):,} events ({allocs:,} allocs, {frees:,} frees), mode {tr.mode}{note}, "
          f"{tr.seconds:.2f} s -> {args.events}")
    return EXIT_OK


# --------------------------------------------------------------------------- estimate
def _add_estimate(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate the GPU memory a CUDA training script needs on a named GPU",
        description="Run SCRIPT (written for CUDA) on the CPU, replay its GPU memory requests through "
        "the caching allocator of the named GPU, and say whether it fits. The script's own arguments "
        "follow a bare --: xmem estimate train.py --gpu T4 -- --epochs 2. Exit codes: 0 fits, "
        "3 does not fit, 1 the script failed, 2 bad input.",
    )
    p.add_argument("script", help="a training script written for CUDA")
    p.set_defaults(script_args=[])  # the script's own arguments: whatever follows a bare -- (main)
    add_target_flags(p)
    add_trace_flags(p)
    p.add_argument("--alloc-conf", metavar="STR", help="PYTORCH_CUDA_ALLOC_CONF for the GPU run")
    p.add_argument("--compile", choices=("inductor", "eager"), help="torch.compile: inductor (for the target GPU; needs "
                   "Triton) or eager (to see what compiling saves); default: $XMEM_COMPILE or inductor")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--events", metavar="FILE", help="also write the trace (as `xmem trace --events`)")
    p.add_argument("--snapshot", metavar="FILE", help="write the simulated run as a _snapshot() pickle for _memory_viz")
    p.add_argument("--max-batch", metavar="VAR",
                   help="print the largest value of the script's top-level VAR that fits on the GPU (from one "
                   "trace with VAR as a symbol where the script allows; --json's \"family\" says how)")
    p.add_argument("--safe", action="store_true",
                   help="judge fitting (and --max-batch) by the calibrated range's high end, not the point "
                   "estimate: what a scheduler should reserve")
    p.add_argument("--min-memory", action="store_true",
                   help="also find the least device memory the step runs in (min_device_bytes): the "
                   "allocator frees its cache when memory is short, so this is below the natural peak")
    _add_world_arguments(p)
    p.add_argument("--force", action="store_true", help="overwrite existing --events / --snapshot files")
    p.set_defaults(func=_cmd_estimate)


def _add_world_arguments(p) -> None:
    g = p.add_argument_group("distributed (a script written for torchrun)")
    g.add_argument("--world-size", type=int, metavar="N",
                   help="estimate one rank of N processes: the script sees torchrun's environment (RANK, "
                   "LOCAL_RANK, WORLD_SIZE) and init_process_group makes a fake group of N ranks")
    g.add_argument("--rank", default=None, metavar="R|all",
                   help="the rank to trace (default 0); all: trace every rank and report the largest peak")
    g.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                   help="GPUs per node, torchrun's --nproc-per-node (default 8): LOCAL_RANK = RANK %% G")


MAX_EVERY_RANK = 256  # --rank all: one trace a rank, in this process


def _world_args(args) -> tuple[list, bool]:
    """The worlds to trace from --world-size / --rank / --gpus-per-node (checked before the script
    runs), and whether --rank all asked for every rank."""
    from xmem_engine.tracing.shims.distributed import GPUS_PER_NODE, World

    size, rank, per_node = args.world_size, args.rank, args.gpus_per_node
    if size is None:
        if rank is not None or per_node is not None:
            raise InputError("--rank and --gpus-per-node need --world-size N (the number of processes torchrun starts)")
        return [None], False
    every = rank == "all"
    if every and size > MAX_EVERY_RANK:
        raise InputError(f"--rank all with --world-size {size}: that is {size:,} traces, one after another. "
                         f"Ranks that run the same code are alike: trace one (--rank R), or ask for all "
                         f"of at most {MAX_EVERY_RANK} ranks")
    if rank is None or every:
        ranks = range(size) if every else [0]
    else:
        try:
            ranks = [int(rank)]
        except ValueError:
            raise InputError(f"--rank {rank}: give a rank between 0 and {size - 1}, or all") from None
    try:
        return [World(size, r, per_node if per_node is not None else GPUS_PER_NODE) for r in ranks], every
    except ValueError as e:
        raise InputError(f"--world-size / --rank / --gpus-per-node: {e}") from None


def _cmd_estimate(args) -> int:
    import os

    from functools import partial

    from xmem_engine.batch_family import symbolic_family
    from xmem_engine.estimate import estimate_script, estimate_trace, max_batch, resolve_gpu, script_branches_on

    # Everything the user gave is checked before the script runs.
    gpu, overrides = script_inputs(args)
    cfg = alloc_conf_arg(args.alloc_conf)  # parsed and checked once; None: the environment's
    os.environ.update({"XMEM_COMPILE": args.compile} if args.compile else {})  # read by trace(compile=None)
    check_output(args.events, "--events", args.force, (args.script,))
    check_output(args.snapshot, "--snapshot", args.force, (args.script,))
    if args.events and args.snapshot and os.path.abspath(args.events) == os.path.abspath(args.snapshot):
        raise InputError(f"--events and --snapshot name the same file ({args.events}); give two files")
    start = None
    if args.max_batch:
        start = batch_value(args.script, args.max_batch, "--max-batch")
        if args.max_batch in overrides:
            raise InputError(f"--max-batch {args.max_batch} and --set {args.max_batch}=...: the search sets "
                             f"{args.max_batch} itself; drop one of them")

    worlds, every_rank = _world_args(args)

    def run(ov: dict[str, str]):
        ests = [estimate_script(args.script, gpu, overrides=ov, mode=args.mode, alloc_conf=cfg,
                                torch_version=args.torch_version, iterations=args.iterations, world=w,
                                argv=args.script_args)
                for w in worlds]
        return _largest_rank(ests) if every_rank else ests[0]

    # With --json, stdout carries one JSON object: the script's own prints go to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    search = None
    with running_script("estimate", args.script, args.mode):
        with quiet:
            if args.max_batch:
                family = lambda tr: estimate_trace(tr, gpu, args.alloc_conf, torch_version=args.torch_version)  # noqa: E731
                one = len(worlds) == 1  # the batch as a symbol, else two traces' family (batch_family.py)
                symbolic = partial(symbolic_family, args.script, args.max_batch, overrides=overrides, world=worlds[0],
                                   device=resolve_gpu(gpu).properties(), max_iterations=args.iterations,
                                   torch_version=args.torch_version, argv=args.script_args) if one and args.mode != "real" else None
                search = max_batch(lambda v: run({**overrides, args.max_batch: str(v)}), start=start, safe=args.safe,
                                   estimate_trace=family if one else None, symbolic=symbolic,
                                   fit_family=not script_branches_on(args.script, args.max_batch))
                est = search.estimate
            else:
                est = run(overrides)

    if args.min_memory and est is not None and est.trace is not None:
        from xmem_engine.resimulation import minimum_memory

        est.min_device_bytes = minimum_memory(est)
    writing = f"--events {args.events}"
    try:
        if args.events and est.trace is not None:
            est.trace.write_jsonl(args.events)
        writing = f"--snapshot {args.snapshot}"
        if args.snapshot:
            from xmem_engine.resimulation import simulated_snapshot
            from xmem_engine.simulation.snapshot import dump_snapshot

            dump_snapshot(simulated_snapshot(est), args.snapshot)
    except OSError as e:
        raise _said(args, OutputFailed(f"cannot write {writing}: {e.strerror or e}; the estimate was "
                                       f"made: {est.summary().splitlines()[0] if est else ''}",
                                       est.to_json() if est is not None else None)) from None
    if search is not None:
        out = {"variable": args.max_batch, **search.to_json(), "gpu": gpu.key, **(est.to_json() if est else {})}
        if args.json:
            print_json(out)
        else:
            print(search.describe(args.max_batch, gpu.name))
            if est is not None and search.value:
                print(est.summary())
        return EXIT_OK if search.value > 0 else EXIT_MISMATCH
    if args.json:
        print_json(est.to_json())
    else:
        print(est.summary())
        if args.safe and est.fits and not est.fits_safely:
            print(f"  --safe: the range's high end, {est.safe_bytes / 2**30:.2f} GiB, does not fit")
    return EXIT_OK if (est.fits_safely if args.safe else est.fits) else EXIT_MISMATCH


def _largest_rank(ests: list):
    """``--rank all``: the rank with the largest peak, with every rank's peak beside it."""
    best = max(ests, key=lambda e: (e.peak_device_bytes, -e.world["rank"]))
    best.rank_peaks = {e.world["rank"]: e.peak_device_bytes for e in ests}
    peaks = sorted(set(best.rank_peaks.values()))
    if len(peaks) > 1:
        best.notes.append("the ranks differ: " + ", ".join(
            f"rank {r} {v / 2**30:.2f} GiB" for r, v in best.rank_peaks.items()))
    else:
        best.notes.append(f"all {len(ests)} ranks peak alike")
    return best


# --------------------------------------------------------------------------- gpus
def _add_gpus(sub) -> None:
    from xmem_engine.gpus import ADD_GPU_HELP

    p = sub.add_parser("gpus", help="list the GPUs xmem knows (add yours in a TOML file: see --help)",
                       description="List the GPU catalog. Add or correct GPUs in a TOML file named by "
                       "--file, $XMEM_GPUS_FILE or ~/.config/xmem/gpus.toml (same layout as the packaged "
                       "xmem_engine/data/gpus.toml).", epilog=ADD_GPU_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", metavar="TOML", help="a TOML file of extra or corrected GPUs")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON, with sources")
    p.set_defaults(func=_cmd_gpus)


def _cmd_gpus(args) -> int:
    from dataclasses import asdict

    from xmem_engine.gpus import GPUCatalogError, load_catalog

    try:
        catalog = load_catalog(args.file)
    except (GPUCatalogError, OSError) as e:
        raise InputError(str(e)) from None
    if args.json:
        from xmem_engine.gpus.fixed_memory import part, parts

        def entry(g) -> dict:  # the catalog's fields, and each fixed-memory part with its range and sources
            fixed = [p.to_json() for p in parts(g)]
            if g.driver_reserved_bytes is not None:
                fixed.append(part(g, "driver_reserved_bytes").to_json())
            return {**asdict(g), "fixed_memory": fixed}

        print_json({k: entry(g) for k, g in catalog.items()})
        return EXIT_OK
    def mib(g, name: str) -> str:  # "~" marks a figure not measured on that GPU (it has a range)
        value = getattr(g, name)
        if value is None:
            return "-"
        return f"{value >> 20}{'' if g.part_range(name) == (value, value) else '~'}"

    rows = [("GPU", "name (nvidia-smi)", "usable GiB", "compute", "context MiB", "kernels MiB", "cuDNN MiB",
             "NCCL MiB", "driver reserve MiB")]
    for key, g in sorted(catalog.items(), key=lambda kv: kv[1].total_memory_bytes):
        cc = ".".join(map(str, g.compute_capability))
        rows.append((key, g.name, f"{g.total_memory_bytes / (1 << 30):.2f}", cc,
                     *(mib(g, n) for n in ("context_bytes", "kernel_bytes", "cudnn_bytes", "nccl_bytes",
                                           "driver_reserved_bytes"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print("~: not measured on that GPU (estimated or assumed); the estimate's range carries its own range. "
          "Sources and ranges: xmem gpus --json")
    return EXIT_OK


def _add_kept_apart(sub) -> None:
    """The subcommands kept in modules of their own, after ``estimate``."""
    from xmem_engine.cli.advise import add_advise
    from xmem_engine.cli.cache import add_cache
    from xmem_engine.cli.ops import add_ops
    from xmem_engine.cli.sweep import add_sweep

    add_advise(sub)
    add_sweep(sub)
    add_ops(sub)
    add_cache(sub)


_SUBCOMMANDS: list = [_add_estimate, _add_kept_apart, _add_trace, _add_replay, _add_simulate, _add_gpus]
