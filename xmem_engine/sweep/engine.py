"""Sweeps: many estimates at once, spread over processes or a Ray cluster (``xmem sweep``).

A cluster scheduler checking its queue, or a team choosing a GPU and a batch size, asks for
tens to thousands of (script, GPU, ``--set`` values, allocator setting) estimates. Tracing is
the costly part (seconds); re-simulating a trace on another GPU or allocator setting takes
milliseconds (:func:`~xmem_engine.estimate.estimate_trace`). So the grid is cut into *work
units*, one trace per (script, ``--set`` values), each re-simulated for every GPU x allocator
setting: a grid costs about what its traces cost, whatever the number of GPUs.

The trace of a unit is made for the first GPU of the grid (what the script sees of
``torch.cuda``: its name, memory, compute capability, SM count) and re-simulated for the
others, as the notebook widget's GPU switch does; ``traced_for`` in each row names it. The
estimate sizes again what depends on the GPU (reduction buffers by SM count, library
workspaces by architecture), so a row equals ``xmem estimate`` for its GPU, except where a
trace's attention took a backend that another architecture would not pick (the row's notes
say so). ``exact=True`` (``--exact``) traces for every GPU, for that case.

Engines: ``"local"`` (a process pool: each worker traces one unit at a time, since tracing
patches torch process-wide), ``"ray"`` (tasks on a Ray cluster; each carries the script's
text, so nodes need xmem and torch but not the user's files), ``"serial"`` (in this process,
one unit after another: the reference the others must equal). A point whose script fails
becomes a row with its error; the sweep goes on. Rows reach the output file
(:mod:`xmem_engine.sweep.output`) as units finish, and a later run with the same file skips
the points it holds.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable

from xmem_engine.sweep.grid import (Grid, SweepInputError, make_grid, parse_set,  # noqa: F401  (the API)
                                    point_key)
from xmem_engine.sweep.output import Output, OutputError

ENGINES = ("local", "ray", "serial")
TIMING_FIELDS = ("seconds", "trace_seconds", "simulate_seconds")
RAY_HINT = "the Ray engine needs Ray: pip install 'xmem[ray]'"


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep: pending work cancelled, finished rows kept (``rows``)."""

    def __init__(self, rows: list["Row"], remaining: int):
        super().__init__(f"interrupted: {len(rows)} rows kept, {remaining} points not run")
        self.rows, self.remaining = rows, remaining


@dataclass
class Row:
    """One finished point: a grid point (``kind="point"``), or the largest value of the
    ``max_batch`` variable that fits (``kind="max_batch"``: ``settings`` then leave that
    variable out; ``max_value`` is the value, 0 if not even 1 fits, and ``answer`` says
    "at least N" or "any" when the search found no value that does not fit). The figures
    are the estimate's (at ``max_value`` for a search); ``status`` is "ok" or "failed",
    with ``error`` saying why."""

    kind: str
    script: str
    settings: dict[str, str]
    gpu: str
    alloc_conf: str
    status: str
    world_size: int | None = None  # --world-size: one rank (0) of that many processes; None: one process
    fits: bool | None = None
    fits_safely: bool | None = None  # the calibrated range's high end fits too
    peak_device_bytes: int | None = None
    peak_device_bytes_high: int | None = None
    capacity_bytes: int | None = None
    headroom_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    oom: bool | None = None
    mode: str | None = None
    variable: str = ""  # max_batch rows: the variable searched
    max_value: int | None = None
    answer: str = ""
    traced_for: str = ""  # the GPU the trace was made for (the others re-simulate it)
    torch_version: str = ""
    seconds: float = 0.0  # what this point cost: its simulation, plus the trace for the unit's first point
    trace_seconds: float = 0.0  # the unit's trace (shared by its points)
    simulate_seconds: float = 0.0
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        """What identifies the point: a resumed sweep skips rows with the same key."""
        return point_key(self.kind, self.script, self.settings, self.gpu, self.alloc_conf, self.world_size)

    def result(self) -> dict[str, Any]:
        """The row without its timings: what must not depend on the engine."""
        return {k: v for k, v in asdict(self).items() if k not in TIMING_FIELDS}


