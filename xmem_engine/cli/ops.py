"""``xmem ops``: which ops and torch functions xmem models, and how (:mod:`xmem_engine.tracing.ops`).

An op that is not listed still runs: its outputs come from PyTorch's own (fake or CPU)
kernel, which allocates them as CUDA's does for most ops. The list is the ops whose GPU
allocations, values or sizes xmem models itself.
"""

from __future__ import annotations

from xmem_engine.cli.common import EXIT_OK, InputError, print_json


def add_ops(sub) -> None:
    p = sub.add_parser("ops", help="the ops xmem models itself, and how",
                       description="Every aten op and torch function with a rule of xmem's own: what the "
                       "CUDA kernel allocates that the CPU run does not, values fake tensors do not have, sizes "
                       "that depend on values, autocast's cast lists, fake-mode shortcuts. Any other op runs "
                       "PyTorch's own kernel.")
    p.add_argument("--kind", help="only rules of this kind (see the list without it)")
    p.add_argument("--grep", metavar="TEXT", help="only ops whose name contains TEXT")
    p.add_argument("--json", action="store_true", help="one JSON object: kinds and rules")
    p.set_defaults(func=_cmd_ops)


def _cmd_ops(args) -> int:
    import dataclasses

    import xmem_engine.tracing  # noqa: F401 - the tracer's modules register their rule tables as imported
    from xmem_engine.tracing.ops import KINDS, rules

    if args.kind is not None and args.kind not in KINDS:
        raise InputError(f"--kind {args.kind!r}: one of {', '.join(sorted(KINDS))}")
    found = [r for r in rules(args.kind) if not args.grep or args.grep in r.op]
    if args.json:
        print_json({"kinds": KINDS, "rules": [dataclasses.asdict(r) for r in found]})
        return EXIT_OK
    for kind, what in KINDS.items():
        n = sum(r.kind == kind for r in found)
        if n:
            print(f"{kind} ({n}): {what}")
    print()
    width = max((len(r.op) for r in found), default=0)
    kind_width = max((len(r.kind) for r in found), default=0)
    for r in found:
        module = r.module.removeprefix("xmem_engine.tracing.")
        print(f"{r.op.ljust(width)}  {r.kind.ljust(kind_width)}  {module}{': ' + r.rule if r.rule else ''}")
    return EXIT_OK
