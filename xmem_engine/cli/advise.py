"""``xmem advise``: what would make a training script fit a GPU (:mod:`xmem_engine.advisor`).

Kept beside ``main.py``, whose conventions it follows: inputs checked before the script runs
(exit 2), the script's failures as ``xmem estimate`` reports them (exit 1), 3 when nothing
measured makes the step fit.
"""

from __future__ import annotations

import contextlib
import sys

from xmem_engine.cli.common import (EXIT_MISMATCH, EXIT_OK, add_target_flags, add_trace_flags, alloc_conf_arg,
                                    batch_value, print_json, running_script, script_inputs)


def add_advise(sub) -> None:
    p = sub.add_parser(
        "advise", help="what would make a CUDA training script fit a GPU: each lever measured on the script",
        description="Estimate SCRIPT on GPU, then again with each usual change applied without editing it "
        "(allocator settings, zero_grad(set_to_none=True), for-loop / fused optimizer, autocast, activation "
        "checkpointing, Adafactor, and with --batch-var gradient accumulation and a smaller batch), and print "
        "each measured peak, what it costs and the code to change; then the cheapest combination that fits. "
        "Exit codes: 0 the step fits or a change makes it fit, 3 nothing measured does, 1 the script failed, "
        "2 bad input.")
    p.add_argument("script", help="a training script written for CUDA")
    add_target_flags(p)
    add_trace_flags(p)
    p.add_argument("--batch-var", metavar="VAR", help="the script's top-level batch-size variable: adds gradient "
                   "accumulation and a smaller batch")
    p.add_argument("--alloc-conf", metavar="STR", default="",
                   help="the run's own PYTORCH_CUDA_ALLOC_CONF; allocator levers add to it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_advise)


def _cmd_advise(args) -> int:
    from xmem_engine.advisor import advise

    gpu, overrides = script_inputs(args)
    alloc_conf_arg(args.alloc_conf or None)
    if args.batch_var and args.batch_var not in overrides:
        batch_value(args.script, args.batch_var, "--batch-var")
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with running_script("advise", args.script, args.mode), quiet:
        advice = advise(args.script, gpu, batch_var=args.batch_var, overrides=overrides, mode=args.mode,
                        alloc_conf=args.alloc_conf,
                        torch_version=args.torch_version, iterations=args.iterations,
                        progress=lambda m: print(f"xmem advise: measuring {m}", file=sys.stderr, flush=True))
    if args.json:
        print_json(advice.to_json())
    else:
        print(advice.summary())
    return EXIT_OK if advice.baseline.fits or advice.combination else EXIT_MISMATCH