@dataclass
class Unit:
    """One trace (or, for ``search``, one trace per value tried) and its re-simulations:
    what one worker runs. Carries the script's text, not only its path."""

    script: str
    path: str  # absolute: names the script in tracebacks and notes
    source: str
    settings: dict[str, str]
    targets: list[tuple[str, str]]  # (GPU, allocator setting) to estimate
    traced_for: str
    mode: str = "auto"
    iterations: int | None = None
    torch_version: str | None = None
    search: str | None = None  # max_batch: the variable to search
    start: int = 1
    safe: bool = False
    threads: int | None = None  # torch threads in the worker (1 where several workers share the cores)
    world_size: int | None = None  # trace rank 0 of this many processes (None: one process)
    family: str | None = None  # an integer --set variable: the unit covers its ``values`` (batch_family.py)
    values: list[str] = field(default_factory=list)

    @property
    def points(self) -> int:
        return len(self.targets) * max(1, len(self.values))

    def each(self) -> list["Unit"]:
        """One unit per value of ``family`` (the unit itself where it has none)."""
        if not self.family:
            return [self]
        return [replace(self, settings={**self.settings, self.family: v}, family=None, values=[]) for v in self.values]


#: an integer --set variable with at least this many values is traced at its two ends only
FAMILY_VALUES = 3


def family_axis(grid: Grid) -> str | None:
    """The --set variable whose values a unit covers from two traces: integers, at least
    ``FAMILY_VALUES`` of them, the most values of any (a batch size, a sequence length).
    None with ``exact`` (``--exact``: every point traced)."""
    if grid.exact:
        return None

    def whole(v: str) -> bool:
        return v.strip().lstrip("-").isdigit()

    axes = [n for n, vals in grid.settings.items() if len(vals) >= FAMILY_VALUES and all(whole(v) for v in vals)]
    return max(axes, key=lambda n: len(grid.settings[n]), default=None)


def plan(grid: Grid, done: Iterable[tuple] = ()) -> list[Unit]:
    """The work units for the points not in ``done`` (keys): the max_batch searches first,
    as they take longest. A unit traces for the grid's first GPU and re-simulates for all;
    with ``grid.exact``, each GPU has units of its own, traced for it."""
    done = set(done)
    units: list[Unit] = []
    common = dict(mode=grid.mode, iterations=grid.iterations, torch_version=grid.torch_version)
    groups = [[g] for g in grid.gpus] if grid.exact else [grid.gpus]
    axis = family_axis(grid)
    for kind, combos in (("max_batch", grid.combos(grid.max_batch)), ("point", grid.combos())):
        if kind == "max_batch" and not grid.max_batch:
            continue
        for script in grid.scripts:
            for world in grid.worlds:
                covered: set[tuple] = set()  # combos a family unit holds
                for combo in combos:
                    for gpus in groups:
                        unit = Unit(script, os.path.abspath(script), grid.sources[script], combo, [], gpus[0],
                                    **common, search=grid.max_batch if kind == "max_batch" else None,
                                    start=grid.starts.get(script, 1), safe=grid.safe, world_size=world)
                        every = [(g, c) for g in gpus for c in grid.alloc_confs]
                        if kind == "point" and axis:
                            key = (tuple(sorted((k, v) for k, v in combo.items() if k != axis)), gpus[0])
                            values = grid.settings[axis]
                            keys = [point_key(kind, script, {**combo, axis: v}, g, c, world)
                                    for v in values for g, c in every]
                            if key in covered:
                                continue
                            if not done.intersection(keys):  # none done yet: one unit, two traces
                                covered.add(key)
                                units.append(replace(unit, targets=every, family=axis, values=list(values)))
                                continue
                        todo = [(g, c) for g, c in every if point_key(kind, script, combo, g, c, world) not in done]
                        if todo:
                            units.append(replace(unit, targets=todo))
    return units


# --------------------------------------------------------------------------- one unit
def run_unit(unit: Unit) -> list[Row]:
    """The rows of one unit. Never raises for the user's code: a failed trace or estimate
    is a row with its error. The script's prints and warnings are dropped."""
    if unit.threads:
        import torch

        torch.set_num_threads(unit.threads)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _search_rows(unit) if unit.search else _family_rows(unit) if unit.family else _point_rows(unit)


