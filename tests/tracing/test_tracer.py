"""The tracer: a CUDA training step run on the CPU, recorded as GPU memory requests."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.nn as nn

from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.trace import Trace, TraceEvent
from xmem_engine.tracing import Tracer, UnsupportedOpError, trace, user_traceback_lines

from tests.model_zoo import MLP, train_fn

MODES = ["fake", "real"]


def allocs(tr: Trace, **match) -> list[TraceEvent]:
    return [e for e in tr.events if e.kind == "alloc" and all(getattr(e, k) == v for k, v in match.items())]


def live_bytes_by_category(tr: Trace) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in tr.events:
        if e.kind in ("alloc", "free"):
            out[e.category] = out.get(e.category, 0) + (e.bytes if e.kind == "alloc" else -e.bytes)
    return out


def nbytes(module: nn.Module, grads: bool = False) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


# --------------------------------------------------------------------------- basics
@pytest.mark.parametrize("mode", MODES)
def test_only_gpu_tensors_are_traced(mode):
    src = """
import torch
cpu_data = torch.randn(1000, 100)          # host: not traced
cpu_sum = (cpu_data * 2).sum()             # host arithmetic: not traced
x = torch.zeros(10, 10, device="cuda")     # 400 B
y = torch.ones(5, device=torch.device("cuda:0")).to(torch.float64)  # 20 B, then a 40 B cast
z = cpu_data[:3].to("cuda")                # 1200 B
"""
    tr = trace(src, {}, mode=mode)
    assert sorted((e.bytes, e.category) for e in allocs(tr)) == [
        (20, "input"), (40, "other"), (400, "input"), (1200, "input")]  # the cast is GPU work
    assert all(e.source.startswith("<cell>:") for e in allocs(tr))


@pytest.mark.parametrize("mode", MODES)
def test_views_share_one_allocation_and_inplace_ops_allocate_nothing(mode):
    src = """
import torch
x = torch.empty(64, 64, device="cuda")
v = x.view(4096); t = x.t(); s = x[::2, 1:]; c = x.chunk(4)
x.add_(1); x.mul_(2); x.t_(); v.zero_(); torch.relu_(x)
y = x.clone()
"""
    tr = trace(src, {}, mode=mode)
    assert [(e.op, e.bytes) for e in allocs(tr)] == [("aten.empty.memory_format", 16384), ("aten.clone.default", 16384)]


@pytest.mark.parametrize("mode", MODES)
def test_free_is_recorded_when_the_last_reference_dies(mode):
    src = """
import torch
a = torch.empty(256, device="cuda")
b = a[10:20]          # a view keeps the storage alive
del a
marker = torch.empty(1, device="cuda")
del b
"""
    tr = trace(src, {}, mode=mode)
    kinds = [(e.kind, e.bytes) for e in tr.events if e.kind in ("alloc", "free")]
    # 1024 B alloc, marker alloc, then the free of the 1024 B storage (after `del b`), ...
    assert kinds[:3] == [("alloc", 1024), ("alloc", 4), ("free", 1024)]
    a_id = allocs(tr)[0].id
    assert [e.id for e in tr.events if e.kind == "free"].count(a_id) == 1


def test_cuda_device_is_virtual_inside_and_restored_after():
    had_cuda = torch.cuda.is_available()
    src = """
import torch
avail = torch.cuda.is_available()
count = torch.cuda.device_count()
name = torch.cuda.get_device_name(0)
props = torch.cuda.get_device_properties(0)
total = props.total_memory
cap = torch.cuda.get_device_capability()
x = torch.randn(3, device="cuda")
dev = str(x.device)
is_cuda = x.is_cuda
same = x.device == torch.device("cuda:0")
h = x.cpu()
host_dev = str(h.device)
m = torch.nn.Linear(2, 2).to("cuda")
param_dev = str(next(m.parameters()).device)
"""
    ns: dict = {}
    trace(src, ns, mode="fake", device={"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_520_809_984,
                                         "major": 9, "minor": 0, "multi_processor_count": 132})
    assert ns["avail"] is True and ns["count"] == 1
    assert ns["name"] == "NVIDIA H100 80GB HBM3" and ns["total"] == 85_520_809_984 and ns["cap"] == (9, 0)
    assert ns["dev"] == "cuda:0" and ns["is_cuda"] is True and ns["same"] is True
    assert ns["host_dev"] == "cpu" and ns["param_dev"] == "cuda:0"
    assert torch.cuda.is_available() == had_cuda
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("mode", MODES)
def test_memory_statistics_answer_from_the_simulated_allocator(mode):
    src = """
import torch
a = torch.empty(1000, device="cuda")          # 4000 B -> one 4096 B block
after_a = torch.cuda.memory_allocated()
b = torch.empty(1 << 20, device="cuda")       # 4 MiB
peak1 = torch.cuda.max_memory_allocated()
del b
after_free = torch.cuda.memory_allocated()
reserved = torch.cuda.memory_reserved()
torch.cuda.reset_peak_memory_stats()
peak2 = torch.cuda.max_memory_allocated()
torch.cuda.empty_cache()
reserved_after_empty = torch.cuda.memory_reserved()
stats_allocated = torch.cuda.memory_stats()["allocated_bytes.all.current"]
free, total = torch.cuda.mem_get_info()
"""
    ns: dict = {}
    alloc = CachingAllocator()
    tr = trace(src, ns, mode=mode, allocator=alloc)
    assert ns["after_a"] == 4096
    assert ns["peak1"] == 4096 + (1 << 22)
    assert ns["after_free"] == 4096 == ns["stats_allocated"]
    assert ns["reserved"] >= 4096 + (1 << 22)
    assert ns["peak2"] == 4096
    assert ns["reserved_after_empty"] < ns["reserved"]
    # free as the driver says it: the CUDA context (the default A100's, 426 MiB) is not free
    assert ns["total"] == 42_505_273_344 and ns["free"] == ns["total"] - 446_693_376 - ns["reserved_after_empty"]
    kinds = [e.kind for e in tr.events]
    assert kinds.count("reset_peak") == 1 and kinds.count("empty_cache") == 1
    assert kinds.index("reset_peak") < kinds.index("empty_cache")


def test_streams_and_record_stream():
    src = """
