"""``xmem cache``: what xmem's compile cache holds (the graphs Inductor compiled for each target
GPU, kept for a re-run: :mod:`xmem_engine.tracing.compiler.compile_cache`), and ``--clear``."""

from __future__ import annotations

import shutil
import time

from xmem_engine.cli.common import EXIT_OK, print_json


def add_cache(sub) -> None:
    p = sub.add_parser("cache", help="list or clear xmem's compile cache",
                       description="The graphs Inductor compiled for each target GPU (torch.compile in the "
                       "traced code), kept so that a second estimate of the same step skips the compile. One "
                       "folder per target GPU, torch version and xmem version; kept under XMEM_CACHE_MAX_MB "
                       "(1024 by default), the folders used least recently removed first. XMEM_CACHE_DIR moves "
                       "it; XMEM_CACHE_DIR=off keeps none.")
    p.add_argument("--clear", action="store_true", help="remove every compiled graph (the next estimate compiles afresh)")
    p.add_argument("--json", action="store_true", help="one JSON object: the folder, its limit and sub-folders")
    p.set_defaults(func=_cmd_cache)


def _cmd_cache(args) -> int:
    from xmem_engine.tracing.compiler.compile_cache import cache_limit_bytes, cache_root, folders

    root, limit = cache_root(), cache_limit_bytes()
    held = folders()
    if args.clear and root is not None:
        shutil.rmtree(root / "inductor", ignore_errors=True)
    total = sum(f["bytes"] for f in held)
    if args.json:
        print_json({"folder": None if root is None else str(root), "limit_bytes": limit, "bytes": total,
                    "folders": held, "cleared": bool(args.clear and root is not None)})
        return EXIT_OK
    if root is None:
        print("the compile cache is off (XMEM_CACHE_DIR=off)")
        return EXIT_OK
    print(f"{root / 'inductor'}: {total / 2**20:.1f} MiB of {limit / 2**20:,.0f} MiB (XMEM_CACHE_MAX_MB)")
    for f in held:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(f["last_used"]))
        what = f"{f['gpu']}, torch {f.get('torch', '?')}" if "gpu" in f else "(compiled for: not recorded)"
        print(f"  {f['bytes'] / 2**20:8.1f} MiB  used {used}  {what}")
    if args.clear:
        print(f"cleared: {len(held)} folder(s), {total / 2**20:.1f} MiB")
    return EXIT_OK