def _trace(unit: Unit, settings: dict[str, str]) -> Any:
    from xmem_engine.estimate import resolve_gpu
    from xmem_engine.tracing import trace_script

    from xmem_engine.tracing.shims.distributed import World

    return trace_script(unit.path, mode=unit.mode, overrides=settings,
                        device=resolve_gpu(unit.traced_for).properties(), max_iterations=unit.iterations,
                        torch_version=unit.torch_version, source=unit.source,
                        world=World(unit.world_size) if unit.world_size else None)


def _point_rows(unit: Unit) -> list[Row]:
    t0 = time.perf_counter()
    try:
        tr = _trace(unit, unit.settings)
    except (Exception, SystemExit) as e:
        return failed_rows(unit, describe_error(e, unit.path), time.perf_counter() - t0)
    return _estimated(unit, tr)


def _family_rows(unit: Unit) -> list[Row]:
    """The rows of every value of ``unit.family``: traced at the smallest and the largest, the
    values between them from the two traces' family (``batch_family.py``: no code run; each
    row's notes say so); every value traced where the two are not one family."""
    from xmem_engine.batch_family import BatchFamily, NotAffine, NotSymbolic, branches_on

    points = {v: p for v, p in zip(unit.values, unit.each())}
    traces: dict[str, Any] = {}
    failed: dict[str, list[Row]] = {}

    def real(v: str) -> Any:
        if v not in traces and v not in failed:
            t0 = time.perf_counter()
            try:
                traces[v] = _trace(points[v], points[v].settings)
            except (Exception, SystemExit) as e:
                failed[v] = failed_rows(points[v], describe_error(e, unit.path), time.perf_counter() - t0)
        return traces.get(v)

    lo, hi = min(unit.values, key=int), max(unit.values, key=int)
    regions = _symbolic_regions(unit, unit.family or "", int(lo))
    if regions is not None:  # one trace with the variable as a symbol (more where a value breaks its guards)
        rows = []
        for v in unit.values:
            try:
                tr = regions.trace_at(int(v))
            except NotSymbolic:
                tr = real(v)
            rows += failed[v] if tr is None else _estimated(points[v], tr)
        return rows
    family = None
    if branches_on(unit.source, unit.family or "") is None and real(lo) is not None and real(hi) is not None \
            and traces[lo].mode == traces[hi].mode == "fake":
        with contextlib.suppress(NotAffine):
            family = BatchFamily.fit(int(lo), traces[lo], int(hi), traces[hi])
    rows = []
    for v in unit.values:
        tr = traces.get(v) or (family.trace_at(int(v)) if family is not None else None) or real(v)
        rows += failed[v] if tr is None else _estimated(points[v], tr)
    return rows


def _symbolic_regions(unit: Unit, var: str, first: int) -> Any:
    """``batch_family.SymbolicRegions`` of the unit's script over ``var``, its first trace made
    at ``first`` (at least 2); None where that trace could not be made symbolic, or in real mode."""
    from xmem_engine.batch_family import NotSymbolic, SymbolicRegions, symbolic_family
    from xmem_engine.estimate import resolve_gpu
    from xmem_engine.tracing.shims.distributed import World

    if unit.mode == "real":
        return None
    settings = {k: v for k, v in unit.settings.items() if k != var}
    regions = SymbolicRegions(lambda v: symbolic_family(
        unit.path, var, v, overrides=settings, source=unit.source, device=resolve_gpu(unit.traced_for).properties(),
        max_iterations=unit.iterations, torch_version=unit.torch_version,
        world=World(unit.world_size) if unit.world_size else None))
    try:
        regions.trace_at(max(2, first))
    except NotSymbolic:
        return None
    return regions


def _estimated(unit: Unit, tr: Any) -> list[Row]:
    """A trace's rows, one per target."""
    from xmem_engine.estimate import estimate_trace

    rows = []
    for i, (gpu, conf) in enumerate(unit.targets):
        t1 = time.perf_counter()
        try:
            est = estimate_trace(tr, gpu, conf, torch_version=unit.torch_version)
        except Exception as e:
            rows.append(_failed(unit, gpu, conf, describe_error(e, unit.path)))
            continue
        row = _row(unit, "point", unit.settings, gpu, conf, est)
        row.seconds = (time.perf_counter() - t1) + (tr.seconds if i == 0 else 0.0)
        rows.append(row)
    return rows