import torch
s = torch.cuda.Stream()
a = torch.empty(128, device="cuda")
with torch.cuda.stream(s):
    b = torch.empty(256, device="cuda")
    a.record_stream(torch.cuda.current_stream())
c = torch.empty(64, device="cuda")
torch.cuda.synchronize()
"""
    tr = trace(src, {}, mode="fake")
    a, b, c = allocs(tr)
    assert a.stream == 0 and c.stream == 0 and b.stream != 0
    rec = [e for e in tr.events if e.kind == "record_stream"]
    assert len(rec) == 1 and rec[0].id == a.id and rec[0].streams == (b.stream,)


@pytest.mark.parametrize("wait", ["torch.cuda.synchronize()", "done.synchronize()", "side.synchronize()", "pass"])
def test_a_wait_for_the_device_completes_frees_deferred_by_record_stream(wait):
    """FSDP1 gathers each layer on a stream of its own and records its use on the compute
    stream; the rate limiter waits on an event each time. Without the wait being recorded,
    every deferred free stayed out of the pool and the reserved memory grew each layer."""
    from xmem_engine.simulation.simulate import simulate

    src = f"""
import torch
side = torch.cuda.Stream()
for layer in range(8):
    with torch.cuda.stream(side):
        flat = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    flat.record_stream(torch.cuda.current_stream())
    del flat
    done = torch.cuda.Event()
    done.record()
    {wait}
"""
    tr = trace(src, {}, mode="fake")
    reserved = simulate(tr.events).peak_reserved_bytes
    if wait == "pass":
        assert reserved == 8 * 64 * 2**20 and not any(e.kind == "synchronize" for e in tr.events)
    else:
        assert reserved == 64 * 2**20 and sum(e.kind == "synchronize" for e in tr.events) == 8


def test_stream_functions_take_torchs_keyword_names():
    """timm's prefetching loader calls ``torch.cuda.stream(stream=s)``; a stand-in named its
    parameter otherwise, and timm's ``train.py`` stopped at its first batch."""
    src = """
import torch
from functools import partial
s = torch.cuda.Stream()
with partial(torch.cuda.stream, stream=s)():
    b = torch.empty(256, device="cuda")
torch.cuda.set_stream(stream=s)
c = torch.empty(64, device="cuda")
torch.cuda.set_stream(torch.cuda.default_stream())
"""
    tr = trace(src, {}, mode="fake")
    b, c = allocs(tr)
    assert b.stream == c.stream != 0


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_raw_streams_and_pinned_host_buffers_need_no_driver(mode):
    """Libraries that keep CUDA's raw stream handles (Unsloth's kernels, at import) or stage
    through page-locked host buffers (``pin_memory=True``) ran into the missing driver."""
    src = """
import torch
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    handles = [torch._C._cuda_getCurrentRawStream(0), torch.cuda.current_stream().cuda_stream]
staging = torch.empty(4096, pin_memory=True)
x = torch.randn(4096, device="cuda")
staging.copy_(x, non_blocking=True)
y = torch.zeros(64, pin_memory=True).cuda()
"""
    ns: dict = {}
    tr = trace(src, ns, mode=mode)
    assert ns["handles"][0] == ns["handles"][1] != 0  # the virtual side stream's handle
    assert [e.bytes for e in allocs(tr)] == [4096 * 4, 64 * 4]  # the host buffers hold no GPU memory


def test_a_child_the_code_forks_ends_at_its_exit_not_in_the_trace(tmp_path):
    """multiprocessing's fork children end with ``os._exit``, which the trace turns into an end of
    the script: the child unwound into xmem and ended the trace there too, removing the trace's
    file placeholders from under the parent (Unsloth checks its statistics in a forked child)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method here")
    src = f"""
import multiprocessing, os, torch
model = torch.nn.Linear(64, 64).cuda()
torch.save(model.state_dict(), {str(tmp_path / "ckpt.pt")!r})   # a placeholder while tracing
child = multiprocessing.get_context("fork").Process(target=print, args=("child ran",))
child.start(); child.join()
code = child.exitcode
kept = os.path.exists({str(tmp_path / "ckpt.pt")!r})
x = torch.randn(1024, device="cuda")
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["code"] == 0 and ns["kept"]
    assert allocs(tr)[-1].bytes == 1024 * 4  # the parent's trace went on after the child


