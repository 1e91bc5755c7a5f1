"""``mode="reduce-overhead"`` on the virtual GPU: what CUDA graph trees ask of the allocator.

Inductor wraps each compiled graph it can capture in ``cudagraphify`` (``torch/_inductor/
cudagraph_trees.py``, PyTorch 2.10-2.14). On a GPU, for each graph (forward, backward, each
shape's own):

- **one private memory pool** per device serves every graph of the process (the tree
  manager's ``graph_pool_handle``, kept alive by an empty capture, whose ``torch.cuda.graph``
  empties the cache when the first graph is first called); the rest of the step cannot use its
  cached blocks, nor it theirs, and ``empty_cache`` leaves it alone while the graphs live;
- **call 1 warms up**: the compiled code runs eagerly on the manager's side stream with every
  allocation routed to the pool (``_use_cuda_memory_pool_manager``);
- **call 2 records**: inputs that are neither static (parameters, buffers, a backward's saved
  tensors) nor outputs of an earlier graph are copied into fresh pool buffers
  (``_allocate_and_copy_recording_inputs``), then ``torch.cuda.graph`` empties the cache and
  captures the step into the pool: its buffers are allocated and freed there, its outputs stay;
- **calls 3 on replay**: nothing is allocated; the outputs are the recording's blocks, written
  again, and the previous call's outputs the code still holds are overwritten.

Here no graph is captured. :class:`GraphTrees` stands in for ``cudagraphify``: every call runs
the compiled code (as eager code runs under the tracer; replays, once two agree, are made from
their pattern instead: ``graph_replays.py``) on the side stream inside the pool
(``pool_begin`` / ``pool_end`` trace events), call 2 copies the inputs and empties the cache
first, and from call 2 on the previous call's outputs still held are given back before the
call, so a replay's requests land on the blocks its recording used: the pool's reserved
memory is the GPU's. What differs: during a replay the graph's buffers count as allocated (a
GPU's replay asks the allocator for nothing), so ``memory_allocated`` inside a replay reads
higher than a GPU's; the peaks are the recording's. Generations (``cudagraph_mark_step_begin``,
a second warm-up where a backward is pending) and cuBLAS's workspace swap around a capture are
not followed; the notes say so where the code marks steps, and for every capture. Graphs Inductor will not capture (its ``skipping cudagraphs due to ...``) run
without the pool, as on the GPU, and are named in the notes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from xmem_engine.trace import ALLOC, POOL_BEGIN, POOL_END
from xmem_engine.tracing.compiler import graph_replays
from xmem_engine.tracing.compiler.graph_replays import ReplayForm
from xmem_engine.tracing.cuda_graphs import pool_event
from xmem_engine.tracing.patches import patched_attr
from xmem_engine.tracing.virtual_cuda import VirtualStream


@dataclass
class GraphTreeRecord:
    """What the CUDA graph trees did in one trace (read by the compile notes and ``--json``)."""

    graphs: int = 0  # graphs run in the pool (Inductor wrapped them for CUDA graphs)
    recorded: int = 0  # of them, captured (called twice or more)
    replays: int = 0
    made: int = 0  # of the replays, made from the pattern of the ones before (graph_replays.py)
    copied_inputs: int = 0  # input buffers made in the pool at recording
    skipped: list[str] = field(default_factory=list)  # Inductor's reasons for graphs it left out
    step_marks: int = 0  # torch.compiler.cudagraph_mark_step_begin() calls (generations: not followed)

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    def notes(self, modes: list[str] = ()) -> list[str]:
        """``modes``: the torch.compile modes that asked for CUDA graphs, to name them."""
        out = []
        if self.graphs:
            asked = " / ".join(f"mode='{m}'" for m in modes) or "triton.cudagraphs"
            out.append(
                f"CUDA graphs ({asked}): {self.graphs} graph{'s' if self.graphs != 1 else ''} "
                f"in one private memory pool, as CUDA graph trees keep them ({self.recorded} captured, "
                f"{self.replays} replays, {self.copied_inputs} input buffer{'s' if self.copied_inputs != 1 else ''} "
                "copied into the pool). The rest of the step cannot reuse the pool's memory. Replays are counted as "
                "re-runs inside the pool: reserved memory is the GPU's, allocated memory during a replay is higher"
                + (f"; {self.made} replays were made from the pattern of the ones before, not run" if self.made else "")
                + ". Not followed: the cuBLAS workspace a capture clears and makes again")
            if self.step_marks:
                out.append(f"CUDA graphs: torch.compiler.cudagraph_mark_step_begin() was called {self.step_marks} "
                           f"time{'s' if self.step_marks != 1 else ''}; the trees' generations are not followed: "
                           "each call of a graph is taken as a new step's (the previous call's outputs are "
                           "overwritten), where a GPU records a graph called twice in one step twice and keeps "
                           "both calls' outputs")
            if not self.recorded:
                out.append("CUDA graphs: no graph was called twice, so none was captured; the estimate holds "
                           "their warm-up runs only (run two or more steps to see the captured step)")
        if self.skipped:
            reasons = sorted(set(self.skipped))
            out.append(f"CUDA graphs: Inductor left {len(self.skipped)} graph{'s' if len(self.skipped) != 1 else ''} "
                       f"out ({'; '.join(reasons[:2])}); they ran without CUDA graphs, as on the GPU")
        return out


class GraphTrees:
    """``cudagraphify`` for the virtual GPU (module docstring): one pool, one side stream."""

    def __init__(self, tracer: Any, record: GraphTreeRecord):
        self.t = tracer
        self.record = record
        self.pool: int | None = None  # the trees' private pool number in the trace, taken at first use
        self.stream: VirtualStream | None = None  # the manager's side stream, made at first use
        self.outputs_of: dict[int, int] = {}  # storage key -> event id, of outputs made in the pool

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Inductor's ``cudagraphify`` replaced by :meth:`cudagraphify`, its skips recorded."""
        from torch._inductor import compile_fx, cudagraph_trees, output_code

        real_skip = output_code.log_cudagraph_skip_and_bump_counter

        def skip(msg: str) -> None:
            self.record.skipped.append(str(msg).removeprefix("skipping cudagraphs due to ").strip())
            real_skip(msg)

        with contextlib.ExitStack() as stack:
            stack.enter_context(patched_attr(compile_fx, "cudagraphify", self.cudagraphify))
            for mod in (output_code, compile_fx):  # each imported the function by name
                if hasattr(mod, "log_cudagraph_skip_and_bump_counter"):
                    stack.enter_context(patched_attr(mod, "log_cudagraph_skip_and_bump_counter", skip))
            stack.enter_context(patched_attr(cudagraph_trees, "mark_step_begin", self._mark_step(cudagraph_trees)))
            # a backward Inductor leaves out tells the (absent) tree manager it runs: nothing to tell
            stack.enter_context(patched_attr(output_code, "maybe_handle_backward_generation", lambda *a, **k: None))
            yield

    def _mark_step(self, trees: Any) -> Callable[[], None]:
        """``cudagraph_mark_step_begin``, counted for the notes."""
        real = trees.mark_step_begin

        def mark() -> None:
            self.record.step_marks += 1
            real()

        return mark

    def cudagraphify(self, model: Callable[..., Any], static_input_idxs: Sequence[int] = (), *,
                     mutated_input_idxs: Sequence[int] = (), **_: Any) -> Callable[..., Any]:
        static = frozenset(static_input_idxs)
        mutated = [i for i in mutated_input_idxs if i not in static]
        calls = 0
        last: list[tuple[weakref.ref, int, int]] = []  # the last call's outputs: (storage, key, event id)
        said = False
        # replays made from their pattern (graph_replays.py): the last real replay's form, the one
        # both of the last two agreed on, or why this graph's replays cannot be made
        seen: ReplayForm | None = None
        form: ReplayForm | None = None
        unmade: str | None = None if graph_replays.enabled() else "asked"

        def run(new_inputs: list) -> Any:
            nonlocal calls, last, said, seen, form, unmade
            if any(isinstance(new_inputs[i], torch.Tensor) and not self._managed(new_inputs[i]) for i in mutated):
                # the tree manager runs a graph that writes into an input it does not own eagerly,
                # outside the pool (non_cudagraph_managed_mutation_hint)
                if not said:
                    said = True
                    self.record.skipped.append("mutated inputs (an input that is neither a parameter, a buffer "
                                               "nor a graph's output is written to)")
                return model(new_inputs)
            calls += 1
            if calls == 1:
                self.record.graphs += 1
            else:
                self._overwrite(last)  # the recording's (or the last replay's) outputs are written again
                if calls == 2:
                    self.record.recorded += 1
                else:
                    self.record.replays += 1
            start = len(self.t.events)
            with self._in_pool():
                if calls == 2:
                    new_inputs = self._copy_inputs(new_inputs, static)
                    self.t.empty_cache()  # torch.cuda.graph's __enter__
                if form is not None:
                    out = graph_replays.make(self.t, form, new_inputs, self.t.vc.device)
                    new_inputs.clear()
                    self.record.made += 1
                else:
                    keys = graph_replays.input_keys(new_inputs) if calls > 2 and unmade is None else None
                    before = graph_replays.Before.of(self.t) if keys is not None else None
                    out = model(new_inputs)
                    if keys is not None:
                        try:
                            now = graph_replays.form_of(self.t, before, keys, out)
                        except graph_replays.NotMade as e:
                            unmade = str(e)
                        else:
                            form, seen = (now if now == seen else None), now
            last = self._made_here(out, {e.id for e in self.t.events[start:] if e.kind == ALLOC})
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    # -- the pieces
    @contextlib.contextmanager
    def _in_pool(self) -> Iterator[None]:
        t, vc = self.t, self.t.vc
        if self.pool is None:  # the tree manager is made: its pool kept alive by an empty capture,
            self.pool, self.stream = vc.graphs.new_pool(), VirtualStream()
            t.empty_cache()  # whose torch.cuda.graph empties the cache
        pool_event(t, POOL_BEGIN, self.pool)  # the current thread's requests, on any stream
        try:
            with vc.on_stream(self.stream):
                yield
        finally:
            pool_event(t, POOL_END, self.pool)

    def _managed(self, x: torch.Tensor) -> bool:
        """``x`` is an output of a graph, still in the pool (a static input of later graphs)."""
        key = x.untyped_storage()._cdata
        rec = self.t.live.get(key)
        return rec is not None and rec.event is not None and self.outputs_of.get(key) == rec.event.id

    def _copy_inputs(self, inputs: list, static: frozenset[int]) -> list:
        """The recording's inputs: each one neither static nor a graph's output copied into a new
        pool buffer (``static_input``: same size and strides), which the graph frees at its last use."""
        out = list(inputs)
        for i, x in enumerate(out):
            if isinstance(x, torch.Tensor) and i not in static and self.t.is_gpu(x) and not self._managed(x):
                buf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                out[i] = buf
                self.record.copied_inputs += 1
        inputs.clear()  # the boxed call's contract: the callee owns its inputs
        return out

    def _made_here(self, out: Any, made_ids: set[int]) -> list[tuple[weakref.ref, int, int]]:
        """The call's outputs whose storage it allocated (an event in ``made_ids``)."""
        from torch.utils._pytree import tree_leaves

        made = []
        for x in tree_leaves(out):
            if not isinstance(x, torch.Tensor):
                continue
            st = x.untyped_storage()
            key = st._cdata
            rec = self.t.live.get(key)
            if rec is not None and rec.event is not None and rec.event.id in made_ids:
                self.outputs_of[key] = rec.event.id
                made.append((weakref.ref(st), key, rec.event.id))
        return made

    def _overwrite(self, last: list[tuple[weakref.ref, int, int]]) -> None:
        """Outputs of the graph's last call still held: a GPU writes this call's into the same
        memory, so their blocks are given back now (their tensors are stale on the GPU)."""
        for ref, key, event_id in last:
            rec = self.t.live.get(key)
            if ref() is not None and rec is not None and rec.event is not None and rec.event.id == event_id:
                self.outputs_of.pop(key, None)
                self.t.free_storage(key)
