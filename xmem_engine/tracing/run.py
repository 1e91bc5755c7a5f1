"""Entry point of the tracing wing: :func:`trace` runs user code and returns a :class:`Trace`.

It builds a :class:`Tracer`, installs everything that makes the virtual device
(:func:`recording`), runs the code once or twice (``auto``: fake, then real if fake mode
cannot go on), and leaves the user's namespace and objects as they were (see
``tracing/__init__.py``, "What persists in a namespace").
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import gc
import io
import linecache
import logging
import os
import sys
import time
import types
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.utils.data
from torch.nn.parameter import UninitializedTensorMixin

from xmem_engine.gpus.cuda_libraries import runs_convolutions, runs_ffts, target_version
from xmem_engine.trace import MODES, Mode, Trace
from xmem_engine.tracing.alloc_mode import AllocMode
from xmem_engine.tracing.device_mode import DeviceMode, fake_device_property
from xmem_engine.tracing.shims.distributed import World, simulated_world
from xmem_engine.tracing.errors import (
    HostMemoryError,
    NeedsRealValues,
    StopTracing,
    UnsupportedOpError,
    made_before_the_trace,
    needs_real_gpu,
)
from xmem_engine.tracing.frames import count_as_user, entry_point, run_user_code, trim_traceback
from xmem_engine.tracing.shims.generation import generation_in_fake_mode
from xmem_engine.tracing.symbolic import symbolic_tracing
from xmem_engine.tracing.shims.transformers_tracing import fake_tensors_are_not_traced
from xmem_engine.tracing.patches import (
    INIT_FUNCTIONS,
    appended,
    cudnn_refused,
    fake_parameter_new,
    fake_tensor_as_parameter_class,
    fresh_singletons,
    in_process_iterator,
    logger_level,
    mkldnn_disabled,
    module_apply,
    storage_from_buffer,
    on_import,
    outside_mode,
    patched_attr,
    real_mode_for_lazy_modules,
    restore_default_device,
    skip_init,
    storage_resize,
    checkpoint_metadata,
    patched_item,
    ProcessExit,
    ScriptEnd,
)
from xmem_engine.tracing.shims.bitsandbytes_shim import bitsandbytes_on_gpu
from xmem_engine.tracing.shims.checkpoints import kept_in_memory
from xmem_engine.tracing.shims.data_parallel import data_parallel_on_gpu
from xmem_engine.tracing.shims.flash_attention import flash_attn_on_gpu
from xmem_engine.tracing.shims.legacy_types import legacy_tensor_types
from xmem_engine.tracing.shims.scalar_arguments import numbers_from_fake_tensors
from xmem_engine.tracing.fake.guesses import GUESS_HEADLINE, Guesses
from xmem_engine.tracing.steady import bind as steady_bind, steady_code
from xmem_engine.tracing.host_memory import ENV as HOST_ENV, HostBudget, HostMemoryExceeded, gib
from xmem_engine.tracing.fake.out_metas import out_variant_metas
from xmem_engine.tracing.fake.shadow_values import Shadows
from xmem_engine.tracing.compiler.mode_stacks import saved_hooks_yielding
from xmem_engine.tracing.compiler.torch_compile import COMPILE_MODES, CompiledCalls, standing_in_for_main
from xmem_engine.tracing.tracer import Tracer
from xmem_engine.tracing.shims.profiler import profiler_on_the_host
from xmem_engine.tracing.shims.batch_size_search import batch_size_search, without_failed_tries
from xmem_engine.tracing.oom_tries import marked_functions, note as oom_note, oom_tries
from xmem_engine.tracing.shims.hub_uploads import hub_writes_held_back
from xmem_engine.tracing.shims.threads import threads_in_the_trace
from xmem_engine.tracing.shims.triton_launches import triton_launches
from xmem_engine.tracing.shims.triton_absent import hint_missing_triton, note_fallbacks
from xmem_engine.tracing.shims.unsloth_checks import unsloth_checks
from xmem_engine.tracing.user_state import UserState, is_plain
from xmem_engine.tracing.virtual_cuda import patched_cuda


@entry_point
def trace(
    code: Callable[[], Any] | str | types.CodeType,
    namespace: dict | None = None,
    *,
    mode: str = "auto",
    allocator: Any = None,
    device: dict | None = None,
    filename: str = "<cell>",
    setup: Iterable[Callable[[Tracer], Any]] = (),
    max_iterations: int | None = None,
    torch_version: str | None = None,
    world: World | None = None,
    compile: str | None = None,
    steps: int | None = 1,
) -> Trace:
    """Run ``code`` (a no-argument callable, or source text / a compiled code object executed
    in a copy of ``namespace``) as if on a CUDA GPU; return the trace of its GPU memory requests.

    ``mode``: "fake" (FakeTensorMode), "real" (real CPU tensors) or "auto" (fake, then real
    if the code needs tensor values; ``trace.meta["fallback"]`` says why). ``allocator``:
    the simulated caching allocator that answers ``torch.cuda.memory_*`` (a fresh
    ``CachingAllocator`` if None). ``device``: the target GPU's properties (see
    ``virtual_cuda.DEFAULT_DEVICE``). ``setup``: callables given the :class:`Tracer` before
    the code runs (to add op hooks or events); ``sys.exit(0)`` in the code ends it normally.
    ``torch_version``: the PyTorch release the GPU run will use, where its composite ops
    lower differently from the installed one (einsum before 2.9: ``einsum_lowering.py``).
    ``max_iterations``: stop the code when
    iteration ``max_iterations`` would start (``trace.meta["stopped"]`` is then True): a
    long training loop costs only the iterations that show its steady state.
    ``compile``: what ``torch.compile`` does in the code: "inductor" (compile for the target
    GPU, where this torch can: ``torch_compile.py``) or "eager" (run compiled code eagerly, to
    compare); None: ``$XMEM_COMPILE``, else "inductor".
    ``steps``: for source text, how many times its training step runs (``steady.py``): 1 as
    written; None the steady state (a code that runs one step runs it twice, the model and
    optimizer built once); N the step N times.
    ``world``: the distributed rank to trace (``distributed.World``: world size, rank): the
    code sees torchrun's environment for it, and its ``init_process_group`` makes torch's
    fake process group of that size. Without it the environment is left alone, and a group
    the code makes has one rank.

    ``trace.meta``: ``device`` (the target GPU's name), ``iterations`` (how many started),
    ``stopped`` (``max_iterations`` cut the code short), ``fallback`` (auto mode only: why
    fake mode gave way to real mode). Tracing patches process-wide torch attributes for its
    duration: do not run other torch code in other threads meanwhile. Exceptions of the user's code propagate
    unchanged, with the traceback starting at the user's code.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if max_iterations is not None and max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, not {max_iterations}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if isinstance(code, str):
        compiled = steady_code(code, filename, steps)
        if filename.startswith("<"):
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        code = compiled
    elif not isinstance(code, types.CodeType) and not callable(code):
        raise TypeError(f"code must be a callable or source text, not {type(code).__name__}")
    if isinstance(code, types.CodeType) and not code.co_filename.startswith("<"):
        count_as_user(code.co_filename)  # the script is the user's, wherever it lives
    setup = [*setup, steady_bind]  # a steady-state loop (steady_code, cellcode) reads the iterations
    compile = compile or os.environ.get("XMEM_COMPILE") or "inductor"
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, not {compile!r}")
    if compile != "inductor":
        setup = [*setup, lambda t: setattr(t, "compile_mode", compile)]
    try:
        if torch_version is not None:
            target = target_version(torch_version)

            def aim(t: Tracer, target: tuple[int, int] = target) -> None:
                # The GPU run's PyTorch: its lowerings and its CUDA kernels' buffer rules.
                t.torch_target = target
                t.cuda_device = dataclasses.replace(t.cuda_device, torch_version="%d.%d" % target)

            setup = [*setup, aim]
        return _trace_modes(code, namespace, mode, allocator, device, setup, max_iterations, world)
    except BaseException as e:
        if not trim_traceback(e):
            raise
        hint_missing_triton(e)
        unsupported = needs_real_gpu(e, mode) or made_before_the_trace(e)
        if unsupported is not None:
            raise unsupported from e
        raise e  # the user's exception, its traceback starting at the user's code


def _trace_modes(code: Any, namespace: dict | None, mode: str, allocator: Any, device: dict | None,
                 setup: Iterable[Callable[[Tracer], Any]], max_iterations: int | None, world: World | None) -> Trace:
    setup = list(setup)
    before = dict(namespace) if namespace is not None else None  # (an exhausted search runs the code again from it)
    attempts = [Mode.FAKE, Mode.REAL] if mode == Mode.AUTO else [Mode(mode)]
    fallback = ""
    needed = 0
    for attempt in attempts:
        budget = HostBudget.now() if attempt == Mode.REAL else None
        if budget is not None and fallback and needed > budget.available_bytes:
            raise HostMemoryError(
                f"{fallback.removesuffix('; traced in real mode')}, and real mode would need more than "
                f"{gib(needed)} of host memory for its tensors, with {gib(budget.available_bytes)} available: "
                f"it was not started. {_more_memory()}, or change that line so that fake mode can run it")
        failed: HostMemoryExceeded | None = None
        try:
            tr = _trace_once(code, namespace, attempt, allocator, device, setup, max_iterations, world, budget)
        except HostMemoryExceeded as e:
            failed = e.with_traceback(None)  # its frames hold the real tensors: let them go now
        except NeedsRealValues as e:
            if attempt == Mode.FAKE and mode == Mode.AUTO:
                at = f" at {e.where}" if e.where else ""
                fallback = f"fake mode cannot run {e.op}{at} ({e.reason}); traced in real mode"
                needed = e.gpu_bytes
                if allocator is not None:  # the aborted attempt's blocks are back; forget its peaks
                    allocator.reset_peak_stats()
                    getattr(allocator, "reset_accumulated_stats", lambda: None)()
                continue
            raise UnsupportedOpError(e.op, attempt, e.reason, e.where) from None
        if failed is not None:
            at = f" at {failed.where}" if failed.where else ""
            gc.collect()
            raise HostMemoryError(
                f"real mode was stopped{at}: its tensors would take this process past {gib(failed.budget)} "
                f"of host memory, all it has to spare. Nothing was killed. {_more_memory()}, or estimate in "
                "fake mode (--mode fake)")
        if fallback:
            tr.meta["fallback"] = fallback
        if tr.meta.pop("exhausted_searches", None):  # every try ran out of memory (oom_tries.py)
            if allocator is not None:
                allocator.reset_peak_stats()
            # the code run again from the namespace it started with (a copy: what the user sees
            # is the first run's, the GPU's), its output kept back
            with contextlib.redirect_stdout(io.StringIO()):
                again = _trace_once(code, before, attempt, allocator, device, [*setup, _unlimited],
                                    max_iterations, world, budget)
            return _without_the_limit(tr, again)
        return tr
    raise AssertionError("unreachable")  # pragma: no cover


def _unlimited(tracer: Tracer) -> None:
    """The trace after an exhausted search: its tries run whole (``oom_tries.py``)."""
    tracer.oom_tries_off = True


def _without_the_limit(tr: Trace, again: Trace) -> Trace:
    """``again``, the trace after a search none of whose tries ran (its tries run whole), with
    the first trace's searches in its notes and ``batch_size_search``."""
    searches = tr.meta["batch_size_search"]
    again.meta["notes"] = [oom_note(s) for s in searches] + again.meta.get("notes", [])
    again.meta["batch_size_search"] = searches + again.meta.get("batch_size_search", [])
    again.meta.update({k: v for k, v in tr.meta.items() if k == "fallback"})
    return again


def _more_memory() -> str:
    import os

    cap = os.environ.get(HOST_ENV)
    return f"Raise {HOST_ENV} (now {cap}) or free memory" if cap else "Free memory or use a machine with more"


def _user_roots(code: Any, namespace: dict | None) -> list[Any]:
    """Where the user's objects start: the namespace's values, and a callable to trace
    (``user_state`` follows a function's closure, defaults and the globals it names)."""
    roots: list[Any] = [v for k, v in (namespace or {}).items() if not k.startswith("__")]
    if callable(code) and not isinstance(code, types.CodeType):
        roots.append(code)
    return roots


MAX_GUESS_NOTES = 8  # guesses listed in the notes; the trace's meta has them all
_NO = object()
def _trace_once(code: Any, namespace: dict | None, mode: str, allocator: Any, device: dict | None,
                setup: list[Callable[[Tracer], Any]], max_iterations: int | None, world: World | None,
                budget: HostBudget | None = None) -> Trace:
    tracer = Tracer(mode, allocator, device, max_iterations, world)
    tracer.host_budget = budget
    for fn in setup:
        fn(tracer)
    is_source = isinstance(code, types.CodeType)
    scratch: dict | None = None
    main: types.ModuleType | None = None
    if is_source:
        scratch = dict(namespace or {})
        scratch.setdefault("__name__", "__main__")
        scratch.setdefault("__builtins__", builtins)
        if scratch["__name__"] == "__main__":
            # The code's globals are ``sys.modules["__main__"]``'s while it runs, as ``python
            # SCRIPT`` (and runpy) has them: Dynamo guards a compiled function's globals through
            # that module ("module '__main__' has no attribute 'CKPT'"), pickle finds classes there.
            main = types.ModuleType("__main__")
            main.__dict__.update(scratch)
            scratch = main.__dict__
    state = UserState.capture(_user_roots(code, namespace))
    tracer.user_state = state
    persist: dict[str, Any] = {}
    start = time.perf_counter()
    ok = False
    # Objects that exist now cannot become garbage of the traced code: leave them out of
    # the collections (torch's own modules make a full collection cost a quarter second).
    gc.freeze()
    try:
        with recording(tracer):
            for label_src in (namespace or {}, getattr(code, "__globals__", {}) or {}):
                for k, v in label_src.items():
                    if isinstance(v, torch.nn.Module):
                        tracer.register_root(v, k)
                    elif isinstance(v, torch.optim.Optimizer):
                        tracer.register_optimizer(v)
            if scratch is not None:
                for k, v in scratch.items():
                    if isinstance(v, torch.nn.Module):
                        tracer.register_root(v, k)
            try:
                with ScriptEnd() as script_end:  # os._exit and atexit kept inside the trace
                    os_exit = False
                    try:
                        with standing_in_for_main(main) if main is not None else contextlib.nullcontext(), \
                                marked_functions(namespace):  # an earlier cell's search (oom_tries.py)
                            run_user_code(code, scratch)
                    except SystemExit as e:  # ``sys.exit(main())`` at the end of a script, or ``os._exit``
                        if e.code not in (None, 0):
                            raise
                        os_exit = isinstance(e, ProcessExit)
                    if not os_exit:  # os._exit ends a process without its atexit handlers
                        script_end.run_handlers()
            except StopTracing:
                pass
            except NeedsRealValues as e:
                e.gpu_bytes = tracer.peak_live_bytes
                raise
            if scratch is not None:
                _classify_leftovers(tracer, scratch.values())
                persist = {
                    k: v for k, v in scratch.items()
                    if not k.startswith("__") and is_plain(v) and (namespace is None or namespace.get(k, _NO) is not v)
                }
                scratch.clear()
                scratch = None
            gc.collect()
        ok = True
    finally:
        gc.unfreeze()
        seconds = time.perf_counter() - start
        if not ok:
            tracer.release_all()
            scratch = None
        state.restore()
    if namespace is not None:
        namespace.update(persist)
    events = tracer.finish()
    if tracer.failed_tries:  # accelerate's batch-size search: the run at the size found
        events, gone = without_failed_tries(events, tracer.failed_tries)
        tracer.by_sm = [g for g in tracer.by_sm if g[0] not in gone]
    props = tracer.vc.props
    meta = {"device": props.name, "compute_capability": [props.major, props.minor],
            "iterations": tracer.iteration + 1, "stopped": tracer.stopped,
            "convolutions": runs_convolutions(events), "ffts": runs_ffts(events)}  # read on every GPU switch: found once
    if world is not None:
        meta["world"] = world.as_json()
    if tracer.real_ops:
        meta["real_ops"] = dict(tracer.real_ops)  # fake mode: these ran for real, one call at a time
    if tracer.compiled is not None and (tracer.compiled.graphs or tracer.compiled.failures or tracer.compiled.eager):
        meta["compile"] = tracer.compiled.as_json()  # torch.compile for the target GPU (torch_compile.py)
    if tracer.managed_bytes:  # paged optimizer states (bitsandbytes_shim.py)
        meta["managed_bytes"] = tracer.managed_bytes
    if tracer.batch_searches:  # accelerate's find_executable_batch_size (batch_size_search.py), oom_tries.py's
        meta["batch_size_search"] = tracer.batch_searches
        if tracer.oom_searches.exhausted():
            meta["exhausted_searches"] = True
    notes = list(tracer.notes)
    made = tracer.guesses.guesses() if tracer.guesses is not None else []
    if made:
        meta["guesses"] = [g.as_json() for g in made]
        notes += [GUESS_HEADLINE] + [g.note() for g in made[:MAX_GUESS_NOTES]]
        if len(made) > MAX_GUESS_NOTES:
            notes.append(f"... and {len(made) - MAX_GUESS_NOTES} more guesses (trace.meta['guesses'])")
    if notes:
        meta["notes"] = notes
    if tracer.module_types:
        meta["module_types"] = dict(tracer.module_types)
    if tracer.by_sm:  # reduction buffers sized by the traced GPU's SM count: re-sized per GPU
        d = tracer.cuda_device
        meta["by_sm"] = {"sm_count": d.sm_count, "max_threads_per_sm": d.max_threads_per_sm,
                         "torch_version": d.torch_version, "groups": tracer.by_sm}
    if tracer.repeat_span is not None:
        meta["repeat_span"] = list(tracer.repeat_span)  # simulation/settle.py repeats it
    if tracer.gemm_into:
        meta["gemm_into"] = tracer.gemm_into  # gpus/cuda_libraries.py: their cuBLAS workspaces
    if tracer.conv_calls:
        meta["conv_calls"] = tracer.conv_calls  # gpus/cudnn.py adds the target GPU's workspaces
        if tracer.cudnn_benchmark:
            meta["cudnn_benchmark"] = True
    if tracer.sdpa_calls:
        meta["sdpa_calls"] = tracer.sdpa_calls  # their backend was chosen for this capability
    return Trace(events=events, mode=mode, seconds=seconds, meta=meta)



def _note_hub_kernels(tracer: Tracer) -> None:
    """The note for transformers 5's Hub kernels, where the traced code ran a transformers 5
    model (a layer class of ``transformers.models`` among those traced: Lightning and
    torchmetrics import transformers without running it)."""
    import sys

    mod = sys.modules.get("transformers")
    version = getattr(mod, "__version__", "0")
    if mod is None or int(version.split(".")[0]) < 5:
        return
    ran = set(tracer.module_types.values())
    layers = {name for m_name, m in list(sys.modules.items()) if m_name.startswith("transformers.models.")
              for name, v in list(vars(m).items()) if name in ran and isinstance(v, type)
              and issubclass(v, torch.nn.Module) and v.__module__.startswith("transformers.")}
    if layers:
        tracer.notes.append(
            "transformers' Hub kernels were off (USE_HUB_KERNELS=NO): layers ran PyTorch's own ops. On a GPU, "
            "transformers 5 may swap some layers for kernels downloaded from the Hub, which can hold less memory")


def _classifying_apply(tracer: Tracer) -> Callable:
    """``Module._apply`` (``.cuda()``, ``.to()``, ``.half()``) whose outermost call names what it moved.

    A model's weights are parameters from ``.cuda()`` on, not only from its first forward: one
    replaced before any forward (torchao's ``quantize_``, a head swapped) was otherwise left an
    "input", and inputs are what ``--max-batch`` scales with the batch.
    """
    depth = 0

    def _apply(self: torch.nn.Module, fn: Callable, recurse: bool = True) -> torch.nn.Module:
        nonlocal depth
        depth += 1
        try:
            out = module_apply(self, fn, recurse)
        finally:
            depth -= 1
        if not depth:
            tracer.classify_modules([self])
        return out

    return _apply


def _classify_leftovers(tracer: Tracer, values: Iterable[Any]) -> None:
    """Name and classify what the code leaves behind (a model built but never run)."""
    for v in values:
        if isinstance(v, torch.nn.Module):
            tracer.classify_modules([v])
        elif isinstance(v, torch.optim.Optimizer):
            tracer.classify_optimizer(v)


@contextlib.contextmanager
def recording(tracer: Tracer) -> Iterator[Tracer]:
    """Everything that makes the virtual device and the recording work, undone on exit: the
    virtual ``torch.cuda``, the patches, the tracer's hooks, and the two modes."""
    import torch.optim.optimizer as optim_mod

    with contextlib.ExitStack() as stack:
        stack.callback(tracer.close)
        stack.enter_context(patched_cuda(tracer.vc))
        # torch warns about what is missing on this machine, not on the target GPU.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="PyTorch was compiled without cuDNN")
        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator")
        # a GPU tensor's data_ptr() is the code's to ask (CUDA graphs, Triton launches); the fake
        # tensors standing in for it are xmem's, so FakeTensor's deprecation is not the user's
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor is deprecated")
        # float(t) / int(t) of a guessed value is a FakeFloat / FakeInt (a subclass, to be told
        # apart as a guess): Python's warning about the subclass is about xmem's doing, not the code's
        warnings.filterwarnings("ignore", message=r".*returned non-(float|int) \(type Fake(Float|Int)\)",
                                category=DeprecationWarning)
        # oneDNN kernels are a CPU choice (e.g. the LSTM's mkldnn_rnn_layer allocates a
        # workspace of its own); without them real CPU execution takes the same generic
        # paths as fake tensors.
        stack.enter_context(mkldnn_disabled())
        stack.enter_context(cudnn_refused())
        stack.enter_context(patched_attr(torch.nn.Module, "_apply", _classifying_apply(tracer)))
        # Worker processes would run the dataset outside the tracer's control (and fork
        # its modes): load in-process. torch.compile runs the code eagerly.
        stack.enter_context(patched_attr(torch.utils.data.DataLoader, "_get_iterator", in_process_iterator))
        compiled = CompiledCalls(tracer, stack)  # torch.compile for the target GPU (torch_compile.py)
        stack.enter_context(patched_attr(torch, "compile", compiled.compile))
        stack.enter_context(on_import(["torch._dynamo"], lambda dynamo: stack.enter_context(
            compiled.patch_dynamo(dynamo))))  # torch.compile's older spelling
        stack.callback(lambda: tracer.notes.extend(compiled.record.notes()))
        tracer.compiled = compiled.record
        if tracer.fake:
            # Fake parameters take the same optimizer implementation as real ones on a
            # GPU (foreach by default): torch checks ``type(p) in _foreach_supported_types``.
            import torch.utils._foreach_utils as foreach_utils
            from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

            for types_list in (optim_mod._foreach_supported_types, foreach_utils._foreach_supported_types):
                stack.enter_context(appended(types_list, FakeTensor))
            stack.enter_context(patched_attr(UninitializedTensorMixin, "materialize",
                                             real_mode_for_lazy_modules(UninitializedTensorMixin.materialize)))
            for name in INIT_FUNCTIONS:
                orig = getattr(torch.nn.init, name, None)
                if orig is not None:
                    stack.enter_context(patched_attr(torch.nn.init, name, skip_init(orig)))
        stack.enter_context(tracer.hooks())
        stack.enter_context(patched_attr(torch.UntypedStorage, "resize_", storage_resize(tracer)))
        stack.enter_context(kept_in_memory(tracer))  # torch.save / torch.load (checkpoints.py)
        # transformers (5.x) loads a checkpoint's tensors in worker threads, outside the tracer's
        # thread-local modes: they would reach the real CUDA ("no NVIDIA driver"). In this thread.
        stack.enter_context(patched_item(os.environ, "HF_DEACTIVATE_ASYNC_LOAD", "1"))
        # transformers 5 swaps layers of a model on cuda for kernels it downloads from the Hub
        # (`kernels`): compiled CUDA code that cannot run here, and a download. Off, and said.
        if "USE_HUB_KERNELS" not in os.environ:
            stack.enter_context(patched_item(os.environ, "USE_HUB_KERNELS", "NO"))
            stack.callback(_note_hub_kernels, tracer)
        stack.enter_context(triton_launches(tracer))  # Triton kernels: recorded, not run
        stack.callback(note_fallbacks, tracer)  # ...and where Triton is missing, the fallbacks taken said
        stack.enter_context(bitsandbytes_on_gpu(tracer))  # 4/8-bit parameters and optimizers
        stack.enter_context(generation_in_fake_mode(tracer, stack))  # generate(): to max_new_tokens, steps made
        stack.enter_context(fake_tensors_are_not_traced(tracer, stack))  # masks dropped as on a GPU
        stack.enter_context(unsloth_checks(tracer, stack))  # its untrained-token check reads weights
        stack.enter_context(fresh_singletons(stack))  # accelerate's state: a new process's, then the user's
        stack.enter_context(data_parallel_on_gpu())  # nn.DataParallel's scatter / gather (C++ only)
        stack.enter_context(flash_attn_on_gpu(tracer))  # FlashAttention-2's package, stood in for
        stack.enter_context(threads_in_the_trace())  # a thread the code starts runs in the trace's modes
        stack.enter_context(profiler_on_the_host(tracer))  # torch.profiler: no CUDA activity to time
        stack.enter_context(batch_size_search(tracer, stack))  # auto_find_batch_size: OOM at the GPU's capacity
        stack.enter_context(oom_tries(tracer))  # the code's own try/except OutOfMemoryError, likewise
        stack.enter_context(hub_writes_held_back(tracer, stack))  # push_to_hub: nothing sent to the Hub
        stack.enter_context(patched_attr(torch.autograd.graph, "disable_saved_tensors_hooks",  # torch.func.grad
                                         saved_hooks_yielding(tracer, torch.autograd.graph.disable_saved_tensors_hooks)))
        if tracer.fake:
            # FakeTensorMode logs every failing meta kernel (a user's shape error) with a
            # traceback of its own; the error itself reaches the user's code.
            stack.enter_context(logger_level("torch._subclasses.fake_tensor", logging.CRITICAL))
            stack.enter_context(out_variant_metas())  # Inductor's _scaled_mm(out=): no real fallback
            stack.enter_context(numbers_from_fake_tensors())  # a 0-dim tensor for an op's float: item()
            symbolic = {"shape_env": tracer.symbolic.env, "static_shapes": True} if tracer.symbolic else {}
            fake_mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True, **symbolic))
            if symbolic:  # composite ops kept symbolic, not pinned by C++ (symbolic.py)
                stack.enter_context(symbolic_tracing(tracer.symbolic))
            tracer.fake_mode = fake_mode
            tracer.shadows = Shadows()
            tracer.guesses = Guesses(tracer.shadows, fake_mode)
            stack.enter_context(patched_attr(torch.nn.Parameter, "__new__", fake_parameter_new(fake_mode)))
            stack.enter_context(patched_attr(FakeTensor, "__new__", fake_tensor_as_parameter_class()))
            stack.enter_context(patched_attr(torch.UntypedStorage, "from_buffer", storage_from_buffer()))
        alloc_mode = stack.enter_context(AllocMode(tracer))
        device_mode = tracer.device_mode = DeviceMode(tracer)
        if tracer.fake:
            stack.enter_context(patched_attr(FakeTensor, "device", fake_device_property(tracer, device_mode)))
        stack.enter_context(device_mode)
        stack.enter_context(legacy_tensor_types(device_mode))  # torch.cuda.FloatTensor and kin
        stack.enter_context(patched_attr(torch.autograd, "_engine_run_backward",
                                         device_mode.in_backward_engine(torch.autograd._engine_run_backward,
                                                                        alloc_mode.backward_writes.forget)))
        import torch.utils.checkpoint as ckpt

        checks = getattr(ckpt, "_allowed_determinism_checks_to_fns", None)
        if checks is not None and "default" in checks:
            stack.enter_context(patched_item(checks, "default", checkpoint_metadata(tracer)))
        # torchrun's environment and torch.distributed's fake process group (distributed.py)
        stack.enter_context(simulated_world(tracer, tracer.world, device_mode))
        for name in ("scaled_dot_product_attention", "dropout"):  # as in forward, in a recomputation too
            orig = getattr(torch.nn.functional, name)
            stack.enter_context(patched_attr(torch.nn.functional, name,
                                             outside_mode(orig, device_mode.special[orig], device_mode)))
        # ``torch.set_default_device("cuda")`` in user code leaves a DeviceContext on the
        # mode stack: take it off while ours is still there (DeviceContext re-pushes the
        # modes above it when it leaves).
        stack.callback(restore_default_device, torch.get_default_device())
        yield tracer