# --------------------------------------------------------------------------- training step
@pytest.mark.parametrize("mode", MODES)
def test_training_step_categories_phases_and_iterations(mode):
    tr = trace(train_fn("mlp", iters=3, opt="adamw"), mode=mode)
    model = MLP()
    pbytes = nbytes(model)
    cats = {c: sum(e.bytes for e in allocs(tr, category=c)) for c in
            ("parameter", "gradient", "optimizer_state", "activation", "temporary", "input")}
    assert cats["parameter"] == pbytes
    assert cats["optimizer_state"] == 2 * pbytes          # AdamW: exp_avg and exp_avg_sq
    assert cats["gradient"] == 3 * pbytes                  # set_to_none: new grads every iteration
    assert cats["activation"] > 0 and cats["temporary"] > 0 and cats["input"] > 0
    # phases of each allocation category
    assert {e.phase for e in allocs(tr, category="gradient")} == {"backward"}
    assert {e.phase for e in allocs(tr, category="optimizer_state")} == {"optimizer"}
    assert {e.phase for e in allocs(tr, category="activation")} == {"forward"}
    assert {e.iteration for e in allocs(tr, category="optimizer_state")} == {0}
    # markers: three iterations, each forward -> backward -> optimizer
    iters = [e.iteration for e in tr.events if e.kind == "iteration"]
    assert iters == [0, 1, 2] and tr.meta["iterations"] == 3
    phases = [e.phase for e in tr.events if e.kind == "phase"]
    assert phases == ["forward", "backward", "other", "optimizer", "other"] * 3
    # everything except parameters and optimizer state is released once the loop is done
    live = live_bytes_by_category(tr)
    assert live["activation"] == 0 and live["temporary"] == 0 and live["gradient"] == 0
    # module paths: the MLP's layers are named as in named_modules()
    fwd_modules = {e.module for e in allocs(tr, phase="forward")}
    assert {"net.0", "net.1", "net.3"} <= fwd_modules
    assert {"net.0", "net.3", "net.5"} <= {e.module for e in allocs(tr, phase="backward")}


def test_frees_carry_the_final_category_of_their_allocation():
    tr = trace(train_fn("mlp", iters=2), mode="fake")
    by_id = {e.id: e for e in allocs(tr)}
    frees = [e for e in tr.events if e.kind == "free"]
    assert frees and all(e.category == by_id[e.id].category and e.bytes == by_id[e.id].bytes for e in frees)


@pytest.mark.parametrize("mode", MODES)
def test_weights_moved_by_cuda_are_parameters_even_if_replaced_before_a_forward(mode):
    # torchao's quantize_ after .cuda(): the original weights die before any forward; they were
    # left "input" (what --max-batch scales with the batch), not the model's parameters
    def fn():
        model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 1024)).cuda()
        model[1].weight = nn.Parameter(torch.empty(1024, 512, dtype=torch.float16, device="cuda"))
        model[0](torch.randn(4, 256, device="cuda"))

    tr = trace(fn, mode=mode)
    moved = [e for e in allocs(tr) if e.op == "aten._to_copy.default"]
    assert sorted(e.bytes for e in moved) == [512 * 4, 1024 * 4, 256 * 512 * 4, 512 * 1024 * 4]
    assert {e.category for e in moved} == {"parameter"}
    assert {e.module for e in moved} == {"0", "1"}


