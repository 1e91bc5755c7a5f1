"""Triton kernels launched from Python (Liger, TRL, Unsloth, a user's ``@triton.jit`` and
``@triton.autotune`` kernels) on the virtual GPU: recorded, never compiled or run.

Why it is enough: a Triton launch allocates nothing through PyTorch's caching allocator. Its
outputs are tensors the Python code made before the launch (``torch.empty_like``...), which the
trace has already recorded; the one exception is the global scratch a kernel asks of the
allocator given to ``triton.set_allocator`` (device-side TMA descriptors), which is routed to
that allocator here as the launcher would (:func:`_scratch`). Compiling needs a CUDA driver, and
there is no CPU Triton, so a launch whose tensors belong to the trace (fake tensors, or real
CPU tensors standing for GPU ones) only counts, per kernel, and the trace's notes say so.

What a kernel computes is unknown. Triton does not declare which arguments a kernel writes;
its source says: the pointers that reach ``tl.store`` / ``tl.atomic_*`` (or a descriptor's
``store``) are followed back to the parameters they derive from (:func:`written_params`),
and where the source cannot tell, every tensor the kernel is given counts as written. In fake
mode what was known of a written tensor is forgotten (its shadow, ``shadow_values.py``; its
last known value and maker, ``guesses.py``), so later reads are guessed like any value at the
leaves of a chain; tensors it only reads (labels, ids) keep their known values. In real mode
the tensors keep what they held (``torch.empty``'s leftovers for a fresh output): real mode
cannot compute them either, and memory does not depend on them.

The patch sits on the narrowest points every Triton 3.x release has: ``JITFunction.run`` (what
``kernel[grid](...)`` calls, and what ``@triton.heuristics`` and ``@triton.autotune`` end in),
``Autotuner.run`` (its benchmarking would launch every config and time it with CUDA events: the
first config left after the kernel's own pruning is taken instead, and what the timing
allocates is allocated: :func:`_benchmark_allocations`) and, under
``TRITON_INTERPRET=1``, ``InterpretedFunction.run``; ``torch.library.triton_op``'s kernels
(``wrap_triton``) are counted where torch turns them into a higher-order op that fake tensors
run as a no-op. Triton imported while the trace runs (a library importing it lazily) is
patched as its modules load. A launch on tensors the trace does not own (plain CPU tensors,
outside the virtual GPU) goes to Triton as before, and fails as before. Everything is put back
when the trace ends, the allocator the traced code gave ``triton.set_allocator`` included.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.compiler.inductor_autotune import timed_calls

# Global scratch one device-side tensor descriptor (``tl.make_tensor_descriptor``) takes, per
# program: a CUtensorMap is 128 bytes, 128-byte aligned (Triton's TMA lowering).
TMA_DESCRIPTOR_BYTES = 128
# The buffer triton.testing.do_bench zeroes between timed calls (the NVIDIA driver's
# get_empty_cache_for_benchmark): an autotuned kernel's first launch on a new key allocates it.
TRITON_FLUSH_BYTES = 256 * 1024 * 1024
MAX_KERNEL_NOTES = 8  # kernels named in the notes, most launched first

# module -> (class, method) patched when that module is loaded
_TARGETS = {
    "triton.runtime.jit": ("JITFunction", "run"),
    "triton.runtime.autotuner": ("Autotuner", "run"),
    "triton.runtime.interpreter": ("InterpretedFunction", "run"),
    # torch.library.triton_op's kernels (wrap_triton): under fake tensors they reach a
    # higher-order op that does nothing, not JITFunction.run; they are counted here
    "torch._higher_order_ops.triton_kernel_wrap": ("TraceableTritonKernelWrapper", "__call__"),
}


@dataclass
class KernelLaunches:
    """The launches of one kernel in a trace."""

    name: str
    source: str  # the file that defines it, from site-packages on
    count: int = 0
    scratch_bytes: int = 0  # set_allocator scratch asked for, over all launches

    def note(self) -> str:
        times = "once" if self.count == 1 else f"{self.count:,} times"
        where = f" ({self.source})" if self.source else ""
        scratch = f", {self.scratch_bytes:,} bytes of set_allocator scratch" if self.scratch_bytes else ""
        return f"Triton kernel {self.name}{where} launched {times}{scratch}"


NOTE_HEADLINE = ("Triton kernels are recorded, not compiled or run (no CPU Triton): the tensors they are "
                 "given are allocated as traced; {values}")
VALUES = {True: "the values they compute are unknown (guessed)",
          False: "the values they would compute are not computed (their outputs keep what they held)"}


class Launches:
    """What one trace's Triton launches did: kernels by name; which launches were the trace's."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self.kernels: dict[tuple[str, str], KernelLaunches] = {}
        self.notes: list[str] = []  # one-off remarks (a warmup, scratch that could not be sized)
        self.analysed: dict[int, tuple[Any, Any]] = {}  # kernel id -> (kernel, the parameters it writes)
        self.counted = 0  # >0 inside a wrap_triton launch that was counted already
        self.timed: dict[int, set] = {}  # autotuner id -> the keys whose configs were timed

    # ------------------------------------------------------------------ which launches
    def traced_tensors(self, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        """The tensors among a launch's arguments, if one of them belongs to the trace (a fake
        tensor, or a storage on the virtual GPU); None for a launch on tensors it does not own."""
        tensors: list[torch.Tensor] = []
        _collect(args, tensors, 0)
        _collect(tuple(kwargs.values()), tensors, 0)
        tr = self.tracer
        fake = _fake_type() if tr.fake else None
        if any((fake is not None and isinstance(t, fake)) or tr.is_gpu(t) for t in tensors):
            return tensors
        return None

    # ------------------------------------------------------------------ recording
    def launched(self, kernel: Any, tensors: list[torch.Tensor], scratch: int = 0) -> None:
        """Count a launch of ``kernel`` and forget what the tensors it was given held."""
        fn = _python_function(kernel)
        name = getattr(fn, "__name__", None) or type(kernel).__name__
        source = _library_path(getattr(getattr(fn, "__code__", None), "co_filename", ""))
        rec = self.kernels.get((name, source))
        if rec is None:
            rec = self.kernels[(name, source)] = KernelLaunches(name, source)
        rec.count += 1
        rec.scratch_bytes += scratch
        self.written(tensors)

    def written(self, tensors: list[torch.Tensor]) -> None:
        """A kernel may have written any of ``tensors``: in fake mode what was known of their
        values goes, the shadow (``shadow_values.py``), and in the guesses both the last known
        value and the op that made a small one (``guesses.py``). A later read is then guessed
        as a value at the leaves of a chain is: ones. Keeping the last known value, as aten
        ops that write unknown values do, would turn the placeholders a kernel fills into the
        guess: an online softmax starts at -inf and sums from zeros, and ``log`` of them
        would make a finite loss look like an overflow that skips the optimizer step."""
        tr = self.tracer
        shadows, guesses = getattr(tr, "shadows", None), getattr(tr, "guesses", None)
        if shadows is None:
            return  # real mode: the tensors keep what they held
        fake = _fake_type()
        written = [t for t in tensors if isinstance(t, fake)]
        if shadows.by_storage:
            shadows._forget((written,), {})
        if guesses is None:
            return
        for t in written:
            guesses.overwritten(t.untyped_storage()._cdata)

    def counts(self) -> dict[tuple[str, str], int]:
        """Launches so far by kernel (name, source): what a made decode step adds to
        (``decode_forms``)."""
        return {key: k.count for key, k in self.kernels.items()}

    def add(self, key: tuple[str, str], count: int) -> None:
        """``count`` launches of the kernel ``key`` that were not run (a made decode step's)."""
        rec = self.kernels.get(key)
        if rec is None:
            rec = self.kernels[key] = KernelLaunches(*key)
        rec.count += count

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def all_notes(self) -> list[str]:
        if not self.kernels:
            return list(self.notes)
        ranked = sorted(self.kernels.values(), key=lambda k: -k.count)
        headline = NOTE_HEADLINE.format(values=VALUES[bool(self.tracer.fake)])
        lines = [headline] + [k.note() for k in ranked[:MAX_KERNEL_NOTES]]
        if len(ranked) > MAX_KERNEL_NOTES:
            rest = ranked[MAX_KERNEL_NOTES:]
            lines.append(f"... and {len(rest)} more Triton kernels, {sum(k.count for k in rest):,} launches")
        return lines + self.notes


def _fake_type() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def _collect(values: tuple | list, out: list[torch.Tensor], depth: int) -> None:
    """Tensors among launch arguments: plain, in tuples (Triton 3 takes tuples of pointers), and
    behind Triton's wrappers (``triton.reinterpret``'s ``TensorWrapper``, a host-side
    ``TensorDescriptor``), which hold theirs as ``base``."""
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)) and depth < 4:
            _collect(v, out, depth + 1)
        else:
            base = getattr(v, "base", None)
            if isinstance(base, torch.Tensor):
                out.append(base)


