"""What would make it fit: the usual levers, each measured on the user's own step.

Each lever is applied without editing the script, then the step is estimated again:

- allocator settings (``expandable_segments``, ``garbage_collection_threshold``) re-simulate
  the same trace;
- code changes re-trace the script with the change patched in for the run: autocast around the
  model's outermost forward, activation checkpointing of its repeated blocks, the optimizer's
  implementation (for-loop or fused), AdamW swapped for Adafactor, ``zero_grad(set_to_none=True)``,
  ``torch.compile`` of the model (Inductor for the target GPU: fused kernels, the partitioner's
  saved activations; not tried where the step compiles already or this torch cannot compile);
- a smaller micro-batch with gradient accumulation (same effective batch: the micro-batch is
  traced with the earlier micro-batches' gradients present), or a smaller batch, re-trace the
  script with its batch variable set (``--set`` semantics). One micro-batch is traced: the
  allocated peak is a later micro-batch's, but the cache can hold more after several (on the
  LSTM test, a hand-written 4-micro-batch loop reserved 12% more than the figure here).

Every result is a real estimate; nothing is scaled by a rule of thumb. Each says what to change,
as code to paste, and what it costs (:class:`~xmem_engine.advisor_cost.Cost`: extra compute first,
then micro-steps, precision, speed, training; ranked by the rule ``RANKING`` states). :func:`advise`
also finds the cheapest combination that fits, adding levers in that order.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from xmem_engine.advisor_cost import RANKING, Cost
from xmem_engine.estimate import Estimate, estimate_trace, max_batch, resolve_gpu
from xmem_engine.overrides import batch_var_in
from xmem_engine.gpus import GPU
from xmem_engine.tracing.patches import patched_attr
from xmem_engine.tracing.compiler.torch_compile import why_not_compiled


@dataclass(frozen=True)
class Lever:
    """One change: how it is applied for a measurement, what the user writes, what it costs."""

    name: str
    change: str  # the code to paste, or the setting
    cost: Cost  # what it costs, ranked by advisor_cost.RANKING
    alloc_conf: str = ""  # allocator-only: re-simulate with this PYTORCH_CUDA_ALLOC_CONF
    patch: Callable[[GPU], contextlib.AbstractContextManager] | None = None  # code: re-trace under it
    batch_divisor: int = 0  # re-trace with the batch variable divided by this (accumulation)
    smaller_batch: bool = False  # search the largest batch that fits


@dataclass
class Measured:
    """A lever's effect: the re-estimated peak, or why it could not be measured."""

    lever: Lever
    peak_device_bytes: int = 0
    fits: bool = False
    applicable: bool = True
    detail: str = ""  # e.g. "batch 24" or "no repeated blocks to checkpoint"
    error: str = ""
    estimate: Estimate | None = field(default=None, repr=False)  # for showing it (not in JSON)
    how: str = ""  # the change as measured, where it is not the lever's usual one

    @property
    def change(self) -> str:
        """The code to write (or the setting)."""
        return self.how or self.lever.change

    def to_json(self) -> dict:
        return {"lever": self.lever.name, "change": self.change, "cost": self.lever.cost.text,
                "cost_terms": self.lever.cost.to_json(),
                "peak_device_bytes": self.peak_device_bytes if self.applicable and not self.error else None,
                "fits": self.fits, "applicable": self.applicable, "detail": self.detail, "error": self.error}