def test_zero_grad_without_set_to_none_keeps_gradients():
    def step():
        model = nn.Linear(16, 16).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(4, 16, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

    tr = trace(step, mode="fake")
    grads = allocs(tr, category="gradient")
    assert sum(e.bytes for e in grads) == 16 * 16 * 4 + 16 * 4   # allocated once, reused
    assert live_bytes_by_category(tr).get("gradient") == 0       # freed when the model dies


def test_add_event_and_op_hooks_let_later_code_inject_requests():
    seen: list[str] = []

    def setup(tracer: Tracer) -> None:
        def hook(tr, func, args, kwargs, out):
            if str(func) == "aten.mm.default" and not seen:
                ev = tr.add_event(TraceEvent("alloc", bytes=8_519_680, category="workspace", op="cublas"))
                seen.append(str(ev.id))

        tracer.op_hooks.append(hook)

    alloc = CachingAllocator()
    tr = trace("import torch\nx = torch.randn(8, 8, device='cuda') @ torch.randn(8, 8, device='cuda')\n"
               "m = torch.cuda.memory_allocated()", ns := {}, mode="fake", allocator=alloc, setup=[setup])
    ws = allocs(tr, category="workspace")
    assert len(ws) == 1 and ws[0].bytes == 8_519_680 and str(ws[0].id) == seen[0]
    assert ns["m"] >= 8_519_680


# --------------------------------------------------------------------------- fake-mode specifics
def test_fake_mode_runs_value_reading_initialisers_and_big_models():
    def build():
        m = nn.Linear(4096, 4096)
        nn.init.trunc_normal_(m.weight, std=0.02)   # loops on mask.any(): data dependent
        nn.init.orthogonal_(m.weight)
        m.cuda()

    tr = trace(build, mode="fake")
    assert tr.mode == "fake"
    assert sorted(e.bytes for e in allocs(tr)) == [4096 * 4, 4096 * 4096 * 4]
    assert torch.nn.init.trunc_normal_.__module__ == "torch.nn.init"


def test_item_for_logging_stays_fake_and_control_flow_on_it_is_a_noted_guess():
    logging_src = """
import torch
w = torch.randn(8, device="cuda", requires_grad=True)
loss = (w * 2).sum()
msg = f"loss {loss.item():.3f}"
total = 0.0
total += loss.item()
"""
    ns: dict = {}
    tr = trace(logging_src, ns, mode="auto")
    # w's values are unknown: guessed as ones, so the loss is guessed as 16
    assert tr.mode == "fake" and "fallback" not in tr.meta and ns["msg"] == "loss 16.000"
    assert type(ns["total"]) is float and "guesses" not in tr.meta  # logging decides nothing
    branch_src = logging_src + "if loss.item() > 0:\n    extra = torch.empty(100, device='cuda')\n"
    tr = trace(branch_src, {}, mode="auto")
    assert tr.mode == "fake" and "fallback" not in tr.meta
    assert tr.meta["guesses"] == [{"what": "Tensor.item() in a comparison", "value": "True", "where": "<cell>:8",
                                   "inside": "", "count": 1, "kind": "value"}]
    assert any(e.kind == "alloc" and e.bytes == 400 for e in tr.events)  # the branch was taken
    assert any("guessed Tensor.item() in a comparison = True at <cell>:8" in n for n in tr.meta["notes"])


DATA_DEPENDENT = """
import torch
x = torch.randn(100, device="cuda")
pos = x[x > 0]                 # boolean mask: output shape depends on values
idx = torch.nonzero(x)
"""


def test_data_dependent_shapes_take_their_upper_bound_in_fake_mode():
    tr = trace(DATA_DEPENDENT, {}, mode="auto")
    assert tr.mode == "fake" and "fallback" not in tr.meta
    allocs = [(e.op, e.shape) for e in tr.events if e.kind == "alloc"]
    assert ("aten.index.Tensor", (100,)) in allocs and ("aten.nonzero.default", (100, 1)) in allocs
    assert [(g["kind"], g["where"]) for g in tr.meta["guesses"]] == [("size", "<cell>:4"), ("size", "<cell>:5")]
    real = trace(DATA_DEPENDENT, {}, mode="real")
    real_bytes = sum(e.bytes for e in real.events if e.kind == "alloc")
    assert sum(e.bytes for e in tr.events if e.kind == "alloc") >= real_bytes  # errs on the safe side


BINCOUNT = """
import torch
x = torch.randint(0, 9, (400_000,), device="cuda")
counts = torch.bincount(x)     # its size is a value of a tensor too big to stand in for
"""


def test_a_value_with_nothing_to_guess_from_falls_back_in_auto_and_names_the_op_in_fake():
    tr = trace(BINCOUNT, {}, mode="auto")
    assert tr.mode == "real" and "fake mode cannot run aten.bincount" in tr.meta["fallback"]
    with pytest.raises(UnsupportedOpError) as ei:
        trace(BINCOUNT, {}, mode="fake")
    msg = str(ei.value)
    assert "aten.bincount" in msg and "fake mode" in msg and "--mode real" in msg and "<cell>:4" in msg
    assert torch._C._len_torch_function_stack() == 0


# --------------------------------------------------------------------------- errors
def test_user_exception_keeps_its_type_and_the_cell_traceback():
    src = "import torch\nx = torch.ones(3, device='cuda')\n\ny = 1 / 0\n"
    ns = {"keep": 42}
    with pytest.raises(ZeroDivisionError) as ei:
        trace(src, ns, mode="fake")
    frames = traceback.extract_tb(ei.value.__traceback__)
    assert ("<cell>", 4) in [(f.filename, f.lineno) for f in frames]
    text = "".join(user_traceback_lines(ei.value))
    assert 'File "<cell>", line 4' in text and "y = 1 / 0" in text and "xmem_engine" not in text and "test_tracer.py" not in text
    assert ns == {"keep": 42}
    assert not torch.cuda.is_available() or torch.version.cuda
    assert torch._C._len_torch_function_stack() == 0


def test_keyboard_interrupt_restores_everything():
    import torch.nn.modules.module as module_mod

    apply_before = torch.nn.Module._apply
    hooks_before = len(module_mod._global_forward_pre_hooks)

    def interrupted():
        nn.Linear(3, 3).cuda()(torch.ones(1, 3, device="cuda"))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trace(interrupted, mode="fake")
    assert torch.nn.Module._apply is apply_before
    assert len(module_mod._global_forward_pre_hooks) == hooks_before
    assert torch._C._len_torch_function_stack() == 0
    assert not torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    assert torch._C._get_mkldnn_enabled()
    from torch._subclasses.fake_tensor import FakeTensor
    assert "device" in vars(FakeTensor) and isinstance(vars(FakeTensor)["device"], property)
    assert vars(FakeTensor)["device"].fget.__qualname__.startswith("FakeTensor")


def test_bad_mode_and_bad_code_are_rejected():
    with pytest.raises(ValueError):
        trace("x = 1", {}, mode="gpu")
    with pytest.raises(TypeError):
        trace(42)  # type: ignore[arg-type]
    with pytest.raises(SyntaxError):
        trace("def broken(:", {})


# --------------------------------------------------------------------------- more CUDA idioms
@pytest.mark.parametrize("mode", MODES)
def test_activation_checkpointing_saves_less(mode):
    def step(checkpoint: bool):
        def run():
            from torch.utils.checkpoint import checkpoint as ckpt

            blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                                   for _ in range(4)).cuda()
            x = torch.randn(512, 64, device="cuda", requires_grad=True)
            for b in blocks:
                x = ckpt(b, x, use_reentrant=False) if checkpoint else b(x)
            x.sum().backward()
        return run

    def peak(tr):
        live = best = 0
        for e in tr.events:
            live += e.bytes if e.kind == "alloc" else -e.bytes if e.kind == "free" else 0
            best = max(best, live)
        return best

    plain, ckpt = trace(step(False), mode=mode), trace(step(True), mode=mode)
    assert peak(ckpt) < peak(plain)
    assert sum(e.bytes for e in allocs(ckpt, phase="backward", op="aten.addmm.default")) > 0  # recomputed