def _python_function(kernel: Any) -> Any:
    """The Python function behind a JITFunction / Autotuner / Heuristics chain."""
    fn = kernel
    for _ in range(8):
        inner = getattr(fn, "fn", None)
        if inner is None:
            break
        fn = inner
    return fn


def _library_path(filename: str) -> str:
    """``liger_kernel/ops/rms_norm.py`` for a file in site-packages; the base name otherwise."""
    if not filename:
        return ""
    marker = "site-packages" + os.sep
    i = filename.rfind(marker)
    return filename[i + len(marker):] if i >= 0 else os.path.basename(filename)


# ---------------------------------------------------------------------- which arguments a kernel writes
# Triton's functions and tensor methods that write memory through their first argument (or
# through the descriptor / pointer they are called on).
WRITES = frozenset({
    "store", "store_tensor_descriptor", "_experimental_descriptor_store", "scatter",
    "atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
})
_POINTER_KEYWORDS = ("pointer", "ptr", "desc", "base")


def written_params(kernel: Any, cache: dict[int, tuple[Any, Any]] | None = None,
                   depth: int = 0) -> frozenset[str] | None:
    """The parameters of a ``@triton.jit`` kernel it may write through: those a pointer passed
    to ``tl.store`` / ``tl.atomic_*`` (or a descriptor's ``store``, or a helper ``@triton.jit``
    function that writes) can derive from. None when the source cannot tell (no source, a
    call it cannot follow): every tensor then counts as written.

    Why: treating every argument as written would make the labels and ids a loss kernel only
    reads unknown, and later branches on them guesses. The analysis over-approximates: a name
    assigned from an expression that mentions a parameter may point into it, whatever the
    expression (a pointer loaded from memory included); control flow is ignored."""
    cache = {} if cache is None else cache  # id -> (kernel, result), for one trace
    cached = cache.get(id(kernel))
    if cached is not None and cached[0] is kernel:
        return cached[1]
    cache[id(kernel)] = (kernel, None)  # a recursive helper: unknown while it is analysed
    try:
        result = _analyse(kernel, cache, depth)
    except Exception:  # source that is not plain Python (a generated kernel): no analysis
        result = None
    cache[id(kernel)] = (kernel, result)
    return result