class _TraceFailed(Exception):
    def __init__(self, value: int, error: BaseException):
        super().__init__(value)
        self.value, self.error = value, error


def _search_rows(unit: Unit) -> list[Row]:
    """The largest value of ``unit.search`` that fits, per target, by
    :func:`~xmem_engine.estimate.max_batch`; the traces of the values tried are shared by
    every target (a value traced for one GPU is re-simulated for the next)."""
    from xmem_engine.batch_family import branches_on
    from xmem_engine.estimate import estimate_trace, max_batch

    var = unit.search or ""
    traces: dict[int, Any] = {}

    def trace_at(v: int) -> Any:
        if v not in traces:
            try:
                traces[v] = _trace(unit, {**unit.settings, var: str(v)})
            except (Exception, SystemExit) as e:
                traces[v] = _TraceFailed(v, e)
        if isinstance(traces[v], _TraceFailed):
            raise traces[v]
        return traces[v]

    rows = []
    follow = branches_on(unit.source, var) is None  # values between two traces from their family
    regions = _symbolic_regions(unit, var, unit.start)  # shared by the targets: each traces once
    symbolic = regions.family_at if regions is not None else None
    for gpu, conf in unit.targets:
        t0 = time.perf_counter()
        try:
            search = max_batch(lambda v: estimate_trace(trace_at(v), gpu, conf, torch_version=unit.torch_version),
                               start=unit.start, safe=unit.safe, estimate_trace=(
                                   lambda tr: estimate_trace(tr, gpu, conf, torch_version=unit.torch_version)),
                               symbolic=symbolic, fit_family=follow)
        except _TraceFailed as e:
            rows.append(_failed(unit, gpu, conf, f"at {var}={e.value}: {describe_error(e.error, unit.path)}",
                                time.perf_counter() - t0))
            continue
        except Exception as e:
            rows.append(_failed(unit, gpu, conf, describe_error(e, unit.path), time.perf_counter() - t0))
            continue
        row = _row(unit, "max_batch", unit.settings, gpu, conf, search.estimate)
        row.max_value, row.answer = search.value, search.answer()
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    return rows


def _row(unit: Unit, kind: str, settings: dict[str, str], gpu: str, conf: str, est: Any) -> Row:
    """A row from the engine's estimate: every figure is the estimate's own."""
    return Row(kind=kind, script=unit.script, settings=dict(settings), gpu=gpu, alloc_conf=conf, status="ok",
               world_size=unit.world_size, fits=est.fits, fits_safely=est.fits_safely, peak_device_bytes=est.peak_device_bytes,
               peak_device_bytes_high=est.peak_range.high_bytes if est.peak_range else None,
               capacity_bytes=est.capacity_bytes, headroom_bytes=est.headroom_bytes,
               peak_allocated_bytes=est.peak_allocated_bytes, peak_reserved_bytes=est.peak_reserved_bytes,
               oom=est.oom, mode=str(est.mode), variable=unit.search or "", traced_for=unit.traced_for,
               torch_version=est.torch_version, seconds=est.simulate_seconds, trace_seconds=est.trace_seconds,
               simulate_seconds=est.simulate_seconds, notes=list(est.notes))


def _failed(unit: Unit, gpu: str, conf: str, error: str, seconds: float = 0.0) -> Row:
    return Row(kind="max_batch" if unit.search else "point", script=unit.script, settings=dict(unit.settings),
               gpu=gpu, alloc_conf=conf, status="failed", world_size=unit.world_size, variable=unit.search or "",
               traced_for=unit.traced_for,
               seconds=seconds, error=error)


def failed_rows(unit: Unit, error: str, seconds: float = 0.0) -> list[Row]:
    """Every point of ``unit`` failed for one reason (the trace failed, the worker died)."""
    return [_failed(u, g, c, error, seconds if i == 0 else 0.0) for u in unit.each()
            for i, (g, c) in enumerate(u.targets)]


def describe_error(e: BaseException, path: str) -> str:
    """One line: the exception, and the script's line it passed through last."""
    if isinstance(e, SystemExit):
        return f"the script exited with status {e.code}"
    line = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(e, SyntaxError) and e.filename == path:
        line = e.lineno
    where = f" (line {line} of {os.path.basename(path)})" if line else ""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}{where}" if text else f"{type(e).__name__}{where}"