def test_default_device_context_and_fraction_oom():
    src = """
import torch
with torch.device("cuda"):
    layer = torch.nn.Linear(100, 100)
dev = str(layer.weight.device)
torch.cuda.set_per_process_memory_fraction(0.5)
try:
    huge = torch.empty(30 * 2**30, dtype=torch.uint8, device="cuda")   # 30 GiB > 0.5 x 40 GB
except torch.cuda.OutOfMemoryError as e:
    oom = "out of memory" in str(e)
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["dev"] == "cuda:0" and ns["oom"] is True
    assert sorted(e.bytes for e in allocs(tr)) == [400, 40000]


def test_cuda_only_calls_are_named_with_the_line_and_nvtx_is_a_no_op():
    src = "import torch\ntorch.cuda.nvtx.range_push('step')\nx = torch.ones(2, device='cuda')\n" \
          "h = torch.cuda.current_blas_handle()\n"
    with pytest.raises(UnsupportedOpError) as ei:
        trace(src, {}, mode="fake")
    msg = str(ei.value)
    assert "<cell>:4" in msg and "torch.cuda.current_blas_handle" in msg and "real GPU" in msg
    # the CUDA wheel's driver error, or the CPU wheel's missing CUDA binding
    assert isinstance(ei.value.__cause__, (RuntimeError, AttributeError))
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("mode", MODES)
def test_max_iterations_stops_a_long_loop(mode):
    src = """