@dataclass
class Advice:
    """The baseline, each lever, and the cheapest combination that fits (empty: none found)."""

    baseline: Estimate
    levers: list[Measured] = field(default_factory=list)
    combination: list[str] = field(default_factory=list)
    combination_peak_bytes: int | None = None
    alloc_conf: str = ""  # the step's own allocator setting, which the levers add to
    batch_var: str | None = None
    batch: int | None = None
    combination_estimate: Estimate | None = field(default=None, repr=False)
    batch_var_inferred: bool = False  # found by its name (:func:`infer_batch_var`), not given

    def to_json(self) -> dict:
        b = self.baseline
        return {"gpu": b.gpu, "gpu_name": b.gpu_name, "capacity_bytes": b.capacity_bytes,
                "peak_device_bytes": b.peak_device_bytes, "fits": b.fits, "alloc_conf": self.alloc_conf,
                "batch_var": self.batch_var, "batch": self.batch, "batch_var_inferred": self.batch_var_inferred,
                "ranking": RANKING, "levers": [m.to_json() for m in self.levers],
                "combination": self.combination, "combination_peak_bytes": self.combination_peak_bytes}

    def summary(self) -> str:
        b, gib = self.baseline, 1 << 30
        setting = [f"{self.batch_var} = {self.batch}"] if self.batch_var and self.batch else []
        setting += [f"PYTORCH_CUDA_ALLOC_CONF={self.alloc_conf}"] if self.alloc_conf else []
        lines = [b.headline + (f" ({', '.join(setting)})" if setting else "")]
        if self.batch_var_inferred:
            lines.append(f"(the batch size: {self.batch_var}, the one batch-size name the code assigns or passes "
                         "to a call; --batch-var to name another)")
        lines += ["", f"{'lever':38s} {'peak':>10s}  {'':30s} cost"]
        for m in self.levers:
            if m.error:
                peak, verdict = "", f"not measured: {m.error}"
            elif not m.applicable:
                peak, verdict = "", f"n/a: {m.detail}"
            else:
                peak = f"{m.peak_device_bytes / gib:.2f} GiB"
                verdict = ("fits" if m.fits else "does not fit") + (f" ({m.detail})" if m.detail else "")
            lines.append(f"{m.lever.name:38s} {peak:>10s}  {verdict:30s} {m.lever.cost.text}")
        lines += ["", RANKING, ""]
        if b.fits:
            lines.append("the step already fits; the levers above show what each would save")
        elif self.combination:
            lines.append(f"cheapest change that fits: {' + '.join(self.combination)} "
                         f"(peak {self.combination_peak_bytes / gib:.2f} GiB)")
            for name in self.combination:
                lines.append(f"  {name}: {next(m.change for m in self.levers if m.lever.name == name)}")
        else:
            lines.append("no lever or combination measured here makes it fit: a larger GPU, or sharding")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the patches

