"""A sweep's grid (:mod:`xmem_engine.sweep`): the cross product of scripts, ``--set`` values,
GPUs and allocator settings, every input checked before anything is traced.

``--set VAR=V1,V2`` splits at commas outside brackets and quotes; a GPU is any catalog name
(rows carry its catalog key); each allocator setting is one PyTorch accepts and xmem
simulates; ``--max-batch VAR`` needs a positive integer to start from. A script is read
once, here: the sweep's workers trace that text, whatever happens to the file meanwhile.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable

from xmem_engine.inputs import env_alloc_conf
from xmem_engine.overrides import OverrideError, apply_overrides, positive_int_value


class SweepInputError(ValueError):
    """Bad input to a sweep (a script, a GPU, a ``--set``, the output file): refused before
    any tracing starts."""


def point_key(kind: str, script: str, settings: dict[str, str], gpu: str, alloc_conf: str,
              world_size: int | None = None) -> tuple:
    return (kind, script, tuple(sorted(settings.items())), gpu, alloc_conf, world_size)


@dataclass
class Grid:
    """The cross product to estimate, checked (:func:`make_grid`)."""

    scripts: list[str]  # as the user named them (the rows' ``script``)
    sources: dict[str, str]  # script -> its text, read once
    gpus: list[str]  # catalog keys; the first is the one traced for
    settings: dict[str, list[str]]  # --set VAR -> its values, in the given order
    alloc_confs: list[str]
    max_batch: str | None = None
    starts: dict[str, int] = field(default_factory=dict)  # script -> where the max_batch search starts
    mode: str = "auto"
    iterations: int | None = None
    torch_version: str | None = None
    safe: bool = False
    exact: bool = False  # a trace for every GPU instead of one re-simulated for all (sweep.plan)
    worlds: list[int | None] = field(default_factory=lambda: [None])  # --world-size values (None: one process)

    def combos(self, leave_out: str | None = None) -> list[dict[str, str]]:
        """Every combination of the ``--set`` values (one empty one without ``--set``)."""
        names = [v for v in self.settings if v != leave_out]
        return [dict(zip(names, vals)) for vals in itertools.product(*(self.settings[n] for n in names))]

    def targets(self) -> list[tuple[str, str]]:
        return [(g, c) for g in self.gpus for c in self.alloc_confs]

    def keys(self) -> list[tuple]:
        """Every point's key in grid order: points first, then the max_batch searches."""
        out = [point_key("point", s, c, g, a, w) for s in self.scripts for w in self.worlds for c in self.combos()
               for g, a in self.targets()]
        if self.max_batch:
            out += [point_key("max_batch", s, c, g, a, w) for s in self.scripts for w in self.worlds
                    for c in self.combos(self.max_batch) for g, a in self.targets()]
        return out