import torch
model = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
steps = 0
for step in range(1000):
    model(torch.randn(4, 8, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    steps += 1
"""
    ns: dict = {}
    tr = trace(src, ns, mode=mode, max_iterations=2)
    assert tr.meta["stopped"] is True and tr.meta["iterations"] == 2
    assert [e.iteration for e in tr.events if e.kind == "iteration"] == [0, 1]
    assert ns["steps"] == 2
    full = trace(src.replace("1000", "2"), {}, mode=mode)
    assert full.meta["stopped"] is False
    # the stopped run also made the next iteration's input before its forward began
    stopped_allocs = [(e.bytes, e.category) for e in tr.events if e.kind == "alloc"]
    assert stopped_allocs == [(e.bytes, e.category) for e in full.events if e.kind == "alloc"] + [(128, "input")]


IDIOMS = """
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
dl = DataLoader(ds, batch_size=16, pin_memory=True, shuffle=True, num_workers=2)   # sampler reads values
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).cuda()
model = torch.compile(model.bfloat16().float())
opt = torch.optim.AdamW(model.parameters(), fused=True)
scaler = torch.amp.GradScaler("cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
seen = 0
for x, y in dl:
    seen += int(y.numel())
    x, y = x.to("cuda", non_blocking=True), y.cuda(non_blocking=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end)
host_mean = float(ds.tensors[0].mean())                                 # CPU-side values are real
"""


def test_common_training_idioms_run_in_fake_mode_like_in_real_mode():
    results = {}
    for mode in MODES:
        ns: dict = {}
        tr = trace(IDIOMS, ns, mode=mode, compile="eager")  # real mode runs compiled code eagerly
        assert tr.mode == mode and "fallback" not in tr.meta
        assert ns["seen"] == 64 and ns["ms"] == 0.0 and abs(ns["host_mean"]) < 1.0
        results[mode] = [(e.kind, e.bytes, e.category) for e in tr.events if e.kind in ("alloc", "free")]
        assert tr.meta["iterations"] == 4
    assert results["fake"] == results["real"]


def test_auto_mode_traces_a_dataloader_loop_in_fake_mode():
    tr = trace(IDIOMS, {}, mode="auto")
    assert tr.mode == "fake" and "fallback" not in tr.meta


def test_formatting_fake_scalars_and_rounding_a_guess():
    src = "import torch\nx = torch.randn(4, device='cuda')\nw = x.sum()\ns = f'{w:.2f} {w.item():.1f} {int(x.numel())}'\n"
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert tr.mode == "fake" and ns["s"] == "4.00 4.0 4" and "guesses" not in tr.meta
    ns = {}
    tr = trace(src + "r = round(w.item())\n", ns, mode="fake")
    assert ns["r"] == 4 and tr.meta["guesses"][0]["what"] == "round(Tensor.item())"


@pytest.mark.parametrize("mode", MODES)
def test_to_variants_follow_pytorch_copy_rules(mode):
    src = """
import torch
x = torch.empty(2, 3, 4, 4, device="cuda")                 # 384 B
same = x.to("cuda") is x and x.cuda() is x and x.to(x) is x and x.to(torch.float32) is x
cl = x.to(memory_format=torch.channels_last)                 # 384 B copy
h = x.half()                                                 # 192 B
c = x.to("cuda", copy=True)                                  # 384 B
d = x.to(torch.device("cuda"), torch.float64, False, False)  # 768 B
host = torch.ones(3)
y = host.to(x)                                               # 12 B (device and dtype of x)
back_is_new = x.cpu() is not x
"""
    ns: dict = {}
    tr = trace(src, ns, mode=mode)
    assert ns["same"] is True and ns["back_is_new"] is True
    assert [e.bytes for e in allocs(tr)] == [384, 384, 192, 384, 768, 12]


@pytest.mark.parametrize("mode", MODES)
def test_errors_inside_torch_ops_end_at_the_users_line(mode):
    src = "import torch\nx = torch.ones(3, device='cuda')\ny = x @ torch.ones(4, 4, device='cuda')\n"
    with pytest.raises(RuntimeError) as ei:
        trace(src, {}, mode=mode)
    frames = traceback.extract_tb(ei.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == ("<cell>", 3)
    names = [f.name for f in frames]
    after = frames[names.index("trace") + 1:]                 # the frames of the user's code
    assert after and not any("xmem_engine" in f.filename for f in after)


def test_gradient_accumulation_iterations_run_from_step_to_step():
    src = """
import torch
model = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.Adam(model.parameters())
for micro in range(6):
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    if micro % 3 == 2:
        opt.step()
        opt.zero_grad()
"""
    tr = trace(src, {}, mode="fake")
    assert [e.iteration for e in tr.events if e.kind == "iteration"] == [0, 1]
    steps = [e.iteration for e in tr.events if e.kind == "phase" and e.phase == "optimizer"]
    assert steps == [0, 1]
    no_opt = trace(src.replace("opt = torch.optim.Adam(model.parameters())", "")
                   .replace("opt.step()", "pass").replace("opt.zero_grad()", "pass"), {}, mode="fake")
    assert [e.iteration for e in no_opt.events if e.kind == "iteration"] == list(range(6))


def test_backward_allocations_are_attributed_to_the_forward_module():
    tr = trace(train_fn("transformer_encoder", iters=1), mode="fake")
    bwd = [e for e in allocs(tr, phase="backward")]
    named = [e for e in bwd if e.module]
    assert len(named) > 0.8 * len(bwd)
    # the attention's intermediate nodes (made inside F.multi_head_attention_forward) too
    assert sum(1 for e in bwd if e.module == "encoder.layers.0.self_attn") >= 10
    assert {e.module for e in bwd} >= {"encoder.layers.0.linear1", "encoder.layers.1.norm2", "head"}


def test_memory_snapshot_calls_answer_from_the_simulated_allocator(tmp_path):
    out = tmp_path / "snap.pickle"
    src = f"""
import torch
torch.cuda.memory._record_memory_history(max_entries=1000)
x = torch.empty(1 << 20, device="cuda")
snap = torch.cuda.memory._snapshot()
n_segments = len(snap["segments"])
total = sum(s["total_size"] for s in snap["segments"])
torch.cuda.memory._dump_snapshot({str(out)!r})
torch.cuda.memory._record_memory_history(enabled=None)
"""
    ns: dict = {}
    trace(src, ns, mode="fake")
    assert ns["n_segments"] == 1 and ns["total"] >= 4 << 20
    from xmem_engine.simulation.snapshot import load_snapshot

    assert load_snapshot(out)["segments"]


# Ops that save their own output for backward (exp, sigmoid, tanh, sqrt, norms) must not tie
# the output to its graph in a cycle: a forward with grad enabled and no backward (an
# evaluation loop without no_grad) frees its graph when the output goes, as on a GPU.
FORWARD_ONLY = """
import torch
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Sigmoid(), torch.nn.Linear(256, 256)).cuda()
x = torch.randn(64, 256, device="cuda")
start = torch.cuda.memory_allocated()
for _ in range(3):
    y = m(x).exp().tanh().sqrt()
    del y
end = torch.cuda.memory_allocated()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_forward_only_loop_returns_to_its_start(mode):
    ns: dict = {}
    trace(FORWARD_ONLY, ns, mode=mode)
    assert ns["end"] == ns["start"]


# After backward the tracer keeps nothing of the graph: a gradient the user drops is freed.
DROP_GRAD = """
import torch
emb = torch.nn.Embedding(4096, 1024).cuda()
ids = torch.randint(0, 4096, (8, 16), device="cuda")
emb(ids).sum().backward()
before = torch.cuda.memory_allocated()
emb.weight.grad = None
after = torch.cuda.memory_allocated()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_dropped_gradient_is_freed_after_backward(mode):
    ns: dict = {}
    trace(DROP_GRAD, ns, mode=mode)
    assert ns["before"] - ns["after"] == 4096 * 1024 * 4


# The last node of a backward (here the embedding's AccumulateGrad, which holds its parameter
# and so the gradient) is not kept by the tracer: a model dropped after backward is freed.
DROP_MODEL = """
import torch
def step():
    emb = torch.nn.Embedding(4096, 1024).cuda()
    ids = torch.randint(0, 4096, (8, 16), device="cuda")
    emb(ids).sum().backward()
start = torch.cuda.memory_allocated()
step()
end = torch.cuda.memory_allocated()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_model_dropped_after_backward_is_freed(mode):
    ns: dict = {}
    trace(DROP_MODEL, ns, mode=mode)
    assert ns["end"] == ns["start"] == 0


# A custom op with no fake kernel runs for real once (on zero-filled inputs of its sizes):
# the rest stays in fake mode and allocates as in real mode; the notes name the op.
CUSTOM_OP = """
import torch

@torch.library.custom_op("xmemtest::scale_" + MODE, mutates_args=())
def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k

def _backward(ctx, grad):
    return grad * ctx.k, None

def _setup(ctx, inputs, output):
    ctx.k = inputs[1]

scale.register_autograd(_backward, setup_context=_setup)
model = torch.nn.Linear(64, 64).cuda()
x = torch.randn(32, 64, device="cuda")
y = scale(model(x), 2.0)
y.sum().backward()
"""


def test_a_custom_op_without_fake_kernel_runs_for_real_once():
    runs = {}
    for mode in ("auto", "real"):
        tr = trace(CUSTOM_OP, {"MODE": mode}, mode=mode)
        runs[mode] = tr
    assert runs["auto"].mode == "fake" and "fallback" not in runs["auto"].meta
    assert any("scale_auto has no fake kernel" in n and "<cell>:17" in n for n in runs["auto"].meta["notes"])
    assert runs["auto"].meta["real_ops"] == {"xmemtest::scale_auto": 1} and "real_ops" not in runs["real"].meta
    sizes = {m: [(e.bytes, e.phase) for e in tr.events if e.kind == "alloc"] for m, tr in runs.items()}
    assert sizes["auto"] == sizes["real"]


# torch.compile asked to run eagerly (--compile eager; real mode; a torch without Triton): the
# estimate is the eager step's and says so once, at the user's line, with the reason.
# (Compiling for the GPU: tests/tracing/test_torch_compile.py.)
COMPILED = """
import torch
model = torch.nn.Linear(64, 64).cuda()
step = torch.compile(model)
also = torch.compile(mode="max-autotune")(lambda x: x * 2)
for _ in range(2):
    step(torch.randn(8, 64, device="cuda")).sum().backward()
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_torch_compile_runs_eagerly_and_says_so(mode):
    tr = trace(COMPILED, {}, mode=mode, compile="eager")
    notes = [n for n in tr.meta.get("notes", []) if n.startswith("torch.compile")]
    assert len(notes) == 1 and "<cell>:4 ran eagerly (" in notes[0]
    plain = trace(COMPILED.replace("torch.compile(model)", "model").replace(
        'torch.compile(mode="max-autotune")(lambda x: x * 2)', "None"), {}, mode=mode)
    assert [(e.kind, e.bytes) for e in tr.events] == [(e.kind, e.bytes) for e in plain.events]
    assert not any(n.startswith("torch.compile") for n in plain.meta.get("notes", []))


# A lazy module moved to the GPU before its first forward materializes its parameters there.
LAZY = """
import torch, torch.nn as nn
m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.Flatten(), nn.LazyLinear(10)).cuda()
m(torch.randn(8, 3, 32, 32, device="cuda")).sum().backward()
w = m[2].weight
where = w.is_cuda, tuple(w.shape), type(w).__name__
"""


@pytest.mark.parametrize("mode", ["auto", "real"])
def test_a_lazy_module_moved_before_its_first_forward(mode):
    ns: dict = {}
    tr = trace(LAZY, ns, mode=mode)
    assert ns["where"] == (True, (10, 14400), "Parameter")
    assert [e.category for e in tr.events if e.kind == "alloc" and e.bytes == 10 * 14400 * 4] == ["parameter", "gradient"]
    if mode == "auto":  # fake tensors cannot stand in for a lazy parameter's .data: real mode, said so
        assert tr.mode == "real" and "lazy module" in tr.meta["fallback"]


# Checkpointed attention under autocast: backward's recomputation calls SDPA while the tracer's
# device mode is off (backward runs from inside its handler); it must take the same backend as
# forward did, or torch.utils.checkpoint finds other tensors saved ("different metadata").
CHECKPOINTED_SDPA = """
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.qkv = nn.LayerNorm(64), nn.Linear(64, 192)
    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).view(2, 16, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 64)