def _outermost(wrap: Callable[[torch.nn.Module, Callable, tuple, dict], Any]) -> contextlib.AbstractContextManager:
    """Patch ``nn.Module.__call__`` so that ``wrap`` runs around each outermost module call.
    A call the autograd engine makes while it runs a backward node is activation
    checkpointing's recomputation of a block, not a call of the model: it runs as it ran in
    the forward (a block compiled only on recomputation saved other tensors, and
    ``torch.utils.checkpoint`` stopped the step with ``CheckpointError``)."""
    orig = torch.nn.Module.__call__
    depth = [0]

    def call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        outer = depth[0] == 0 and torch._C._current_autograd_node() is None
        depth[0] += 1
        try:
            if outer:
                return wrap(self, functools.partial(orig, self), args, kwargs)
            return orig(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    return patched_attr(torch.nn.Module, "__call__", call)


@contextlib.contextmanager
def autocast_patch(gpu: GPU) -> Iterator[None]:
    """PyTorch's AMP recipe: ``torch.autocast("cuda")`` (bf16 where the GPU has it, else fp16)
    from the model's outermost forward under grad until the loss's ``backward()`` (so the loss
    is computed under autocast too, as the recipe has it); weights, gradients and optimizer
    state stay fp32."""
    dtype = _half(gpu)
    region: list = []  # the open autocast context, if any

    def close() -> None:
        while region:
            region.pop().__exit__(None, None, None)

    def wrap(module: torch.nn.Module, call: Callable, args: tuple, kwargs: dict) -> Any:
        if not region and torch.is_grad_enabled() and not torch.is_autocast_enabled("cuda") \
                and torch._C._current_autograd_node() is None:
            ctx = torch.autocast("cuda", dtype=dtype)
            ctx.__enter__()
            region.append(ctx)
        return call(*args, **kwargs)

    tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward

    def backward_t(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        close()
        return tensor_backward(self, *args, **kwargs)

    def backward_a(*args: Any, **kwargs: Any) -> Any:
        close()
        return autograd_backward(*args, **kwargs)

    try:
        with _outermost(wrap), patched_attr(torch.Tensor, "backward", backward_t), \
                patched_attr(torch.autograd, "backward", backward_a):
            yield
    finally:
        close()


@contextlib.contextmanager
def compile_patch(gpu: GPU) -> Iterator[None]:
    """``model = torch.compile(model)``: each outermost module call goes through its compiled
    form (Inductor for the target GPU, ``tracing/compiler/torch_compile.py``), compiled once per module."""
    compiled: dict[int, tuple[torch.nn.Module, Any]] = {}  # the module is kept: its id stays its own

    def wrap(module: torch.nn.Module, call: Callable, args: tuple, kwargs: dict) -> Any:
        if id(module) not in compiled:
            compiled[id(module)] = (module, torch.compile(module))
        return compiled[id(module)][1](*args, **kwargs)

    with _outermost(wrap):
        yield


def _half(gpu: GPU) -> torch.dtype:
    return torch.bfloat16 if tuple(gpu.compute_capability) >= (8, 0) else torch.float16


def repeated_blocks(root: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks activation checkpointing wraps: the children (with parameters) of the model's
    repeated containers (``nn.ModuleList`` anywhere, ``nn.Sequential`` at the top two levels),
    outermost first; nothing inside a block already chosen."""
    chosen: list[torch.nn.Module] = []

    def visit(m: torch.nn.Module, depth: int) -> None:
        is_list = isinstance(m, torch.nn.ModuleList) or (isinstance(m, torch.nn.Sequential) and depth <= 1)
        kids = [c for c in m.children() if any(True for _ in c.parameters())]
        if is_list and len(kids) >= 2:
            chosen.extend(kids)
            return
        for c in m.children():
            visit(c, depth + 1)

    visit(root, 0)
    return chosen


@contextlib.contextmanager
def checkpoint_patch(gpu: GPU) -> Iterator[dict]:
    """Each repeated block of the outermost module called under grad runs through
    ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: it keeps its inputs and
    recomputes its activations in backward. A transformers model gets its own
    ``gradient_checkpointing_enable()`` instead (it also turns the KV cache off, which a
    recomputation would otherwise extend twice). ``state["own"]`` counts the checkpoints the
    step makes itself: such a step already has this lever, and wrapping its blocks again would
    checkpoint them twice."""
    import torch.utils.checkpoint as ckpt

    state: dict = {"blocks": 0, "own": 0}
    wrapped: list[torch.nn.Module] = []
    hf: list[torch.nn.Module] = []  # a transformers model whose own checkpointing is on for this run
    ours = [False]  # the next checkpoint call is one of ours

    def ours_first(forward: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if _inside(ckpt.__file__):  # the step's own checkpoint runs this block: not twice
                state["own"] += 1
                return forward(*args, **kwargs)
            ours[0] = True
            return ckpt.checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return run

    def counted(orig: Callable) -> Callable:
        # both of checkpoint()'s paths look these up in the module when called, so calls through
        # a checkpoint function bound before the trace (functools.partial) are counted too
        def call(*args: Any, **kwargs: Any) -> Any:
            if hf:
                state["blocks"] += 1
            elif ours[0]:
                ours[0] = False
            else:
                state["own"] += 1
            return orig(*args, **kwargs)
        return call

    def wrap(module: torch.nn.Module, call: Callable, args: tuple, kwargs: dict) -> Any:
        # the first outermost module with repeated blocks, called under grad, is the model; a
        # block's recomputation in backward calls its layers outside any module: left alone
        if not wrapped and not hf and torch.is_grad_enabled() and torch._C._current_autograd_node() is None:
            if getattr(module, "supports_gradient_checkpointing", False) and \
                    callable(getattr(module, "gradient_checkpointing_enable", None)):
                if getattr(module, "is_gradient_checkpointing", False):
                    state["own"] += 1
                else:
                    module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                    hf.append(module)
                    state["change"] = "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=" \
                                      "{'use_reentrant': False})  # transformers' own"
                return call(*args, **kwargs)
            for block in repeated_blocks(module):
                block.forward = ours_first(block.forward)  # type: ignore[method-assign]
                wrapped.append(block)
            state["blocks"] = len(wrapped)
        return call(*args, **kwargs)

    # checkpoint()'s non-reentrant path calls the generator's _impl from torch 2.14 on
    generator = next(name for name in ("_checkpoint_without_reentrant_generator_impl",
                                       "_checkpoint_without_reentrant_generator") if hasattr(ckpt, name))
    apply = ckpt.CheckpointFunction.apply
    try:
        with _outermost(wrap), patched_attr(ckpt, generator, counted(getattr(ckpt, generator))), \
                patched_attr(ckpt.CheckpointFunction, "apply", counted(apply)):
            yield state
    finally:
        for block in wrapped:
            block.__dict__.pop("forward", None)
        for model in hf:
            model.gradient_checkpointing_disable()


def _inside(filename: str) -> bool:
    """Whether a caller's frame runs code of ``filename``."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return True
        frame = frame.f_back
    return False


def accumulation_patch(gpu: GPU) -> contextlib.AbstractContextManager:
    """What a micro-batch after the first sees under gradient accumulation: the gradients of the
    earlier micro-batches are already there. Before the model's first forward under grad, each
    parameter without a gradient gets a zero one (the micro-batch itself comes from the batch
    variable, divided)."""
    def wrap(module: torch.nn.Module, call: Callable, args: tuple, kwargs: dict) -> Any:
        if torch.is_grad_enabled() and torch._C._current_autograd_node() is None:
            with torch.no_grad():
                for p in module.parameters():
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
        return call(*args, **kwargs)

    return _outermost(wrap)


def _optimizer_patch(change: Callable[[torch.optim.Optimizer], None]) -> contextlib.AbstractContextManager:
    orig = torch.optim.Optimizer.__init__

    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        change(self)

    return patched_attr(torch.optim.Optimizer, "__init__", init)


def _set_group(key: str, value: Any, off: str | None = None) -> Callable[[torch.optim.Optimizer], None]:
    def change(opt: torch.optim.Optimizer) -> None:
        for group in [opt.defaults, *opt.param_groups]:
            if key in group:
                group[key] = value
                if off is not None and off in group:
                    group[off] = False
    return change


def for_loop_patch(gpu: GPU) -> contextlib.AbstractContextManager:
    return _optimizer_patch(_set_group("foreach", False))


def fused_patch(gpu: GPU) -> contextlib.AbstractContextManager:
    return _optimizer_patch(_set_group("fused", True, off="foreach"))


@contextlib.contextmanager
def adafactor_patch(gpu: GPU) -> Iterator[None]:
    """``torch.optim.Adam`` / ``AdamW`` built as ``torch.optim.Adafactor`` (factored second
    moments, no first moment): the optimizer state shrinks from two tensors per parameter to
    a row and a column per matrix. Swapped in ``__init__`` (the new object becomes an
    Adafactor), so a class imported before the trace (``from torch.optim import AdamW`` in an
    earlier notebook cell) is swapped too."""
    import inspect

    def swapped(cls: type) -> Callable:
        signature = inspect.signature(cls.__init__)

        def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            given = signature.bind(self, *args, **kwargs).arguments
            lr = given.get("lr", 1e-2)
            self.__class__ = torch.optim.Adafactor
            torch.optim.Adafactor.__init__(self, given["params"], lr=lr if isinstance(lr, float) else 1e-2,
                                           weight_decay=float(given.get("weight_decay", 0.0)))
        return init

    with contextlib.ExitStack() as stack:
        for cls in (torch.optim.Adam, torch.optim.AdamW):
            stack.enter_context(patched_attr(cls, "__init__", swapped(cls)))
        yield


@contextlib.contextmanager
def set_to_none_patch(gpu: GPU) -> Iterator[None]:
    opt_zero, mod_zero = torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad

    def opt(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        opt_zero(self, set_to_none=True)

    def mod(self: torch.nn.Module, set_to_none: bool = True) -> None:
        mod_zero(self, set_to_none=True)

    with patched_attr(torch.optim.Optimizer, "zero_grad", opt), patched_attr(torch.nn.Module, "zero_grad", mod):
        yield


#: names a batch size goes by in training scripts and notebooks, most specific first
def levers(gpu: GPU, batch_var: str | None) -> list[Lever]:
    """The levers, cheapest first by :data:`~xmem_engine.advisor_cost.RANKING` (``Cost.key``)."""
    half = "bfloat16" if _half(gpu) == torch.bfloat16 else "float16"
    scaler = "" if half == "bfloat16" else " + torch.amp.GradScaler('cuda') around backward/step"
    out = [
        Lever("expandable segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", Cost(),
              alloc_conf="expandable_segments:True"),
        Lever("zero_grad(set_to_none=True)", "optimizer.zero_grad(set_to_none=True)  # the default since torch 2.0",
              Cost(), patch=set_to_none_patch),
        Lever("fused optimizer", "torch.optim.AdamW(params, ..., fused=True)", Cost(note="usually faster"),
              patch=fused_patch),
        Lever("torch.compile", "model = torch.compile(model)", Cost(note="compiles before the first step; usually "
              "faster"), patch=compile_patch),
        Lever("for-loop optimizer", "torch.optim.AdamW(params, ..., foreach=False)",
              Cost(slower="one kernel per parameter in the optimizer step"), patch=for_loop_patch),
        Lever("garbage-collection threshold", "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6",
              Cost(slower="occasional cache flushes"), alloc_conf="garbage_collection_threshold:0.6"),
        Lever(f"autocast {half}", f"with torch.autocast('cuda', dtype=torch.{half}): loss = loss_fn(model(x), y)  "
              f"# then loss.backward() outside{scaler}",
              Cost(precision=f"{half} activations", note="usually faster"), patch=autocast_patch),
        Lever("activation checkpointing", "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) "
              "for each repeated block", Cost(extra_compute_pct=33, note="each block's forward runs again in backward"),
              patch=checkpoint_patch),
        Lever("Adafactor instead of Adam(W)", "torch.optim.Adafactor(params, lr=...)",
              Cost(training="another optimizer: retune the learning rate"), patch=adafactor_patch),
    ]
    if batch_var:
        for k in (2, 4):
            change = (f"{batch_var} //= {k}; accumulate {k} micro-batches: (loss / {k}).backward(), "
                      f"optimizer.step() every {k}")
            if batch_var == "per_device_train_batch_size":  # a Trainer's config: it accumulates itself
                change = f"{batch_var}=<divided by {k}>, gradient_accumulation_steps=<multiplied by {k}>"
            out.append(Lever(f"gradient accumulation x{k}", change,
                             Cost(micro_steps=k, note="same effective batch; batch norm sees the micro-batch"),
                             batch_divisor=k, patch=accumulation_patch))
        out.append(Lever("largest batch that fits", f"{batch_var} = <the largest that fits>",
                         Cost(training="another effective batch: retune the learning rate"), smaller_batch=True))
    return sorted(out, key=lambda lv: lv.cost.key())


# --------------------------------------------------------------------------- measuring

Runner = Callable[[list[Lever], "int | None", str], "tuple[Estimate, dict]"]
"""``run(levers, batch, alloc_conf)``: the step traced with the levers' patches in place and
its batch variable set to ``batch`` (None: as written), estimated with ``alloc_conf``; returns
the estimate and what the patches reported (``checkpoint_patch``'s counts)."""


def with_conf(base: str, extra: str) -> str:
    """Two ``PYTORCH_CUDA_ALLOC_CONF`` strings as one (``extra``'s keys win)."""
    keys = {p.split(":", 1)[0].strip() for p in extra.split(",") if p.strip()}
    kept = [p for p in base.split(",") if p.strip() and p.split(":", 1)[0].strip() not in keys]
    return ",".join(kept + [p for p in extra.split(",") if p.strip()])


def advise(path: str, gpu: str | GPU, *, batch_var: str | None = None, overrides: dict[str, str] | None = None,
           mode: str = "auto", alloc_conf: str = "", torch_version: str | None = None,
           iterations: int | None = None, progress: Callable[[str], None] | None = None) -> Advice:
    """Measure every lever on the script at ``path`` for ``gpu``; see the module docstring."""
    from xmem_engine.batch_family import symbolic_family
    from xmem_engine.overrides import OverrideError, positive_int_value
    from xmem_engine.tracing import trace_script

    target = resolve_gpu(gpu)
    overrides = dict(overrides or {})
    batch = None
    inferred = False
    if batch_var is None:
        batch_var = batch_var_in(Path(path).read_text(encoding="utf-8"), overrides)
        inferred = batch_var is not None
    if batch_var:
        try:
            batch = int(overrides[batch_var]) if batch_var in overrides else positive_int_value(path, batch_var)
        except OverrideError as e:  # the one check --max-batch and sweeps make too
            raise ValueError(f"--batch-var {batch_var}: {e}") from None
        if batch < 1:
            raise ValueError(f"--batch-var {batch_var}: --set gives it {batch}; a positive integer is needed")

    def run(patches: list[Lever], value: int | None, conf: str) -> tuple[Estimate, dict]:
        ov = overrides if value is None else {**overrides, str(batch_var): str(value)}
        with applied(patches, target) as info:
            tr = trace_script(path, mode=mode, overrides=ov, device=target.properties(), max_iterations=iterations,
                              torch_version=torch_version)
        return estimate_trace(tr, target, conf or None, torch_version=torch_version), info

    symbolic = None if mode == "real" or not batch_var else functools.partial(  # one trace for the batch search
        symbolic_family, path, batch_var, overrides={k: v for k, v in overrides.items() if k != batch_var},
        device=target.properties(), max_iterations=iterations, torch_version=torch_version)
    advice = measure(run, target, batch_var=batch_var, batch=batch, alloc_conf=alloc_conf,
                     torch_version=torch_version, progress=progress, symbolic=symbolic)
    advice.batch_var_inferred = inferred
    return advice


@contextlib.contextmanager
def applied(chosen: list[Lever], gpu: GPU) -> Iterator[dict]:
    """The levers' patches in place for one trace; the dict yielded holds what they reported
    (``checkpoint_patch``'s counts) once the block ends."""
    info: dict = {}
    with contextlib.ExitStack() as stack:
        states = [stack.enter_context(lv.patch(gpu)) for lv in chosen if lv.patch is not None]
        try:
            yield info
        finally:
            info.update({k: v for st in states if isinstance(st, dict) for k, v in st.items()})


def measure(run: Runner, target: GPU, **kwargs: Any) -> Advice:
    """Every lever through ``run``, then the cheapest combination that fits (:func:`_measure`,
    its keyword arguments). Each lever re-runs the script: a warning it gives is shown once,
    not once per lever (issue #35: a cell's own warning came 7 times)."""
    import warnings

    with warnings.catch_warnings():
        warnings.showwarning = _shown_once(warnings.showwarning)
        return _measure(run, target, **kwargs)


def _shown_once(show: Callable[..., None]) -> Callable[..., None]:
    seen: set[tuple] = set()

    def once(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        key = (str(message), category, filename, lineno)
        if key not in seen:
            seen.add(key)
            show(message, category, filename, lineno, file, line)

    return once


def _measure(run: Runner, target: GPU, *, batch_var: str | None = None, batch: int | None = None,
             alloc_conf: str = "", base: Estimate | None = None, torch_version: str | None = None,
             progress: Callable[[str], None] | None = None, symbolic: Callable[[int], Any] | None = None) -> Advice:
    """Every lever through ``run``, then the cheapest combination that fits. ``base``: the step as written,
    where the caller has it (the widget); ``symbolic``: for ``max_batch``, a size -> the step traced with it a symbol."""
    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    if base is None:
        say("baseline")
        base, _ = run([], None, alloc_conf)
    advice = Advice(base, alloc_conf=alloc_conf, batch_var=batch_var, batch=batch)
    for lv in levers(target, batch_var if batch else None):
        say(lv.name)
        m = Measured(lv)
        try:
            if lv.alloc_conf:
                est = estimate_trace(base.trace, target, with_conf(alloc_conf, lv.alloc_conf),
                                     torch_version=torch_version)
            elif lv.batch_divisor:
                if batch < lv.batch_divisor:
                    m.applicable, m.detail = False, f"{batch_var} = {batch} cannot be split {lv.batch_divisor} ways"
                    advice.levers.append(m)
                    continue
                est, _ = run([lv], batch // lv.batch_divisor, alloc_conf)
                m.detail = f"micro-batch {batch // lv.batch_divisor}"
            elif lv.smaller_batch:
                search = max_batch(lambda v: run([], v, alloc_conf)[0], start=batch, estimate_trace=lambda tr: estimate_trace(
                    tr, target, alloc_conf or None, torch_version=torch_version), symbolic=symbolic)
                if search.value <= 0:
                    m.applicable, m.detail = False, f"not even {batch_var} = 1 fits"
                    advice.levers.append(m)
                    continue
                est = search.estimate
                m.detail = f"{batch_var} = {search.answer()}"
            elif lv.patch is compile_patch and why_not_compiled(base.trace.meta):
                m.applicable, m.detail = False, str(why_not_compiled(base.trace.meta))
                advice.levers.append(m)
                continue
            else:
                est, info = run([lv], None, alloc_conf)
                m.how = info.get("change", "")
                if lv.patch is checkpoint_patch and info.get("own"):
                    m.applicable, m.detail = False, f"the step checkpoints already ({info['own']:,} checkpointed calls)"
                    advice.levers.append(m)
                    continue
                if lv.patch is checkpoint_patch and not info.get("blocks"):
                    m.applicable, m.detail = False, "no repeated blocks (ModuleList / Sequential) to checkpoint"
                    advice.levers.append(m)
                    continue
            m.peak_device_bytes, m.fits, m.estimate = est.peak_device_bytes, est.fits, est
            if est.peak_device_bytes == base.peak_device_bytes and not m.detail:
                m.detail = "no change here"
        except Exception as e:  # one lever failing (e.g. fused on an optimizer without it) is reported
            if lv.patch is compile_patch:  # xmem's compile for the GPU, not the user's step, fell short
                m.applicable = False
                m.detail = f"compiling it for the GPU failed here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
            else:
                m.error = f"{type(e).__name__}: {e}"[:200]
        advice.levers.append(m)

    if not base.fits:
        say("the cheapest combination")
        _combine(advice, run, batch)
    return advice


def _combine(advice: Advice, run: Runner, batch: int | None) -> None:
    """Add the levers that lowered the peak, cheapest first, until the step fits."""
    useful = sorted((m for m in advice.levers if m.applicable and not m.error
                     and m.peak_device_bytes < advice.baseline.peak_device_bytes),
                    key=lambda m: (m.lever.cost.key(), m.peak_device_bytes))
    best = next((m for m in useful if m.fits), None)  # useful is in (cost, peak) order
    if best is not None:
        advice.combination, advice.combination_peak_bytes = [best.lever.name], best.peak_device_bytes
        advice.combination_estimate = best.estimate
        return
    chosen: list[Lever] = []
    for m in useful:
        if m.lever.smaller_batch:
            continue  # a smaller batch alone is measured above; combined it is the last resort
        if m.lever.batch_divisor and any(c.batch_divisor for c in chosen):
            continue
        chosen.append(m.lever)
        conf = advice.alloc_conf
        for c in chosen:
            conf = with_conf(conf, c.alloc_conf) if c.alloc_conf else conf
        div = next((c.batch_divisor for c in chosen if c.batch_divisor), 0)
        try:
            est, _ = run([c for c in chosen if c.patch is not None], batch // div if div and batch else None, conf)
        except Exception:  # a combination that cannot run is not advice
            chosen.pop()
            continue
        if est.fits:
            advice.combination = [c.name for c in chosen]
            advice.combination_peak_bytes = est.peak_device_bytes
            advice.combination_estimate = est
            return