def parse_set(items: Iterable[str]) -> dict[str, list[str]]:
    """``["batch=8,16", "lr=1e-3"]`` -> ``{"batch": ["8", "16"], "lr": ["1e-3"]}``. Values are
    split at commas outside brackets and quotes (``shape=(2,3),(4,5)`` is two values)."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise SweepInputError(f"--set expects VAR=V1,V2,... with a Python name, got {item!r}")
        values = _split_values(rest)
        if len(values) > 1 and any(not v.strip() for v in values):
            raise SweepInputError(f"--set {item!r}: an empty value in the list")
        for v in values:
            if v not in out.setdefault(name, []):
                out[name].append(v)
    return out


def _split_values(text: str) -> list[str]:
    values, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
            continue
        cur += ch
    values.append(cur.strip())
    return values


def make_grid(
    scripts: list[str],
    gpus: list[str],
    settings: dict[str, list[str]] | None = None,
    alloc_confs: list[str] | None = None,
    *,
    max_batch: str | None = None,
    mode: str = "auto",
    iterations: int | None = None,
    torch_version: str | None = None,
    safe: bool = False,
    exact: bool = False,
    worlds: list[int] | None = None,
) -> Grid:
    """The grid, every input checked before anything is traced (:class:`SweepInputError`):
    each script readable and valid Python, assigning every ``--set`` variable at top level;
    each GPU in the catalog; each allocator setting one xmem simulates; ``max_batch`` a
    positive integer in each script (or in every ``--set`` value given for it)."""
    import ast

    from xmem_engine.estimate import resolve_gpu
    from xmem_engine.gpus import GPUCatalogError, UnknownGPUError
    from xmem_engine.simulation.alloc_conf import AllocConfError, parse_alloc_conf, require_native
    from xmem_engine.trace import MODES

    settings = dict(settings or {})
    if not scripts:
        raise SweepInputError("no script to sweep")
    if not gpus:
        raise SweepInputError("no GPU to sweep (--gpu)")
    if mode not in MODES:
        raise SweepInputError(f"mode must be one of {MODES}, not {mode!r}")
    if iterations is not None and iterations < 1:
        raise SweepInputError(f"--iterations must be at least 1, not {iterations}")
    if torch_version is not None:
        from xmem_engine.gpus.cuda_libraries import target_version

        try:
            target_version(torch_version)
        except ValueError as e:
            raise SweepInputError(f"--torch: {e}") from None
    keys: list[str] = []
    for name in gpus:
        if not name.strip():
            raise SweepInputError("--gpu: empty GPU name; `xmem gpus` lists the names")
        try:
            key = resolve_gpu(name.strip()).key
        except (UnknownGPUError, GPUCatalogError) as e:
            raise SweepInputError(str(e)) from None
        if key not in keys:
            keys.append(key)
    confs: list[str] = []
    for conf in alloc_confs if alloc_confs else [env_alloc_conf()[1]]:
        try:
            require_native(parse_alloc_conf(conf))
        except AllocConfError as e:
            raise SweepInputError(f"--alloc-conf {conf!r}: {e}") from None
        if conf not in confs:
            confs.append(conf)
    for w in worlds or ():
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise SweepInputError(f"--world-size expects whole numbers of at least 1, got {w!r}")
    if max_batch is not None and not max_batch.isidentifier():
        raise SweepInputError(f"--max-batch expects a Python name, got {max_batch!r}")
    sources: dict[str, str] = {}
    starts: dict[str, int] = {}
    for script in dict.fromkeys(scripts):
        try:
            text = open(script, encoding="utf-8").read()
        except FileNotFoundError:
            raise SweepInputError(f"no such script: {script}") from None
        except IsADirectoryError:
            raise SweepInputError(f"no such script: {script} (it is a folder)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SweepInputError(f"cannot read {script}: {e}") from None
        try:
            tree = ast.parse(text, filename=script)
        except SyntaxError as e:
            raise SweepInputError(f"{script} has a syntax error (line {e.lineno}): {e.msg}") from None
        try:
            apply_overrides(tree, {v: vals[0] for v, vals in settings.items()}, script)
        except OverrideError as e:
            raise SweepInputError(str(e)) from None
        sources[script] = text
        if max_batch:
            starts[script] = _search_start(script, max_batch, settings.get(max_batch))
    return Grid(list(sources), sources, keys, settings, confs, max_batch, starts, mode, iterations,
                torch_version, safe, exact, list(dict.fromkeys(worlds)) if worlds else [None])


def _search_start(script: str, var: str, values: list[str] | None) -> int:
    """Where the search for ``var`` starts: its largest ``--set`` value, else the script's."""
    if values:
        nums = [int(v) for v in values if v.strip().isdigit()]
        if len(nums) != len(values) or min(nums) < 1:
            raise SweepInputError(f"--max-batch {var}: every --set {var}=... value must be a positive integer")
        return max(nums)
    try:
        return positive_int_value(script, var)
    except (OverrideError, SyntaxError) as e:
        raise SweepInputError(f"--max-batch {var}: {script}: {e}") from None