def _analyse(kernel: Any, cache: dict[int, tuple[Any, Any]], depth: int) -> frozenset[str] | None:
    import ast
    import builtins
    import inspect
    import textwrap

    fn = _python_function(kernel)
    src, params = getattr(kernel, "src", None), list(getattr(kernel, "arg_names", ()) or ())
    if not isinstance(src, str) and inspect.isfunction(fn):
        src = inspect.getsource(fn)  # the interpreter's kernels keep no source of their own
    if not isinstance(src, str) or not params or depth > 4:
        return None
    tree = ast.parse(textwrap.dedent(src))
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(defs) != 1:
        return None
    body = defs[0]
    glob = getattr(fn, "__globals__", {}) or {}
    alias: dict[str, set[str]] = {p: {p} for p in params}

    def names(node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    def names_outside_loads(node: ast.AST) -> set[str]:
        """Names an expression's value may point through: not those only read by a ``load``
        (the value loaded is data, not a pointer; unless it is cast to one, ``pointer_type``)."""
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and \
                (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "load":
            return set()
        if isinstance(node, ast.Name):
            return {node.id}
        out: set[str] = set()
        for child in ast.iter_child_nodes(node):
            out |= names_outside_loads(child)
        return out

    def points_into(node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        found = names(node) if "pointer_type" in ast.unparse(node) else names_outside_loads(node)
        out: set[str] = set()
        for n in found:
            out |= alias.get(n, set())
        return out

    flows: list[tuple[ast.AST, ast.AST]] = []  # (target, value): the target may point where the value does
    for n in ast.walk(body):
        if isinstance(n, ast.Assign):
            flows += [(t, n.value) for t in n.targets]
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and n.value is not None:
            flows.append((n.target, n.value))
        elif isinstance(n, (ast.For, ast.comprehension)):
            flows.append((n.target, n.iter))
        elif isinstance(n, ast.NamedExpr):
            flows.append((n.target, n.value))
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            flows.append((n.optional_vars, n.context_expr))
    changed = True
    while changed:
        changed = False
        for target, value in flows:
            src_params = points_into(value)
            if not src_params:
                continue
            for name in names(target):
                have = alias.setdefault(name, set())
                if not src_params <= have:
                    have |= src_params
                    changed = True

    def resolve(func: ast.AST) -> Any:
        """What a called name is in the kernel's module (None if local or unknown)."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id in alias:
            return None
        obj = glob[func.id] if func.id in glob else getattr(builtins, func.id, None)
        for part in reversed(parts):
            obj = getattr(obj, part, None)
        return obj

    written: set[str] = set()
    for call in (n for n in ast.walk(body) if isinstance(n, ast.Call)):
        func = call.func
        attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        target = resolve(func)
        module = getattr(target, "__module__", "") or ""
        if isinstance(func, ast.Attribute) and target is None:
            # a method of a value (x.to(dtype)), a pointer or a descriptor (desc.store(...))
            if attr in WRITES:
                written |= points_into(func.value)
            continue
        if attr in WRITES and (target is None or _triton_own(module)):
            pointer = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg in _POINTER_KEYWORDS), None)
            if pointer is None:
                return None
            written |= points_into(pointer)
            continue
        passed = [a for a in call.args if points_into(a)] + [k for k in call.keywords if points_into(k.value)]
        if not passed:
            continue
        if _triton_own(module) or type(target).__name__ in ("builtin_function_or_method", "type"):
            continue  # Triton's own functions other than WRITES (tl.load, triton.cdiv), range, min: they read
        if _is_jit(target):  # a helper kernel: what it writes, through the arguments given to it
            inner = written_params(target, cache, depth + 1)
            if inner is None:
                return None
            inner_names = list(getattr(target, "arg_names", ()) or ())
            for i, a in enumerate(call.args):
                if i < len(inner_names) and inner_names[i] in inner:
                    written |= points_into(a)
            for k in call.keywords:
                if k.arg in inner:
                    written |= points_into(k.value)
            continue
        return None  # a call it cannot follow, given pointers: anything may be written
    return frozenset(written)


def _triton_own(module: str) -> bool:
    return module == "triton" or module.startswith("triton.")


def _is_jit(obj: Any) -> bool:
    return any(c.__name__ in ("JITFunction", "InterpretedFunction", "JITCallable") for c in type(obj).__mro__)


def _written_tensors(launches: "Launches", kernel: Any, args: tuple, kwargs: dict,
                     tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The launch's tensors the kernel may write (all of them when that is not known)."""
    params = written_params(kernel, launches.analysed)
    if params is None:
        return tensors
    out: list[torch.Tensor] = []
    names = list(getattr(kernel, "arg_names", ()) or ())
    for name, value in [*zip(names, args), *kwargs.items()]:
        if name in params:
            _collect((value,), out, 0)
    return out


# ---------------------------------------------------------------------- set_allocator scratch
def _descriptors_made(kernel: Any) -> int:
    """How many device-side tensor descriptors the kernel's source makes (each needs global
    scratch from ``triton.set_allocator``'s allocator); 0 when the source is not at hand."""
    src = getattr(kernel, "src", None)
    if not isinstance(src, str):
        return 0
    return src.count("make_tensor_descriptor(")


def _scratch(launches: Launches, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> int:
    """Ask ``triton.set_allocator``'s allocator for the scratch the launcher would (per program,
    times the grid), and let it go after the launch, as the launcher does. The allocator is the
    user's code (``torch.empty(size, device="cuda", dtype=torch.int8)`` as a rule), so the trace
    records what it allocates. Returns the bytes asked for."""
    per_program = _descriptors_made(kernel) * TMA_DESCRIPTOR_BYTES
    if not per_program:
        return 0
    name = getattr(_python_function(kernel), "__name__", "?")
    try:
        from triton.runtime import _allocation

        allocator = _allocation._allocator.get()
        if isinstance(allocator, _allocation.NullAllocator):
            return 0  # on a GPU the launch fails with Triton's own error; the estimate does not need it
        named = dict(zip(getattr(kernel, "arg_names", ()), args))
        named.update(kwargs)
        if callable(grid):
            grid = grid(named)
        programs = 1
        for g in tuple(grid)[:3]:
            programs *= int(g)
        ctas = int(kwargs.get("num_ctas", 1) or 1)
    except Exception as e:  # a grid that needs what only the compiled kernel knows
        launches.note(f"Triton kernel {name}: its set_allocator scratch was not counted ({type(e).__name__}: {e})")
        return 0
    size = programs * ctas * per_program
    buf = allocator(size, TMA_DESCRIPTOR_BYTES, None)
    del buf  # the launcher holds it for the launch only
    return size


# ---------------------------------------------------------------------- the patched methods
def _jit_run(launches: Launches, orig: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        tensors = launches.traced_tensors(args, kwargs)
        if tensors is None:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup:  # compiling ahead of time: nothing to compile, nothing launched
            name = getattr(_python_function(self), "__name__", "?")
            launches.note(f"Triton kernel {name}: warmup() was given traced tensors; it compiles nothing here "
                          "and returns None")
            return None
        for hook in getattr(self, "pre_run_hooks", ()):  # Python hooks on the arguments, as Triton runs them
            hook(*args, **kwargs)
        if not launches.counted:
            scratch = _scratch(launches, self, grid, args, kwargs)
            launches.launched(self, _written_tensors(launches, self, args, kwargs, tensors), scratch)
        return None  # Triton returns the compiled kernel, which does not exist here

    run.__wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _benchmark_allocations(launches: "Launches", tuner: Any, args: tuple, kwargs: dict) -> None:
    """What timing the configs allocates on the GPU, the first time a key is seen (``Autotuner.run``
    -> ``_bench`` -> ``triton.testing.do_bench``): copies of the ``restore_value`` arguments, made
    before each timed call and dropped after it, and the 256 MiB buffer ``do_bench`` zeroes
    between calls to flush the L2 (``get_empty_cache_for_benchmark``; 268,435,456 B requests on an
    H200, one per config). Each config allocates the same, in blocks the caching allocator keeps:
    once is what the peak and the reserved memory see."""
    named = {**dict(zip(tuner.arg_names, args)), **kwargs}
    key = tuple(named.get(k) for k in getattr(tuner, "keys", ()))
    key += tuple(str(a.dtype) for a in named.values() if hasattr(a, "dtype"))
    seen = launches.timed.get(id(tuner))
    if seen is None:  # (keyed by id: the record goes with the tuner, whose id the next one may get)
        seen = launches.timed[id(tuner)] = set()
        weakref.finalize(tuner, launches.timed.pop, id(tuner), None)
    if key in seen:
        return
    seen.add(key)
    restore = [named[n] for n in getattr(tuner, "restore_value", ()) if isinstance(named.get(n), torch.Tensor)]
    timed_calls(lambda: [t.clone() for t in restore], TRITON_FLUSH_BYTES)


def _autotuner_run(launches: Launches, orig: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if launches.traced_tensors(args, kwargs) is None:
            return orig(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.configs
            prune = getattr(self, "early_config_prune", None)
            if len(configs) > 1 and prune is not None:
                configs = prune(configs, self.nargs, **kwargs) or configs
            if len(configs) > 1:
                _benchmark_allocations(launches, self, args, kwargs)
            config = configs[0]  # no timing without a GPU: which config wins does not change memory
            self.best_config = config  # read by some callers (Liger's fused SwiGLU backward)
            if config.pre_hook is not None:
                config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            self.nargs = None

    run.__wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _wrap_triton_call(launches: Launches, orig: Callable[..., Any]) -> Callable[..., Any]:
    try:
        from torch._library.triton import is_wrap_triton_enabled
    except ImportError:  # a torch whose wrapper always launches the kernel itself: counted there
        return orig

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        kernel = getattr(self, "kernel", None)
        tensors = launches.traced_tensors(args, kwargs) if kernel is not None and is_wrap_triton_enabled() else None
        if tensors is None:
            return orig(self, *args, **kwargs)
        jit = kernel
        while not _is_jit(jit) and getattr(jit, "fn", None) is not None:  # through autotune / heuristics
            jit = jit.fn
        launches.launched(jit, _written_tensors(launches, jit, args, kwargs, tensors))
        launches.counted += 1
        try:
            return orig(self, *args, **kwargs)  # the higher-order op, as torch traces it
        finally:
            launches.counted -= 1

    call.__wrapped__ = orig  # type: ignore[attr-defined]
    return call


_WRAPPERS = {"JITFunction": _jit_run, "InterpretedFunction": _jit_run, "Autotuner": _autotuner_run,
             "TraceableTritonKernelWrapper": _wrap_triton_call}


class _Patcher:
    """Triton's classes patched for the trace (as their modules load: ``patches.on_import``),
    and put back exactly after."""

    def __init__(self, launches: Launches):
        self.launches = launches
        self.undo: list[tuple[type, str, Any, bool]] = []

    def patch(self, module: Any) -> None:
        cls_name, method = _TARGETS[module.__name__]
        cls = getattr(module, cls_name, None)
        if cls is None or any(c is cls for c, *_ in self.undo):
            return
        had = method in vars(cls)
        orig = getattr(cls, method)
        self.undo.append((cls, method, vars(cls).get(method), had))
        setattr(cls, method, _WRAPPERS[cls_name](self.launches, orig))

    def unpatch(self) -> None:
        for cls, method, old, had in reversed(self.undo):
            if had:
                setattr(cls, method, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(cls, method)
        self.undo.clear()


@contextlib.contextmanager
def triton_launches(tracer: Any) -> Iterator[Launches]:
    """For the trace's duration: Triton launches on the trace's tensors are counted and their
    arguments treated as written, with no driver; the notes name each kernel. The counts are the
    tracer's ``triton`` meanwhile (a made decode step adds its launches: ``decode_replay``)."""
    from xmem_engine.tracing.patches import on_import

    launches = tracer.triton = Launches(tracer)
    patcher = _Patcher(launches)
    allocation = sys.modules.get("triton.runtime._allocation")
    allocator = allocation._allocator.get() if allocation is not None else None
    try:
        with on_import(_TARGETS, patcher.patch):
            yield launches
    finally:
        patcher.unpatch()
        del tracer.triton
        _restore_allocator(allocator)
        tracer.notes.extend(launches.all_notes())


def _restore_allocator(allocator: Any) -> None:
    """``triton.set_allocator`` in the traced code is process-wide state (a context variable):
    put back the allocator that was set before (none: Triton's default, which refuses)."""
    allocation = sys.modules.get("triton.runtime._allocation")
    if allocation is None:
        return
    if allocator is None:
        allocator = allocation.NullAllocator()
    if allocation._allocator.get() is not allocator:
        allocation._allocator.set(allocator)