blocks = nn.ModuleList([Block(), Block()]).cuda()
x = torch.randn(2, 16, 64, device="cuda", requires_grad=True)
with torch.autocast("cuda", dtype=torch.bfloat16):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    loss = x.float().sum()
loss.backward()
"""


def test_checkpointed_attention_under_autocast_recomputes_alike():
    from xmem_engine.gpus import load_catalog

    runs = {}
    for mode in ("fake", "real"):
        tr = trace(CHECKPOINTED_SDPA, {}, mode=mode, device=load_catalog()["H100-SXM-80GB"].properties())
        runs[mode] = [(e.kind, e.bytes, e.op) for e in tr.events if e.kind in ("alloc", "free")]
    assert runs["fake"] == runs["real"]
    # a fused backend (flash; cuDNN with a CUDA build's cuDNN on sm90), twice and twice again
    fused = ("aten._flash_attention_forward", "aten._cudnn_attention_forward", "aten._efficient_attention_forward")
    assert sum(op.startswith(fused) for _, _, op in runs["real"]) >= 4


# nn.MultiheadAttention runs F.multi_head_attention_forward through torch-function dispatch,
# inside which the device mode is off: its scaled_dot_product_attention still takes the GPU's
# fused backend, as on a GPU (it took PyTorch's CPU kernel before).
MHA = """
import torch
mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).cuda()
x = torch.randn(8, 128, 64, device="cuda", requires_grad=True)
mha(x, x, x, need_weights=False)[0].sum().backward()
"""


def test_multihead_attention_takes_the_gpu_backend():
    from xmem_engine.gpus import load_catalog

    for mode in ("fake", "real"):
        tr = trace(MHA, {}, mode=mode, device=load_catalog()["A100-SXM4-40GB"].properties())
        ops = [e.op for e in tr.events if e.kind == "alloc"]
        assert any(op.startswith(("aten._flash_attention_forward", "aten._efficient_attention_forward"))
                   for op in ops), (mode, sorted(set(ops)))


# A library that decorates its own functions with torch.compile at import compiles nothing of
# the user's step: no note until compiled code runs, and then the note names where it was applied.
COMPILED_AT_IMPORT = """
import torch
def kernel(x):
    return x * 2
kernel = torch.compile(dynamic=False)(kernel)
model = torch.nn.Linear(64, 64).cuda()
model(torch.randn(8, 64, device="cuda")).sum().backward()
"""


@pytest.mark.parametrize("compile", ["eager", None])
def test_torch_compile_unused_at_import_is_not_noted(compile):
    tr = trace(COMPILED_AT_IMPORT, {}, mode="fake", compile=compile)
    assert not any(n.startswith("torch.compile") for n in tr.meta.get("notes", []))
    host = trace(COMPILED_AT_IMPORT + "kernel(torch.ones(4))\n", {}, mode="fake", compile=compile)
    assert not any(n.startswith("torch.compile") for n in host.meta.get("notes", []))  # host work
    used = trace(COMPILED_AT_IMPORT + "kernel(torch.ones(4, device='cuda'))\n", {}, mode="fake", compile=compile)
    notes = [n for n in used.meta.get("notes", []) if n.startswith("torch.compile")]
    assert len(notes) == 1 and notes[0].startswith("torch.compile at <cell>:5")


@pytest.mark.parametrize("compile", ["eager", None])
def test_module_compile_is_noted_at_the_users_line(compile):
    tr = trace("import torch\nm = torch.nn.Linear(8, 8).cuda()\nm.compile()\nm(torch.ones(2, 8, device='cuda'))\n",
               {}, mode="fake", compile=compile)
    notes = [n for n in tr.meta.get("notes", []) if n.startswith("torch.compile")]
    assert len(notes) == 1 and notes[0].startswith("torch.compile at <cell>:3")


_FIRST_TRACE = """
import gc, sys
from xmem_engine.tracing import trace
from xmem_engine.tracing.virtual_cuda import VirtualCuda
assert "torch._dynamo" not in sys.modules  # the process's first trace imports Dynamo
t = trace("import torch\\nm = torch.nn.Linear(64, 64).cuda()\\nm(torch.randn(8, 64, device='cuda')).sum().backward()\\n",
          {}, mode="fake")
