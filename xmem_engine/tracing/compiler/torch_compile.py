"""``torch.compile`` on the virtual GPU: the compiled step's own allocations.

Under the tracer, ``torch.compile`` compiles for real, on the CPU, **for the target CUDA GPU**:
Dynamo captures the graph on fake tensors whose device is ``cuda``, AOTAutograd partitions
forward and backward with the partitioner and settings a GPU run uses, and Inductor lowers and
schedules for ``cuda``. The Python wrapper Inductor generates (its ``empty_strided_cuda``
buffers, ``del``s and reuses, extern kernels such as ``mm(out=)``) then runs under the tracer,
so the trace holds the compiled step's allocations. Triton kernels are neither compiled nor
run: a generated kernel allocates nothing. Research and measurements: ``docs/compile-on-cpu.md``.

How the two worlds meet
-----------------------
xmem's traced tensors are CPU fakes that *report* ``cuda`` (``device_mode.py``). While a
compiled function is called (:class:`CompiledCalls`), the device mode is off the
torch-function stack (Dynamo would trace its handler into the graph) and the traced tensors'
``device`` says ``cuda``, so Dynamo's own fake tensors are true ``cuda`` fakes: AOTAutograd and
Inductor see a CUDA graph. The compiled graph's runtime (what a backend returns) runs with the
device mode back on: ``empty_strided_cuda`` is a virtual-GPU allocation, as ``torch.empty`` is.
Inductor's lazy backward compile happens inside ``backward()``; the tracer's modes let its
compile-time ops through (``Tracer.compiling``). Code Dynamo leaves to Python inside a
compiled call (a graph break's call, a ``torch.compiler.disable``d function, a custom op's fake
kernel) runs without the device mode: the dispatch mode places its ops as the device mode
would (``AllocMode._between_graphs``), and each graph break is named in the notes.

What is not the GPU's
---------------------
Inductor's choices that a GPU makes by timing are made by fixed rules here: pad_mm pads
half-precision matmuls whose sizes miss the tensor cores' multiple of 8 (an H200's timing chose
so for GPT-2's head), ``max-autotune`` is off (ATen kernels, no template workspaces); neither
pad_mm's nor Triton's autotuning timings run, but what they allocate on the GPU is allocated
(``inductor_autotune.py``). ``mode="reduce-overhead"``'s CUDA graphs are not captured: their
private memory pool, warm-up, recording and replays are (``cuda_graph_trees.py``).
Each is said in the notes where the script asked for it.

On a torch without Triton (the CPU wheel) Inductor cannot generate CUDA code: compiled code
runs eagerly, and the notes say why.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import os
import re
import sys
import traceback
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from xmem_engine.tracing.compiler.compiled_methods import MethodsCompiled, compile_wrappers
from xmem_engine.tracing.compiler.compiled_optimizers import (HOOK_BREAK, attributes_as_compile_fakes,
                                                              hooks_run_by_python, states_made_on_the_virtual_gpu)
from xmem_engine.tracing.compiler.cuda_graph_trees import GraphTreeRecord, GraphTrees
from xmem_engine.tracing.compiler.fake_parameters import dynamo_sees_library_classes
from xmem_engine.tracing.compiler.gpu_reach import reaches_gpu
from xmem_engine.tracing.compiler.inductor_gpu import (answering_availability, availability, inductor_for_virtual_gpu,
                                              real_availability)
from xmem_engine.tracing.compiler.mode_stacks import (DYNAMO_KEEPS_DISPATCH_MODES, dispatch_mode_of,
                                                       dynamo_skips_the_tracer, hooks_off, with_dispatch_mode,
                                                       without_dispatch_mode, without_function_mode)
from xmem_engine.tracing.compiler.recomputation import recomputed_as_forward_ran
from xmem_engine.tracing.patches import eager_compiled, patched_attr, patched_item

#: what ``torch.compile`` does under the tracer (``trace(compile=...)``, ``xmem estimate --compile``)
COMPILE_MODES = ("inductor", "eager")
#: why compiled code ran eagerly when the user asked for it (``CompileRecord.eager``)
ASKED_EAGER = "asked: --compile eager"
EAGER_GRAPH = "that graph ran eagerly"  # a graph the backend failed to compile (CompileRecord.failures)
PAD_MM_TIMING = "inductor.pad_mm_timing"  # the op name of pad_mm's timing allocations in the trace

COMPILED_AUTOGRAD = "compiled_autograd"  # noted as a mode: torch.compile reads the config when called
#: the torch.compile modes whose GPU behaviour is not modelled, and what the notes say of them
UNMODELLED_MODES = {
    "max-autotune": ("max-autotune's benchmarked kernel choices are not modelled: Inductor's default kernels "
                     "(ATen matmuls) were assumed; a GPU may pick Triton templates, whose workspaces differ"),
    "max-autotune-no-cudagraphs": ("max-autotune's benchmarked kernel choices are not modelled: Inductor's default "
                                   "kernels (ATen matmuls) were assumed; a GPU may pick Triton templates"),
    COMPILED_AUTOGRAD: ("torch._dynamo.config.compiled_autograd was on: compiled autograd's one graph of the whole "
                        "backward is not modelled (it cannot capture xmem's fake tensors); backward ran as it does "
                        "with it off (a compiled forward's backward as AOTAutograd's compiled graph)"),
}


def why_not_compiled(meta: dict) -> str | None:
    """Why compiling a traced step cannot be tried (the advisor's torch.compile lever), or
    None: it compiles already, the user asked for eager, or Inductor cannot compile here."""
    info = meta.get("compile") or {}
    if info.get("graphs"):
        return "the step is compiled already"
    if ASKED_EAGER in (info.get("eager") or {}).values():
        return "--compile eager was asked"
    reason = compile_unavailable()
    return None if reason is None else f"Inductor cannot compile for CUDA here: {reason}"


def compile_unavailable() -> str | None:
    """Why Inductor cannot compile for CUDA in this process, or None."""
    if not torch.backends.cuda.is_built():
        return "this torch is a CPU build, without CUDA code generation"
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia.driver import CudaDriver  # noqa: F401
    except Exception:  # noqa: BLE001 - any broken Triton install means the same
        return "Triton is not installed (Inductor writes CUDA kernels in Triton)"
    return None


@dataclass
class CompileRecord:
    """What compiling did in one trace: where it was applied, what it made, how long it took."""

    where: list[str] = field(default_factory=list)
    graphs: int = 0
    backward_graphs: int = 0
    seconds: float = 0.0  # AOTAutograd and Inductor (the backend), forward and backward graphs
    outside_frames: float = 0.0  # of ``seconds``, the lazy backward compiles (inside ``backward()``)
    cached: int = 0  # graphs Inductor read back from xmem's cache (compile_cache.compile_cache_dir)
    frames: float | None = None  # Dynamo's frame compiles, the backend's forward compiles within
    graph_breaks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    wrappers: list[str] = field(default_factory=list)  # Inductor's generated output code, in load order
    skipped: list[str] = field(default_factory=list)  # called, but Dynamo made no graph of it
    eager: dict[str, str] = field(default_factory=dict)  # where torch.compile ran eagerly -> why
    cuda_graphs: GraphTreeRecord = field(default_factory=GraphTreeRecord)  # mode="reduce-overhead"
    backends: set[str] = field(default_factory=set)  # the Dynamo backends that compiled its graphs

    @property
    def comparable(self) -> bool:
        """Whether compiling and not compiling differ here: the code compiled a graph for the GPU,
        or would have but ran eagerly because the user asked (the notebook's compile toggle)."""
        return self.graphs > 0 or ASKED_EAGER in self.eager.values()

    def as_json(self) -> dict:
        return {"where": list(self.where), "graphs": self.graphs, "backward_graphs": self.backward_graphs,
                "seconds": round(self.seconds, 3), "cached": self.cached, "graph_breaks": list(self.graph_breaks),
                "dynamo_seconds": None if self.dynamo_seconds is None else round(self.dynamo_seconds, 3),
                "failures": len(self.failures), "wrappers": list(self.wrappers), "skipped": list(self.skipped),
                "eager": dict(self.eager), "comparable": self.comparable, "cuda_graphs": self.cuda_graphs.as_json()}

    @property
    def dynamo_seconds(self) -> float | None:
        """Dynamo's own share of compiling (its frame compiles, recompiles included, less the
        backend's); None where its record is missing or was cleared (a ``torch._dynamo.reset()``
        in the user's code)."""
        if self.frames is None or self.frames + self.outside_frames < self.seconds:
            return None
        return self.frames + self.outside_frames - self.seconds

    def took(self) -> str:
        """How long compiling took on the CPU, as a GPU machine spends it too before the first step."""
        dynamo = self.dynamo_seconds
        cached = (f"; {self.cached} of its graphs Inductor read from xmem's compile cache, compiled by an "
                  "earlier estimate" if self.cached else "")
        if dynamo is None:
            return f"the CPU compile took {self.seconds:.1f} s{cached}"
        return (f"the CPU compile took {dynamo + self.seconds:.1f} s: Dynamo's capture {dynamo:.1f} s, "
                f"AOTAutograd and {'Inductor' if 'inductor' in self.backends or not self.backends else 'the backend'} "
                f"{self.seconds:.1f} s{cached}")

    def notes(self) -> list[str]:
        out = []
        if self.graphs:
            where = ", ".join(self.where) or "(library code)"
            bw = f" and {self.backward_graphs} backward" if self.backward_graphs else ""
            by = " and ".join("Inductor" if b == "inductor" else f"the {b!r} backend" for b in sorted(self.backends))
            out.append(f"torch.compile at {where}: compiled for the target GPU by {by or 'Inductor'} on the CPU "
                       f"({self.graphs} graph{'s' if self.graphs != 1 else ''}{bw}; {self.took()}). " + (
                       "The estimate is the compiled step's: its graphs as that backend runs them, op by op"
                       if "inductor" not in self.backends else "The estimate is the compiled step's: Inductor's buffers and "
                       "the partitioner's saved activations, and what the GPU's timings allocate in the first "
                       "step (pad_mm's real matrices while compiling; at each kernel's first launch a cache-flush "
                       "buffer and copies of what it writes). The timings' choices are fixed rules here: "
                       "half-precision matmuls whose sizes are not multiples of 8 padded, Inductor's default "
                       "kernel configs"))
        if self.graph_breaks:
            shown = "; ".join(self.graph_breaks[:3])
            more = f" (and {len(self.graph_breaks) - 3} more)" if len(self.graph_breaks) > 3 else ""
            out.append(f"torch.compile: {len(self.graph_breaks)} graph break{'s' if len(self.graph_breaks) != 1 else ''}, "
                       f"the code between graphs ran eagerly: {shown}{more}")
        skipped = [w for w in self.skipped if w not in self.where]
        if skipped:
            out.append(f"torch.compile at {', '.join(skipped)}: Dynamo compiled no graph (this torch skips the "
                       "compiled code, e.g. torch's own nn modules before 2.11); it ran eagerly, as on the GPU")
        counts = collections.Counter(self.failures)  # the same failure for each graph of a model: said once
        out += [f if n == 1 else f.replace(EAGER_GRAPH, f"{n} such graphs ran eagerly") for f, n in counts.items()]
        out += self.cuda_graphs.notes(sorted(self.modes & {"reduce-overhead", "max-autotune"}))
        out += [UNMODELLED_MODES[m] for m in sorted(self.modes) if m in UNMODELLED_MODES]
        return out


# ---------------------------------------------------------------- torch.compile under the tracer
class CompiledCalls:
    """``torch.compile`` while tracing: the real one, with a backend that compiles for the
    virtual GPU and a wrapper that takes the device mode off while Dynamo runs."""

    def __init__(self, tracer: Any, stack: contextlib.ExitStack):
        self.t = tracer
        self.stack = stack  # the recording's: the Inductor patches are entered there, once
        self.real_compile = self._torch_compile(torch.compile)
        self.real_optimize: Callable[..., Any] | None = None  # torch._dynamo.optimize, once imported
        self.in_torch_compile = False  # torch.compile calls torch._dynamo.optimize itself
        self.virtual = availability()  # the tracer's answers (patched_cuda), for compiled code's runtime
        self.record = CompileRecord()
        self.trees = GraphTrees(tracer, self.record.cuda_graphs)  # mode="reduce-overhead"'s CUDA graphs
        self.installed = False
        self.frames_from = self.hits_from = 0  # Dynamo's frame compiles, Inductor's cache hits before it
        self.attention: Callable[..., Any] | None = None  # sdpa.compiled_attention for the target GPU
        self.unavailable = compile_unavailable()
        self.dispatch: Any | None = None  # the tracer's dispatch mode, seen at the last compiled call
        self.register_fakes: Callable[[], None] = lambda: None  # fake_parameters.py, once installed
        self.functions_on = False  # inside functions_for_dynamo

    # -- what the user calls
    def compile(self, model: Any = None, *, fullgraph: bool = False, dynamic: bool | None = None,
                backend: Any = "inductor", mode: str | None = None, options: dict | None = None,
                disable: bool = False, **kwargs: Any) -> Any:
        from xmem_engine.tracing.frames import library_frame

        args = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                    disable=disable, **kwargs)
        if model is None:
            return lambda m: self.compile(m, **args)
        if disable or not callable(model):
            return self.real_compile(model, **args)
        where = library_frame(skip=compile_wrappers()) or "(library code)"
        reason = self.why_eager(backend)
        if reason is not None:
            self.record.eager.setdefault(where, reason)
            return eager_compiled(model, where, reason, self.t.notes,
                                  lambda args, kwargs: self.on_gpu(model, args, kwargs))
        self.install()
        if isinstance(backend, VirtualGPUBackend):  # compiled again with the arguments kept (Lightning)
            inner: Any = backend.inner
        elif backend == "inductor":
            inner = torch._TorchCompileInductorWrapper(mode, options, dynamic)
            if mode:
                self.record.modes.add(mode)
        elif isinstance(backend, str):
            from torch._dynamo.backends.registry import lookup_backend

            inner = lookup_backend(backend)
        else:
            inner = backend
        be = VirtualGPUBackend(self, inner, where, backend.name if isinstance(backend, VirtualGPUBackend) else
                               backend if isinstance(backend, str) else getattr(backend, "__name__", "a custom"))
        if torch._dynamo.config.compiled_autograd:
            self.record.modes.add(COMPILED_AUTOGRAD)
        with torch._dynamo.config.patch(compiled_autograd=False):
            compiled = self.real_compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=be, disable=disable,
                                         **kwargs)
        if isinstance(compiled, torch.nn.Module):  # OptimizedModule: its forward enters Dynamo
            compiled.forward = self.calls(compiled.forward, model, where)
            compiled.dynamo_ctx = MethodsCompiled(self, compiled.dynamo_ctx, where)
            return compiled
        return functools.wraps(model)(self.calls(compiled, model, where)) if callable(compiled) else compiled

    def optimize(self, *args: Any, **kwargs: Any) -> Any:
        """``torch._dynamo.optimize(backend)``, the decorator ``torch.compile`` grew out of (older
        scripts and tutorials): the same compile, ``nopython`` being ``fullgraph``. Called by
        ``torch.compile`` itself, it is Dynamo's own."""
        if self.in_torch_compile:
            assert self.real_optimize is not None
            return self.real_optimize(*args, **kwargs)
        backend = args[0] if args else kwargs.pop("backend", "inductor")
        return lambda fn: self.compile(fn, backend=backend, fullgraph=kwargs.get("nopython", False),
                                       dynamic=kwargs.get("dynamic"), disable=kwargs.get("disable", False))

    def patch_dynamo(self, dynamo: Any) -> contextlib.AbstractContextManager:
        """``torch._dynamo.optimize`` as :meth:`optimize`, while the trace lasts."""
        self.real_optimize = dynamo.optimize
        return patched_attr(dynamo, "optimize", self.optimize)

    def _torch_compile(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.in_torch_compile = True
            try:
                return real(*args, **kwargs)
            finally:
                self.in_torch_compile = False
        return call

    def why_eager(self, backend: Any) -> str | None:
        if self.t.compile_mode == "eager":
            return ASKED_EAGER
        if not self.t.fake:
            return "real mode (compiling runs on fake tensors only)"
        if self.unavailable:
            return self.unavailable
        return None

    def install(self) -> None:
        if not self.installed:
            import warnings

            # About the tracer's own module hooks, and caches xmem turns off: not the user's business.
            warnings.filterwarnings("ignore", message=re.escape("Using `torch.compile(module)` when there are global hooks"))
            warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
            # Autograd asks the device guard of Dynamo's cuda fakes for their stream: the no-op
            # guard FakeTensorMode installs where CUDA is unavailable (it checks
            # torch.cuda.is_available(), which says True while tracing). Without a driver the
            # real guard's error is thrown where C++ cannot catch it (the process aborts).
            if hasattr(torch._C, "_ensureCUDADeviceGuardSet"):  # torch >= 2.7
                torch._C._ensureCUDADeviceGuardSet()
            dynamo_skips_the_tracer()
            self.stack.enter_context(inductor_for_virtual_gpu(
                self.t.vc.props, lambda mod: self.record.wrappers.append(getattr(mod, "__file__", "") or ""),
                lambda steps: self.t.transients(PAD_MM_TIMING, steps), self._kernel_wrote))
            self.stack.enter_context(self.trees.installed())
            self.stack.enter_context(hooks_run_by_python(self.t))
            self.stack.enter_context(states_made_on_the_virtual_gpu(self.t, lambda: (self.t.fake_mode, self.dispatch)))
            self.register_fakes = self.stack.enter_context(dynamo_sees_library_classes())
            self.stack.enter_context(recomputed_as_forward_ran(self))
            self.stack.callback(self._forget)
            self.frames_from = len(_frame_compile_times())
            self.hits_from = _cache_hits()
            self.installed = True

    def _kernel_wrote(self, tensors: list) -> None:
        """A generated kernel's launch wrote ``tensors``: what was known of their values goes
        (``triton_launches.Launches.written``, as for a Triton launch from Python)."""
        launches = getattr(self.t, "triton", None)
        if launches is not None:
            launches.written(tensors)

    def _forget(self) -> None:
        """Compiled code is the trace's: the next trace (another GPU) compiles afresh. The
        trace's dead tensors go first: torch 2.10's Dynamo drops their entries from its graph
        globals in weakref callbacks, which complain when ``reset`` has cleared them."""
        times = _frame_compile_times()
        if len(times) >= self.frames_from:
            self.record.frames = sum(times[self.frames_from:])
        self.record.cached = max(0, _cache_hits() - self.hits_from)
        gc.collect()
        torch._dynamo.reset()

    # -- calling compiled code
    def calls(self, fn: Callable[..., Any], eager: Callable[..., Any], where: str) -> Callable[..., Any]:
        """``fn`` (Dynamo's entry) called with the device mode off and the traced tensors
        reporting ``cuda``; nested compiled calls run inside the outer one's Dynamo frame.
        A call that touches no virtual-GPU tensor is host work (a library's CPU kernel, a
        metric): ``eager`` runs it, as it allocates nothing on the GPU either way."""
        t = self.t

        def call(*args: Any, **kwargs: Any) -> Any:
            mode = t.device_mode
            if mode is None or not mode.on_stack() or t.compiling:
                return fn(*args, **kwargs)
            if not self.on_gpu(eager, args, kwargs):
                return eager(*args, **kwargs)
            if t.symbolic is not None:  # Dynamo specialises what it is given: stop before it starts
                t.symbolic.pin(f"{where}: torch.compile traces its graphs at concrete sizes")
            breaks = _graph_breaks()
            try:
                self.dispatch = dispatch_mode_of(lambda m: getattr(m, "t", None) is t) or self.dispatch
                with self.as_in_a_compiled_call():
                    out = fn(*args, **kwargs)
            except Exception as e:
                self.raised(where, e)
                raise
            if where not in self.record.where and where not in self.record.skipped:
                self.record.skipped.append(where)
            self.record.graph_breaks += _new_breaks(breaks)
            return out

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        return call

    @contextlib.contextmanager
    def as_in_a_compiled_call(self) -> Iterator[None]:
        """What code runs under inside a compiled call: the device mode off, the functions as
        Dynamo sees them, the tracer's module hooks off, this machine's answers."""
        t = self.t
        with without_function_mode(t.device_mode), without_dispatch_mode(self.hidden), _flag(t, "in_dynamo"), \
                hooks_off(t), real_availability(), self.functions_for_dynamo():
            yield

    @property
    def hidden(self) -> Any | None:
        """The tracer's dispatch mode where this torch's Dynamo compiles nothing under it (before
        2.10, ``mode_stacks.py``): taken off for a compiled call, back on while compiled code runs."""
        return None if DYNAMO_KEEPS_DISPATCH_MODES else self.dispatch

    def raised(self, where: str, e: BaseException) -> None:
        """A compiled call that raised is said once: the code may catch it and run something else
        (Unsloth's block compile falls back to its eager forward), which the estimate is then of."""
        if _dynamo_control_flow(e) or "StopRecomputation" in type(e).__name__:
            return  # Dynamo restarting, or a checkpoint's recomputation ending: not a failure
        text = (f"torch.compile at {where}: the compiled call raised under the tracer ({_said(e)}); if the "
                "code caught it, what it ran instead is what the estimate holds")
        if text not in self.record.failures:
            self.record.failures.append(text)

    @contextlib.contextmanager
    def functions_for_dynamo(self) -> Iterator[None]:
        """The functions the device mode rewrites, as Dynamo should see them: attention as the
        target GPU's fused kernel (``sdpa.compiled_attention``), dropout as PyTorch's own
        (Inductor makes its mask from seeds, as on a GPU); and ``autograd.grad`` on Dynamo's
        fakes run in Python (``python_autograd.while_dynamo_traces``)."""
        import torch.nn.functional as F

        from xmem_engine.tracing.compiler import python_autograd
        from xmem_engine.tracing.kernels.sdpa import compiled_attention

        self.register_fakes()  # fake parameter classes made since the last call, as Dynamo sees the real ones
        if self.attention is None:
            props = self.t.vc.props
            self.attention = compiled_attention((props.major, props.minor))
        with contextlib.ExitStack() as stack:
            stack.enter_context(patched_attr(F, "scaled_dot_product_attention", self.attention))
            stack.enter_context(patched_attr(F, "dropout", getattr(F.dropout, "__wrapped__", F.dropout)))
            stack.enter_context(python_autograd.while_dynamo_traces())
            stack.enter_context(_flag(self, "functions_on"))
            yield

    def on_gpu(self, model: Any, args: tuple, kwargs: dict) -> bool:
        """The call reaches a virtual-GPU tensor (``gpu_reach.py``)."""
        return reaches_gpu(model, args, kwargs, self.t.is_gpu)

    # -- compiling
    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """A compile in progress: the tracer's modes let its ops through, the machine's own answer
        to ``torch.cuda.is_available()``, and AOTAutograd's ``autograd.grad`` is the Python engine."""
        from xmem_engine.tracing.compiler import python_autograd
        start = time.perf_counter()
        try:
            with _flag(self.t, "compiling"), real_availability(), python_autograd.installed():
                yield
        finally:
            # Inductor makes objects by the million: full collections run in it on a GPU, freeing tensors
            # only cycles held; here too for a graph read from xmem's cache (same events warm or cold)
            gc.collect()
            self.record.seconds += time.perf_counter() - start

    def runtime(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A backend's compiled callable, run with the device mode on (as eager code runs)."""
        tracer, virtual, boxed = self.t, self.virtual, getattr(fn, "_boxed_call", False)

        def run(*args: Any, **kwargs: Any) -> Any:
            tracer.compiled_graph_starts(args[0] if len(args) == 1 and isinstance(args[0], list) else args)  # (boxed)
            mode = tracer.device_mode
            if mode.on_stack():
                with _flag(mode, "compiled_code"):
                    return fn(*args, **kwargs)
            with answering_availability(virtual), hooks_off(tracer, False), _flag(tracer, "in_dynamo", False), \
                    _flag(mode, "compiled_code"), mode, with_dispatch_mode(self.hidden):
                return fn(*args, **kwargs)

        if boxed:
            run._boxed_call = True  # type: ignore[attr-defined]
        return run


class VirtualGPUBackend:
    """A Dynamo backend: ``inner`` (Inductor, or the backend the script named) compiling for the
    virtual GPU; its compiled callables run under the tracer's device mode."""

    def __init__(self, calls: CompiledCalls, inner: Any, where: str, name: str = "inductor"):
        self.calls, self.inner, self.where, self.name = calls, inner, where, name

    def __eq__(self, other: object) -> bool:
        """Equal for the same trace and an equal ``inner``, as Inductor's wrappers are equal for
        equal settings: Dynamo reuses a graph compiled by an equal backend. A library that calls
        ``torch.compile(fn, ...)`` anew each time (torchao's ``AdamW8bit``, once a parameter)
        got a new backend every call and a recompile of every graph (42 for 7 shapes)."""
        if not isinstance(other, VirtualGPUBackend):
            return NotImplemented
        return self.calls is other.calls and (self.inner is other.inner or self.inner == other.inner)

    def __hash__(self) -> int:
        return hash(id(self.calls))

    def __deepcopy__(self, memo: dict) -> "VirtualGPUBackend":
        """Itself: it holds the trace. Lightning's ``torch.compile`` wrapper deep-copies the
        arguments of each call (to compile again in ``Fabric.setup``), the backend among them."""
        return self

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        rec = self.calls.record
        if self.where not in rec.where:
            rec.where.append(self.where)
        example_inputs = _dynamo_fakes(gm, example_inputs)
        attributes_as_compile_fakes(gm)
        try:
            with self.calls.compiling():
                if isinstance(self.inner, torch._TorchCompileInductorWrapper):
                    fn = self._inductor(gm, example_inputs)
                else:
                    fn = self.inner(gm, example_inputs)
        except Exception as e:  # noqa: BLE001 - any compile error: that graph runs eagerly, and is said
            no_bf16 = "BF16 is not supported" in str(e)  # Inductor's SkipFrame below compute capability 8
            if _dynamo_control_flow(e) and not no_bf16:  # (that SkipFrame comes raw with Inductor's cache on)
                raise  # Dynamo restarting its analysis (e.g. with a scalar made a tensor): not a failure
            if os.environ.get("XMEM_DEBUG_COMPILE"):
                traceback.print_exc()
            why = ("Inductor does not compile bf16 graphs for this GPU (no native bf16: on the GPU it skips them "
                   "too, warning '... does not support bfloat16 compilation natively, skipping')" if no_bf16
                   else f"compiling for the target GPU failed ({_said(e)})")
            rec.failures.append(f"torch.compile at {self.where}: {why}; {EAGER_GRAPH}")
            return self.calls.runtime(gm.forward)
        rec.graphs += 1
        rec.backends.add(self.name)
        return self.calls.runtime(fn)

    def _inductor(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        calls = self.calls

        def inner_compile(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("is_backward"):
                calls.record.backward_graphs += 1
            if calls.t.compiling:
                return compile_fx_inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                with calls.compiling():  # the lazy backward compile, inside backward()
                    return compile_fx_inner(*args, **kwargs)
            finally:
                calls.record.outside_frames += time.perf_counter() - start

        # CUDA graphs (mode="reduce-overhead", transformers' static-cache generate()) are Inductor's
        # to decide; the graphs it wraps run in GraphTrees' pool (cuda_graph_trees.py). A mode's own
        # patches (max-autotune's) apply inside compile_fx, over inductor_gpu's settings: autotuning
        # benchmarks on a device, so it stays off here too (the mode's note).
        patches = {**self.inner.config, "triton.cudagraphs": bool(self.inner.config.get("triton.cudagraphs")),
                   "max_autotune": False,
                   "max_autotune_gemm": False, "max_autotune_pointwise": False}
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)


@contextlib.contextmanager
def standing_in_for_main(main: types.ModuleType) -> Iterator[None]:
    """``sys.modules["__main__"]`` is ``main`` (the traced script's module) for the block, and
    Dynamo asks for it afresh on both sides: it keeps the modules it imports to read an inlined
    function's globals in a process-wide ``functools.cache`` (``symbolic_convert._import_module``)
    that ``torch._dynamo.reset`` leaves. The second trace that compiled code from its script read
    the first one's stand-in, emptied when that trace ended ("module has no attribute
    '__name__'": the advisor's compile lever after another script's)."""
    from torch._dynamo import symbolic_convert

    cached = getattr(symbolic_convert, "_import_module", None)
    clear = getattr(cached, "cache_clear", lambda: None)
    clear()
    try:
        with patched_item(sys.modules, "__main__", main):
            yield
    finally:
        clear()
        # and the alias Dynamo leaves in a root frame's module (``__import___main__`` in
        # ``torch.nn.modules.container``'s globals when it compiled a Sequential of the
        # script's blocks), which its next compile asserts is the module it imports now
        for mod in list(sys.modules.values()):
            scope = getattr(mod, "__dict__", None)
            if type(scope) is dict and scope.get("__import___main__") is main:
                del scope["__import___main__"]


# ---------------------------------------------------------------- small helpers
def _dynamo_fakes(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """The backend's example inputs as fake tensors of the compile's own fake mode (true
    ``cuda`` fakes): Dynamo hands a backend the tensors it was called with, here the tracer's
    CPU fakes, which the compiler would refuse to mix with its own (torch 2.10 does)."""
    from torch._guards import TracingContext
    from torch._subclasses.fake_tensor import FakeTensor

    ctx = TracingContext.try_get()
    mode = getattr(ctx, "fake_mode", None)
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if len(values) != len(example_inputs):
        values = [None] * len(example_inputs)
    out = []
    for e, v in zip(example_inputs, values):
        if isinstance(e, FakeTensor) and mode is not None and e.fake_mode is not mode:
            e = v if isinstance(v, FakeTensor) and v.fake_mode is mode else mode.from_tensor(e)
        out.append(e)
    return out


def _frame_compile_times() -> list[float]:
    """Seconds of each Dynamo frame compile so far in this process (``dynamo_timed``'s record,
    which ``torch._dynamo.reset`` clears)."""
    from torch._dynamo import utils

    return list(getattr(utils, "compilation_time_metrics", {}).get("_compile.compile_inner", []))


def _cache_hits() -> int:
    """Graphs Inductor has read from its FX graph cache so far in this process."""
    return int(torch._dynamo.utils.counters["inductor"].get("fxgraph_cache_hit", 0))


def _said(e: BaseException) -> str:
    """An error as a note quotes it: its type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e).strip() else ''}"


def _dynamo_control_flow(e: BaseException) -> bool:
    from torch._dynamo import exc

    kinds = tuple(k for k in (getattr(exc, "RestartAnalysis", None), getattr(exc, "SkipFrame", None)) if k)
    return isinstance(e, kinds)


@contextlib.contextmanager
def _flag(obj: Any, name: str, value: bool = True) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks so far in this process, by reason: the user's (not the tracer's hooks)."""
    from torch._dynamo.utils import counters

    return {str(k): v for k, v in counters["graph_break"].items() if HOOK_BREAK not in str(k)}


def _new_breaks(before: dict[str, int]) -> list[str]:
    """The breaks since ``before``, one line each: the reason's first line, and the function it
    names where that line is generic. (A reason seen in an earlier trace is counted again, not
    added: taking the counter's last keys had named an earlier trace's reason.)"""
    out = []
    for reason, n in _graph_breaks().items():
        if n > before.get(reason, 0):
            first = reason.splitlines()[0][:160]
            named = re.search(r"Explanation:.*?`([\w.<>]+)`", reason)
            if named and named.group(1) not in first:
                first += f" (`{named.group(1)}`)"
            out += [first] * (n - before.get(reason, 0))
    return out