# --------------------------------------------------------------------------- engines
Emit = Callable[[list[Row]], None]


def run_units(units: list[Unit], engine: str = "local", *, workers: int | None = None,
              address: str | None = None, emit: Emit = lambda rows: None) -> None:
    """Run ``units`` on ``engine``, calling ``emit`` with each unit's rows as it finishes
    (in the order they finish)."""
    if engine == "serial":
        for u in units:
            emit(run_unit(u))
    elif engine == "local":
        _run_local(units, workers, emit)
    elif engine == "ray":
        _run_ray(units, address, emit)
    else:
        raise SweepInputError(f"engine must be one of {ENGINES}, not {engine!r}")


def _worker_init() -> None:
    """Ctrl-C is the driver's to handle: it stops the workers itself."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_local(units: list[Unit], workers: int | None, emit: Emit) -> None:
    """A pool of worker processes (spawned: torch's threads do not survive a fork), one unit
    at a time each. A worker that dies (the out-of-memory killer, a crash) breaks the whole
    pool, and every unit still in it sees the break: those units run again each in a pool of
    its own (:func:`_run_isolated`), so only the unit that kills its worker is reported failed."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    n = max(1, min(workers or os.cpu_count() or 1, len(units)))
    threads = 1 if n > 1 else None
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
    retry: list[tuple[int, Unit]] = []
    try:
        futures = {pool.submit(run_unit, replace(u, threads=threads)): (i, u) for i, u in enumerate(units)}
        for fut in as_completed(futures):
            try:
                rows = fut.result()
            except BrokenProcessPool:
                i, unit = futures[fut]
                retry += [(i, u) for u in unit.each()]  # a family's values one by one: only the killer fails
                continue
            emit(rows)
    except BaseException:
        _terminate(pool)
        raise
    pool.shutdown(wait=True)
    if retry:
        _run_isolated([u for _, u in sorted(retry, key=lambda p: p[0])], n, threads, emit)


def _run_isolated(units: list[Unit], n: int, threads: int | None, emit: Emit) -> None:
    """Each unit in a one-worker pool of its own, ``n`` at a time: a worker that dies fails
    its own unit's points only."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    queue, running = list(units), {}
    try:
        while queue or running:
            while queue and len(running) < n:
                unit = queue.pop(0)
                pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker_init)
                running[pool.submit(run_unit, replace(unit, threads=threads))] = (unit, pool)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                unit, pool = running.pop(fut)
                try:
                    rows = fut.result()
                except BrokenProcessPool:
                    rows = failed_rows(unit, "the worker process died while tracing this point "
                                             "(out of host memory, or the script killed its process)")
                pool.shutdown(wait=True)
                emit(rows)
    except BaseException:
        for _, pool in running.values():
            _terminate(pool)
        raise


def _terminate(pool: Any) -> None:
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _run_ray(units: list[Unit], address: str | None, emit: Emit) -> None:
    """Ray tasks, one per unit, results taken as they finish. Connects to ``address``
    (``auto``, ``ray://host:10001``, ``host:6379``; None: Ray's default, which starts a
    local cluster when none runs) unless this process is connected already; a task that
    fails (its worker died) gives failed rows."""
    import logging

    try:
        import ray
    except ImportError:
        raise SweepInputError(RAY_HINT) from None
    ours = not ray.is_initialized()
    if ours:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as e:  # nothing there, a wrong token, a bad address, a local head slow to start
            what = f"cannot connect to the Ray cluster at {address}" if address else "the local Ray cluster did not start"
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise SweepInputError(
                f"{what}: {type(e).__name__}: {first}. Start one with `ray start --head` and pass --address auto "
                f"(or ray://HOST:10001 for a remote one), or sweep on this machine's cores with --engine local") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(run_unit)
        refs = {task.remote(replace(u, threads=1)): u for u in units}
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                for ref in ready:
                    unit = refs.pop(ref)
                    try:
                        rows = ray.get(ref)
                    except Exception as e:  # RayTaskError, WorkerCrashedError, ...
                        rows = failed_rows(unit, f"the Ray task failed: {type(e).__name__}: "
                                                 f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
                    emit(rows)
        except BaseException:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise
    finally:
        if ours:
            ray.shutdown()


# --------------------------------------------------------------------------- the API
def sweep(
    scripts: str | list[str],
    gpus: str | list[str],
    settings: dict[str, list[Any]] | list[str] | None = None,
    alloc_confs: list[str] | None = None,
    *,
    max_batch: str | None = None,
    mode: str = "auto",
    iterations: int | None = None,
    torch_version: str | None = None,
    safe: bool = False,
    exact: bool = False,
    world_sizes: list[int] | None = None,
    out: str | None = None,
    fresh: bool = False,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool | Callable[[int, int], None] = False,
) -> list[Row]:
    """Estimate every (script, ``settings`` values, GPU, allocator setting) and, with
    ``max_batch``, the largest value of that variable that fits per (script, GPU, other
    settings); return the rows in grid order.

    ``settings``: ``{"batch": [8, 16]}`` or ``--set`` strings (``["batch=8,16"]``). ``out``:
    a .csv / .json / .jsonl (JSON Lines) / .parquet file the rows are written to as they
    finish; points already in it are not run again (``fresh=True``: start it over).
    ``progress``: True for a progress bar on stderr, or a callable ``(done, total)``.
    ``exact``: trace for every GPU rather than re-simulate one trace: for attention, whose
    backend the trace picked for the first GPU's architecture (see the module's doc).
    ``world_sizes``: also cross these world sizes, each point rank 0 of a ``torchrun`` launch of
    that many processes (``xmem estimate --world-size``); rows carry ``world_size``.
    Ctrl-C raises :class:`SweepInterrupted` (a ``KeyboardInterrupt``) with the rows kept.
    The local engine spawns its workers, which import the caller's main module: in a script,
    call this under ``if __name__ == "__main__":`` (as any ``multiprocessing`` code).
    """
    if engine not in ENGINES:
        raise SweepInputError(f"engine must be one of {ENGINES}, not {engine!r}")
    if workers is not None and workers < 1:
        raise SweepInputError(f"--workers must be at least 1, not {workers}")
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise SweepInputError(RAY_HINT) from None
    if isinstance(settings, (list, tuple)):
        settings = parse_set(settings)
    grid = make_grid([scripts] if isinstance(scripts, str) else list(scripts),
                     [gpus] if isinstance(gpus, str) else list(gpus),
                     {k: [str(v) for v in vs] for k, vs in (settings or {}).items()}, alloc_confs,
                     max_batch=max_batch, mode=mode, iterations=iterations, torch_version=torch_version, safe=safe,
                     exact=exact, worlds=world_sizes)
    try:
        store = Output(out, Row, list(grid.settings), fresh=fresh) if out else None
    except OutputError as e:
        raise SweepInputError(str(e)) from None
    found: dict[tuple, Row] = {r.key: r for r in store.rows} if store else {}
    wanted = set(grid.keys())
    units = plan(grid, [k for k in found if k in wanted])
    total = sum(u.points for u in units)
    new: list[Row] = []
    bar = _Bar(progress, total)

    def emit(rows: list[Row]) -> None:
        if store is not None:
            store.append(rows)
        new.extend(rows)
        bar(len(rows), sum(r.status == "failed" for r in rows))

    try:
        run_units(units, engine, workers=workers, address=address, emit=emit)
    except KeyboardInterrupt:
        bar.close()
        raise SweepInterrupted(new, total - len(new)) from None
    bar.close()
    found.update((r.key, r) for r in new)
    return [found[k] for k in grid.keys() if k in found]


class _Bar:
    """A tqdm bar on stderr, or the caller's ``(done, total)`` callable, or nothing."""

    def __init__(self, progress: bool | Callable[[int, int], None], total: int):
        self.callback = progress if callable(progress) else None
        self.done, self.failed, self.total, self.tqdm = 0, 0, total, None
        if progress is True and total:
            from tqdm import tqdm

            self.tqdm = tqdm(total=total, unit="pt", desc="xmem sweep", dynamic_ncols=True)

    def __call__(self, n: int, failed: int) -> None:
        self.done += n
        self.failed += failed
        if self.tqdm is not None:
            self.tqdm.update(n)
            if self.failed:
                self.tqdm.set_postfix(failed=self.failed)
        if self.callback is not None:
            self.callback(self.done, self.total)

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