del t
gc.collect()
print(sum(isinstance(o, VirtualCuda) for o in gc.get_objects()))
"""


def test_the_first_trace_of_a_process_is_not_kept_alive():
    """Dynamo reads torch.cuda's functions into its tables at import; imported first inside a trace,
    it kept the virtual device's lambdas and with them the trace's device and tracer (its events)
    for the life of the process (a notebook kernel). Run in a fresh process."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _FIRST_TRACE], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "0"


def test_a_script_inside_site_packages_is_still_the_users_code(tmp_path):
    """A library's own training script run as the script (TRL's ``trl/scripts/sft.py``) lives
    in site-packages, where every frame counts as library code: its allocations and notes said
    ``?`` for the line. The traced script's file is the user's wherever it lives."""
    from xmem_engine.tracing import trace_script

    folder = tmp_path / "site-packages" / "lib" / "scripts"
    folder.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text("import torch\nx = torch.empty(1024, device='cuda')\n")
    tr = trace_script(script, mode="fake")
    (alloc,) = allocs(tr)
    assert alloc.source == f"{script}:2"


def test_device_generic_streams_and_events_are_the_virtual_gpus():
    """``torch.Stream()`` / ``torch.Event(device=...)`` (device-generic, 2.5+) asked the driver;
    transformers' offloaded KV cache makes its prefetch stream so and enters it with ``with``."""
    src = """
import torch
dev = torch.accelerator.current_accelerator()
s = torch.Stream()
e = torch.Event(device=dev, blocking=True)
x = torch.randn(256, 256, device=dev)
s.wait_stream(torch.accelerator.current_stream())
with s:
    y = x @ x
    inner = torch.accelerator.current_stream()
after = torch.accelerator.current_stream()
e.record()
e.synchronize()
checks = [isinstance(s, torch.Stream), isinstance(e, torch.Event), inner == s, after != s,
          type(torch.Stream(device="cpu")).__module__ == "torch"]  # another device's stream is torch's own
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    x, y = allocs(tr)[:2]
    assert x.stream == 0 and y.stream != 0
    assert ns["checks"] == [True] * 5



@pytest.mark.parametrize("mode", ["fake", "real"])
def test_cuda_generators_seeds_and_nvml_readings_need_no_driver(mode):
    """``torch.Generator(device="cuda")`` (diffusers' training scripts seed one per run), the
    CUDA seed, ``torch.accelerator.get_memory_info`` and NVML's readings (logging callbacks)
    asked the driver, or pynvml, which a machine without a GPU lacks."""
    src = """
import torch
g = torch.Generator(device="cuda").manual_seed(7)
a = torch.randn(4, 8, device="cuda", generator=g)
b = torch.randn(4, 8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
torch.cuda.manual_seed_all(123)
free, total = torch.accelerator.get_memory_info()
checks = [isinstance(g, torch.Generator), a.is_cuda, torch.cuda.initial_seed() == 123,
          torch.cuda.device_memory_used() == total - free, torch.cuda.utilization() == 0,
          torch.Generator().device.type == "cpu"]
same = bool((a == b).all()) if REAL else True
"""
    ns: dict = {"REAL": mode == "real"}
    tr = trace(src, ns, mode=mode)
    assert ns["checks"] == [True] * 6 and ns["same"]  # one seed, one stream of numbers
    assert [e.bytes for e in allocs(tr)][:2] == [4 * 8 * 4] * 2  # (then a == b, in real mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_frozen_teacher_called_inside_the_students_forward_holds_parameters(mode):
    """TRL's distillation (and DDP-friendly trainers) run the whole loss as the student's forward
    (``_forward_redirection``), so the teacher, a model of its own held by the trainer, is first
    called inside another model's forward: its weights are still parameters, named by its modules."""
    src = """
import torch, torch.nn as nn, torch.nn.functional as F

class Distiller:
    def __init__(self):
        self.teacher = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128)).cuda().eval()
        self.teacher.requires_grad_(False)
        self.student = nn.Sequential(nn.Linear(256, 128)).cuda()
        self.opt = torch.optim.SGD(self.student.parameters(), lr=0.1)

    def loss(self, x):
        with torch.no_grad():
            target = self.teacher(x)
        return F.mse_loss(self.student[0](x), target)

    def step(self, x):
        original = self.student.forward
        def redirected(*args):  # the loss runs as the student's forward
            self.student.forward = original
            return self.loss(*args)
        self.student.forward = redirected
        self.student(x).backward()
        self.opt.step()
        self.opt.zero_grad()

trainer = Distiller()
for _ in range(2):
    trainer.step(torch.randn(32, 256, device="cuda"))
"""
    tr = trace(src, {}, mode=mode)
    teacher_bytes = (256 * 512 + 512 + 512 * 128 + 128) * 4
    student_bytes = (256 * 128 + 128) * 4
    assert sum(e.bytes for e in allocs(tr, category="parameter")) == teacher_bytes + student_bytes
    assert {e.module for e in allocs(tr, category="parameter") if tuple(e.shape) == (128, 512)} == {"2"}
    assert [e.iteration for e in tr.events if e.kind == "iteration"] == [0, 1]
