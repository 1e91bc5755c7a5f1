"""torch.compile under the tracer compiles for the target GPU (xmem_engine/tracing/compiler/torch_compile.py).

These run where Inductor can write CUDA code: a CUDA build of torch with Triton (PyPI's default
Linux wheel: `make test-torch-ends`, `make test-finetune`); on the CPU build they skip, and
tests/tracing/test_tracer.py checks the eager path there. The trace must hold exactly the buffers of the
wrapper code Inductor generated, read back from its output file."""

from __future__ import annotations

import ast
import re
import warnings

import pytest
import torch

from xmem_engine.tracing import trace
from xmem_engine.tracing.compiler.torch_compile import compile_unavailable

pytestmark = pytest.mark.skipif(compile_unavailable() is not None,
                                reason=f"Inductor cannot compile for CUDA here: {compile_unavailable()}")

H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_045_870_592, "major": 9, "minor": 0,
        "multi_processor_count": 132}

MLP = """
import torch, torch.nn as nn
class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(64, 256); s.l2 = nn.Linear(256, 64)
    def forward(s, x, target):
        return (s.l2(torch.relu(s.l1(x))) - target).square().mean()
model = MLP().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(model)
x, t = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
for i in range(2):
    step(x, t).backward()
    opt.step(); opt.zero_grad()
"""

GPT = """
import torch, torch.nn as nn, torch.nn.functional as F
class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.ln1, s.attn, s.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.ln2, s.fc, s.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s, vocab=512, T=64, n_layer=2, d=128, h=4):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(n_layer)])
        s.ln_f, s.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
model = torch.compile(GPT().cuda())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
idx = torch.randint(0, 512, (4, 64), device="cuda")
for i in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
"""


def _buffers(path: str) -> list[tuple[int, ...]]:
    """The shapes of the ``empty_strided_cuda`` buffers the wrapper's ``call`` allocates, in order."""
    src = open(path).read()
    body = src[src.index("def call(self, args):") if "def call(self, args):" in src else src.index("def call(args):"):]
    shapes = []
    for m in re.finditer(r"empty_strided_cuda\((\([^()]*\)), \([^()]*\), torch\.\w+\)", body):
        shapes.append(tuple(ast.literal_eval(m.group(1))))
    return shapes


def _allocs(tr, iteration: int, phase: str) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(e.shape), e.op) for e in tr.events
            if e.kind == "alloc" and e.iteration == iteration and e.phase == phase]


def test_the_trace_holds_exactly_the_wrappers_buffers():
    tr = trace(MLP, {}, mode="fake", device=H100)
    info = tr.meta["compile"]
    assert info["graphs"] == 1 and info["backward_graphs"] == 1 and len(info["wrappers"]) == 2
    forward, backward = (_buffers(p) for p in info["wrappers"])
    assert forward and backward
    for phase, expected in (("forward", forward), ("backward", backward)):
        got = [shape for shape, op in _allocs(tr, 1, phase) if op == "aten.empty_strided.default"]
        assert got == expected, phase
    # nothing else allocates in the compiled forward (the loss's gradient seed is backward's)
    assert [op for _, op in _allocs(tr, 1, "forward")] == ["aten.empty_strided.default"] * len(forward)
    notes = [n for n in tr.meta["notes"] if n.startswith("torch.compile")]
    assert len(notes) == 1 and "compiled for the target GPU" in notes[0] and "<cell>:10" in notes[0]
    # the CPU compile time counts Dynamo's capture too, not only the backend's (which a GPU pays alike)
    took = re.search(r"the CPU compile took ([\d.]+) s: Dynamo's capture ([\d.]+) s, AOTAutograd and Inductor "
                     r"([\d.]+) s", notes[0])
    assert took and info["dynamo_seconds"] > 0 and info["seconds"] > 0, notes[0]
    total, dynamo, backend = (float(g) for g in took.groups())
    assert abs(total - dynamo - backend) <= 0.16 and backend == round(info["seconds"], 1)  # three roundings


def test_a_compiled_transformer_allocates_as_inductors_output_code_says():
    compiled = trace(GPT, {}, mode="fake", device=H100)
    eager = trace(GPT, {}, mode="fake", device=H100, compile="eager")
    forward, backward = (_buffers(p) for p in compiled.meta["compile"]["wrappers"])
    fwd = _allocs(compiled, 1, "forward")
    # the wrapper's own buffers, in order; the rest are the fused attention kernel's outputs
    # (an extern kernel, allocating as in eager code: cuDNN's on an H100 with bf16)
    assert [s for s, op in fwd if op == "aten.empty_strided.default"] == forward
    others = {op for _, op in fwd if op != "aten.empty_strided.default"}
    assert others and all("attention" in op for op in others), others
    bwd = [s for s, op in _allocs(compiled, 1, "backward") if op == "aten.empty_strided.default"]
    assert bwd == backward
    # Inductor fuses pointwise chains: fewer allocations than the eager step's, none by an
    # elementwise op (eager code allocates each GELU's and each residual add's output)
    eager_ops = [op for _, op in _allocs(eager, 1, "forward")]
    assert len(fwd) < len(eager_ops) and "aten.gelu.default" in eager_ops and "aten.add.Tensor" in eager_ops
    assert eager.meta["compile"]["graphs"] == 0 and eager.meta["compile"]["comparable"]
    assert compiled.meta["compile"]["comparable"] and not compiled.meta["compile"]["eager"]
    assert any("ran eagerly (asked: --compile eager)" in n for n in eager.meta["notes"])


# a step compiled whole, its bf16 autocast region inside the compiled function
AUTOCAST_STEP = """
import torch
lin = torch.nn.Linear(1024, 1024).cuda()
@torch.compile
def step(x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return lin(x)
out = step(torch.randn(64, 1024, device="cuda"))
bf16 = out.dtype == torch.bfloat16
"""


def test_an_autocast_region_inside_the_compiled_code_stays_on():
    """A training step compiled whole, its autocast region inside it: AOTAutograd traces the
    graph's ``_enter_autocast`` while xmem compiles, when this machine's answer to
    ``torch.cuda.is_available()`` holds, and torch disabled the region ("CUDA is not available
    ... Disabling autocast"): the matmuls ran in float32. As on a GPU, they run in bfloat16."""
    ns: dict = {}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        tr = trace(AUTOCAST_STEP, ns, mode="fake", device=H100)
    assert not [w for w in said if "Disabling autocast" in str(w.message)]
    assert ns["bf16"] and tr.meta["compile"]["graphs"] == 1
    made = {(tuple(e.shape), str(e.dtype)) for e in tr.events if e.kind == "alloc" and e.op == "aten.empty_strided.default"}
    assert {((64, 1024), "bfloat16"), ((1024, 1024), "bfloat16")} <= made  # the output; the weight's bf16 copy
    assert ((64, 1024), "float32") not in made


def test_a_forward_under_autocasts_decorator_compiles_as_dynamo_takes_it():
    """accelerate's mixed precision wraps ``model.forward`` in ``torch.autocast(...)`` as a
    decorator, then ``torch.compile``s the model. Dynamo skips torch's own frames and runs them
    with its callback on: the region's ``__enter__`` and CUDA's cast policy (the tracer's
    Python kernels) were the next frames it took to compile, and it stopped the script
    ("NotImplementedError: AutocastModeVariable()"). It runs as the uncompiled step does,
    torch's nn modules being skipped too (no graph: as on a GPU)."""
    src = """
import torch
net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
net.forward = torch.autocast("cuda", dtype=torch.bfloat16)(net.forward)
model = torch.compile(net)
for _ in range(2):
    model(torch.randn(8, 256, device="cuda")).float().sum().backward()
"""
    compiled = trace(src, {}, mode="fake", device=H100)
    eager = trace(src, {}, mode="fake", device=H100, compile="eager")
    assert any("Dynamo compiled no graph" in n for n in compiled.meta["notes"])
    # in order up to the script's end; the frees at its end (the namespace torn down, its order
    # the garbage collector's: it differed under torch 2.10 with other tests before) as a set
    def steps(tr):
        end = max(i for i, e in enumerate(tr.events) if e.kind != "free") + 1
        seen = [(e.kind, e.bytes, e.dtype) for e in tr.events]
        return seen[:end], sorted(seen[end:])

    assert steps(compiled) == steps(eager)
    assert any(e.dtype == "bfloat16" for e in compiled.events)


def test_bf16_below_compute_capability_8_is_skipped_as_inductor_skips_it():
    t4 = {"name": "Tesla T4", "total_memory": 15_637_086_208, "major": 7, "minor": 5, "multi_processor_count": 40}
    notes = trace(AUTOCAST_STEP, {}, mode="fake", device=t4).meta["notes"]
    assert any("Inductor does not compile bf16 graphs for this GPU" in n for n in notes), notes


def test_a_region_checkpointed_inside_a_compiled_call_is_recomputed_as_it_ran():
    """A checkpointed region that Dynamo leaves to Python inside a compiled call (a Hugging Face
    layer with gradient checkpointing, under the Trainer's ``torch_compile``) runs its attention
    as the compiled call does, the target GPU's fused kernel; its recomputation in backward, out
    of the call, ran the eager handler, which saves other tensors: "A different number of tensors
    was saved during the original forward and recomputation"."""
    src = """
import torch, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
qkv = torch.nn.Linear(256, 768).cuda()
def attend(x):
    q, k, v = qkv(x).view(4, 64, 3, 4, 64).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(4, 64, 256)
@torch.compiler.disable
def block(x):
    return checkpoint(attend, x, use_reentrant=False)
@torch.compile
def step(x):
    return block(x.relu()).square().sum()
step(torch.randn(4, 64, 256, device="cuda", requires_grad=True)).backward()
"""
    tr = trace(src, {}, mode="fake", device=H100)
    fused = [(e.phase == "backward", e.bytes, e.dtype) for e in tr.events
             if e.kind == "alloc" and e.op == "aten._scaled_dot_product_efficient_attention.default"]
    forward = [f[1:] for f in fused if not f[0]]
    assert forward and forward == [f[1:] for f in fused if f[0]]  # recomputed in backward: the same kernel


def test_a_compiled_attention_with_a_float32_mask_and_half_inputs_fails_as_on_the_gpu():
    """The compiled call runs the memory-efficient kernel too (an extern kernel), which rejects a
    float32 bias with half inputs: the compiled graph had taken PyTorch's own SDPA and compiled
    its CPU decomposition, and xmem estimated a step that fails on the GPU."""
    src = """
import torch, torch.nn.functional as F
@torch.compile
def attend(q, mask):
    return F.scaled_dot_product_attention(q, q, q, attn_mask=mask) * 2
q = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16, requires_grad=True)
attend(q, torch.zeros(2, 1, 64, 64, device="cuda")).sum().backward()
"""
    a100 = dict(H100, name="NVIDIA A100-SXM4-40GB", major=8, minor=0, multi_processor_count=108)
    with pytest.raises(RuntimeError, match="invalid dtype for bias - should match query's dtype"):
        trace(src, {}, mode="fake", device=a100)


def test_dropout_in_a_checkpointed_region_compiles_with_its_rng_state_saved():
    """Dropout inside a checkpointed region, compiled (GPT-2 under the Trainer's
    ``torch_compile`` and ``gradient_checkpointing``): the partitioner keeps the RNG state for
    its recomputation. Its graph-safe form asks the CUDA generators, which a machine without a
    driver lacks ("tuple index out of range": the graph ran eagerly); saved as a state tensor
    instead, CUDA's 16 bytes, the step compiles."""
    src = """
import torch, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
lin = torch.nn.Linear(256, 256).cuda()
@torch.compile
def step(x):
    return checkpoint(lambda t: F.dropout(lin(t), 0.1, training=True), x, use_reentrant=False).sum()
step(torch.randn(64, 256, device="cuda", requires_grad=True)).backward()
"""
    tr = trace(src, {}, mode="fake", device=H100)
    info = tr.meta["compile"]
    assert info["graphs"] == 1 and info["backward_graphs"] == 1
    assert not any("failed" in n for n in tr.meta["notes"]), tr.meta["notes"]


def test_compile_eager_equals_the_uncompiled_step():
    tr = trace(MLP, {}, mode="fake", device=H100, compile="eager")
    plain = trace(MLP.replace("torch.compile(model)", "model"), {}, mode="fake", device=H100)
    assert [(e.kind, e.bytes, e.phase) for e in tr.events] == [(e.kind, e.bytes, e.phase) for e in plain.events]


def test_compiled_code_leaves_no_compile_state_behind():
    """Each trace compiles afresh for its own GPU; nothing it patched stays patched."""
    import torch._dynamo.device_interface as di

    before = (torch.cuda.is_available, torch.cuda.get_device_properties, di.device_interfaces.get("cuda"))
    a = trace(MLP, {}, mode="fake", device=H100)
    b = trace(MLP, {}, mode="fake", device=dict(H100, name="NVIDIA A100-SXM4-40GB", major=8, minor=0))
    assert (torch.cuda.is_available, torch.cuda.get_device_properties, di.device_interfaces.get("cuda")) == before
    assert a.meta["compile"]["graphs"] == b.meta["compile"]["graphs"] == 1


CNN = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                      nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).cuda()
step = torch.compile(model, mode=MODE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(2):
    x, y = torch.randn(32, 3, 16, 16, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    nn.functional.cross_entropy(step(x), y).backward()
    opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("mode", ["None", '"max-autotune-no-cudagraphs"'])  # (max-autotune's graphs: test_cuda_graph_trees)
def test_a_compiled_cnn_runs_its_channels_last_convolutions_as_cudnn_does(mode):
    """Inductor lays a training CNN's convolutions out channels-last and asserts the strides
    cuDNN gives; at batch 16 and more the CPU's kernel (NNPACK) gave NCHW and the step
    stopped with an AssertionError. ``max-autotune`` compiles too (its benchmarking off); its CUDA
    graphs would make the second step a recording (test_cuda_graph_trees.py)."""
    tr = trace(CNN.replace("MODE", mode), {}, mode="fake", device=H100)
    info = tr.meta["compile"]
    assert info["graphs"] == 1 and info["backward_graphs"] == 1 and info["failures"] == 0, tr.meta["notes"]
    forward, backward = (_buffers(p) for p in info["wrappers"])
    # the layout optimisation: the wrapper asserts a channels-last convolution output
    assert re.search(r"assert_\w+\(buf\d+, \(32, \d+, 16, 16\), \(\d+, 1, ", open(info["wrappers"][0]).read())
    for phase, expected in (("forward", forward), ("backward", backward)):
        got = [shape for shape, op in _allocs(tr, 1, phase) if op == "aten.empty_strided.default"]
        assert got == expected, phase
    assert not [n for n in tr.meta["notes"] if "ran eagerly" in n]


def test_a_compiled_bf16_cnn_expects_the_layout_its_convolutions_get():
    """Under bf16 autocast FakeTensor's convolution asked ``torch._C._select_conv_backend``, which
    without a driver cannot see that the GPU runs bf16 convolutions on cuDNN: Inductor expected a
    contiguous output and the traced (cuDNN, channels-last) convolution failed its assertion
    (timm's ``train.py --amp-dtype bfloat16 --torchcompile``)."""
    src = CNN.replace("MODE", "None").replace(
        "nn.functional.cross_entropy(step(x), y).backward()",
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n        loss = nn.functional.cross_entropy(step(x), y)\n"
        "    loss.backward()")
    tr = trace(src, {}, mode="fake", device=H100)
    info = tr.meta["compile"]
    assert info["graphs"] == 1 and info["backward_graphs"] == 1 and info["failures"] == 0, tr.meta["notes"]
    assert re.search(r"assert_\w+\(buf\d+, \(32, \d+, 16, 16\), \(\d+, 1, ", open(info["wrappers"][0]).read())
    assert not [n for n in tr.meta["notes"] if "raised" in n or "ran eagerly" in n]


SEQUENTIAL_OF_OWN_BLOCKS = """
import torch, torch.nn as nn
SCALE = WIDTH / 64                      # a global of the script, read by the inlined forward
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(WIDTH, WIDTH)
    def forward(s, x):
        return torch.relu(s.l(x)) * SCALE
model = torch.compile(nn.Sequential(Block(), Block()).cuda())   # Dynamo's root frame is torch's
model(torch.randn(32, WIDTH, device="cuda")).sum().backward()
"""


def test_a_second_scripts_compile_reads_its_own_main_module():
    """Dynamo reads an inlined function's globals through ``sys.modules["__main__"]`` and caches
    that import for the process: the second script compiled read the first one's ``__main__``
    stand-in, emptied by then, and its compile failed ("module has no attribute '__name__'")."""
    for width in (64, 128):
        tr = trace(SEQUENTIAL_OF_OWN_BLOCKS.replace("WIDTH", str(width)), {}, mode="fake", device=H100)
        info = tr.meta["compile"]
        assert info["graphs"] == 1 and info["failures"] == 0, tr.meta["notes"]


GRAPH_BREAK = """
import os, torch, torch.nn as nn
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(64, 256); s.l2 = nn.Linear(256, 64)
    def forward(s, x):
        h = torch.relu(s.l1(x))
        print(h.mean().item(), file=sink)  # Dynamo breaks the graph here
        return s.l2(h).square().mean()
sink = open(os.devnull, "w")
step = torch.compile(M().cuda())
x = torch.randn(32, 64, device="cuda")
for i in range(2):
    step(x).backward()
"""


def test_a_graph_break_compiles_two_graphs_and_is_named():
    tr = trace(GRAPH_BREAK, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["graphs"] >= 2 and tr.meta["compile"]["failures"] == 0
    notes = [n for n in tr.meta["notes"] if n.startswith("torch.compile")]
    assert len(notes) == 2 and "graph break" in notes[1] and "item()" in notes[1]
    # the forward graphs' wrapper buffers (backward wrappers take tangents), in order
    forward = [p for p in tr.meta["compile"]["wrappers"] if "tangents_" not in open(p).read()]
    got = [s for s, op in _allocs(tr, 1, "forward") if op == "aten.empty_strided.default"]
    assert len(forward) >= 2 and got == [b for p in forward for b in _buffers(p)]


TRAIN_STEP = """
import torch, torch.nn as nn
torch._dynamo.config.compiled_autograd = True  # (PyTorch's tutorial "Compiled Autograd"; read by torch.compile)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
@torch.compile
def train_step(x, t):
    loss = (model(x) - t).square().mean()
    loss.backward()
    return loss
x, t = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
for i in range(3):
    train_step(x, t)
    opt.step(); opt.zero_grad()
"""


def test_a_training_step_compiled_whole_has_the_steps_phases():
    """``@torch.compile`` on a function that runs forward and ``backward()``: Dynamo runs no module
    hooks and calls ``backward()`` eagerly at a graph break, with the device mode off. The
    compiled forward had been phase "other" (its buffers "other", none an activation) and the
    trace had no iterations at all. Compiled autograd on (as its tutorial does it) had stopped the
    estimate: it cannot capture the tracer's fake tensors; it is off for the trace, and noted."""
    with torch._dynamo.config.patch(compiled_autograd=False):  # the script turns it on: off after
        tr = trace(TRAIN_STEP, {}, mode="fake", device=H100)
    assert max(e.iteration for e in tr.events) == 2
    wrappers = tr.meta["compile"]["wrappers"]
    forward = [p for p in wrappers if "tangents_" not in open(p).read()]
    backward = [p for p in wrappers if "tangents_" in open(p).read()]
    assert len(forward) == len(backward) == 1
    for phase, path in (("forward", forward[0]), ("backward", backward[0])):
        got = [s for s, op in _allocs(tr, 1, phase) if op == "aten.empty_strided.default"]
        assert got == _buffers(path), phase
    saved = {e.category for e in tr.events if e.kind == "alloc" and e.iteration == 1 and e.phase == "forward"}
    assert "activation" in saved and "other" not in saved
    # the optimizer's step still ends each iteration: one phase change to "optimizer" in each
    steps = [e.iteration for e in tr.events if e.kind == "phase" and e.phase == "optimizer"]
    assert steps == [0, 1, 2]
    # Dynamo breaks its graph at backward() only: not in the tracer's code that backward runs
    breaks = [n for n in tr.meta["notes"] if "graph break" in n]
    assert len(breaks) == 1 and "1 graph break," in breaks[0] and "backward" in breaks[0], breaks
    assert any(n.startswith("torch._dynamo.config.compiled_autograd was on") for n in tr.meta["notes"])


WHOLE_STEP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).cuda()
opt = torch.optim.AdamW(model.parameters())
@torch.compile
def step(x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()  # a graph of its own, on the loss alone
for i in range(3):
    step(torch.randn(32, 64, device="cuda"))
"""


def test_a_graph_after_the_optimizer_step_starts_no_step():
    """The optimizer's step inside the compiled function too: the graph that detaches the loss
    after it trains nothing, and had started a fourth iteration (each one a step late). Compiled
    autograd left on by an earlier cell (the setting outlives it, as it does run for real)."""
    with torch._dynamo.config.patch(compiled_autograd=True):
        tr = trace(WHOLE_STEP, {}, mode="fake", device=H100)
    starts = [e.iteration for e in tr.events if e.kind == "iteration"]
    assert starts == [0, 1, 2]
    for i in starts:  # each iteration: forward, backward, optimizer, in that order
        phases = [e.phase for e in tr.events if e.kind == "phase" and e.iteration == i and e.phase != "other"]
        assert phases == ["forward", "backward", "optimizer"], (i, phases)


def test_the_graph_breaks_named_are_the_traces_own():
    """Dynamo counts breaks by reason for the whole process: a reason an earlier trace had met was
    counted again, not added last, and the note named the earlier trace's last reason instead
    ("Attempted to inline function marked as skipped" for the step with no optimizer in it)."""
    with torch._dynamo.config.patch(compiled_autograd=False):
        first = trace(WHOLE_STEP, {}, mode="fake", device=H100)
        second = trace(TRAIN_STEP, {}, mode="fake", device=H100)
    breaks = [n for n in first.meta["notes"] if "graph break" in n]
    assert len(breaks) == 1 and "2 graph breaks" in breaks[0] and "`Optimizer.zero_grad`" in breaks[0], breaks
    breaks = [n for n in second.meta["notes"] if "graph break" in n]
    assert breaks == ["torch.compile: 1 graph break, the code between graphs ran eagerly: "
                      "Unsupported Tensor.backward() call"], breaks


def test_a_library_that_wraps_torch_compile_and_copies_its_arguments_still_compiles():
    """Lightning replaces ``torch.compile`` at import with a wrapper that deep-copies each call's
    arguments onto the module (``lightning/fabric/wrappers.py``, ``_capture_compile_kwargs``) and
    compiles again with them in ``Fabric.setup``: the backend the tracer passes must survive both."""
    import copy

    real = torch.compile

    def capture(*args, **kwargs):
        if not args or not isinstance(args[0], torch.nn.Module):
            return real(*args, **kwargs)
        compiled = real(args[0], **kwargs)
        compiled._compile_kwargs = copy.deepcopy(kwargs)
        return compiled

    again = MLP.replace("step = torch.compile(model)",
                        "step = torch.compile(torch.compile(model)._orig_mod, **torch.compile(model)._compile_kwargs)")
    torch.compile = capture
    try:
        tr = trace(again, {}, mode="fake", device=H100)
    finally:
        torch.compile = real
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["failures"] == 0
    assert tr.meta["compile"]["backward_graphs"] == 1




def test_a_compiled_modules_context_compiles_its_other_methods_for_the_gpu():
    """Lightning's ``from_compiled`` applies the compiled module's ``dynamo_ctx`` to the module's
    ``training_step``: that method compiled for the CPU the traced tensors are on and Inductor's
    CPU kernel ran on a fake tensor (SIGSEGV). It is a compiled call, the step's forward, and its
    graphs are the same as those of the compiled module itself."""
    method = MLP.replace("    def forward(s, x, target):", "    def step(s, x, target):\n        return s(x, target)\n"
                         "    def forward(s, x, target):").replace(
        "step = torch.compile(model)", "step = torch.compile(model).dynamo_ctx(model.step)")
    plain, tr = trace(MLP, {}, mode="fake", device=H100), trace(method, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["backward_graphs"] == 1
    assert tr.meta["compile"]["failures"] == 0
    for it in (0, 1):
        for phase in ("forward", "backward"):
            assert _allocs(tr, it, phase) == _allocs(plain, it, phase) != []


def test_a_compiled_module_deep_copies_and_its_context_reads_as_dynamos():
    """An EMA of a compiled model (``AveragedModel(torch.compile(model))``) deep-copies it, its
    ``dynamo_ctx`` (the tracer's wrapper of Dynamo's context) with it: that copied the trace
    ("cannot pickle 'getset_descriptor'"). The wrapper copies as itself and reads as the context."""
    src = MLP + """
import copy
twin = copy.deepcopy(step)
fullgraph = step.dynamo_ctx.fullgraph
same_ctx = twin.dynamo_ctx is step.dynamo_ctx
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake", device=H100)
    assert ns["fullgraph"] is False and ns["same_ctx"] is True
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["failures"] == 0


def test_a_compile_through_a_librarys_wrapper_is_named_by_the_users_line():
    """``import lightning`` wraps ``torch.compile`` (``_capture_compile_kwargs``): a compile is
    named by the line of the script that called it, not by the wrapper's."""
    wrapped = MLP.replace("step = torch.compile(model)", """import functools
real = torch.compile
@functools.wraps(real)
def capture(*args, **kwargs):
    return real(*args, **kwargs)
torch.compile = capture
try:
    step = torch.compile(model)
finally:
    torch.compile = real""")
    tr = trace(wrapped, {}, mode="fake", device=H100)
    line = next(i for i, s in enumerate(wrapped.splitlines(), 1) if s.strip() == "step = torch.compile(model)")
    assert tr.meta["compile"]["where"] == [f"<cell>:{line}"]


COMPILED_EACH_CALL = """
import torch

def update(p, g):
    p.add_(g * -0.1)

params = [torch.zeros(256, 64, device="cuda"), torch.zeros(64, 64, device="cuda"),
          torch.zeros(256, 64, device="cuda"), torch.zeros(64, 64, device="cuda")]
for step in range(2):
    for p in params:  # as torchao's AdamW8bit does, once a parameter
        torch.compile(update, fullgraph=True, dynamic=False)(p, torch.ones_like(p))
"""


def test_compiling_the_same_function_afresh_reuses_its_graphs():
    """``torch.compile(fn, ...)`` called anew for each parameter and step gives an equal
    backend each time (Inductor's wrapper compares by its settings), so Dynamo compiles one
    graph per shape: 2 here, not 8 (torchao's ``AdamW8bit`` took 42 graphs for 7 shapes)."""
    tr = trace(COMPILED_EACH_CALL, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["failures"] == 0
    assert tr.meta["compile"]["graphs"] == 2, tr.meta["notes"]

DYNAMO_OPTIMIZE = """
import torch, torch.nn as nn, torch._dynamo
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
@torch._dynamo.optimize("inductor")
def step(x):
    return model(x).square().mean()
x = torch.randn(512, 256, device="cuda")
step(x).backward()
"""


def test_dynamo_optimize_compiles_as_torch_compile_does():
    """``torch._dynamo.optimize``, the older spelling (``torch.compile`` calls it itself, which
    must stay Dynamo's own: it recursed before)."""
    tr = trace(DYNAMO_OPTIMIZE, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["backward_graphs"] == 1
    assert tr.meta["compile"]["where"] == ["<cell>:4"]
    forward, backward = (_buffers(p) for p in tr.meta["compile"]["wrappers"])
    got = [tuple(e.shape) for e in tr.events if e.kind == "alloc" and e.op == "aten.empty_strided.default"]
    assert got == forward + backward


# an MLP whose pointwise chain after l1 (gelu, *2, +1) Inductor fuses (also tests/jupyter/test_compile_toggle.py)
POINTWISE_MLP = """import torch, torch.nn as nn, torch.nn.functional as F
class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(1024, 4096); s.l2 = nn.Linear(4096, 1024)
    def forward(s, x):
        return s.l2(F.gelu(s.l1(x)) * 2 + 1)
"""
FUSABLE = "\n" + POINTWISE_MLP + """batch_size = 4096
model = MLP().cuda()
opt = torch.optim.AdamW(model.parameters())
for i in range(2):
    x = torch.randn(batch_size, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad()
"""


def test_a_symbolic_batch_stops_before_dynamo_and_leaves_compiling_as_it_was(tmp_path):
    """Dynamo specialises the sizes it is given: a trace with the batch a symbol (symbolic.py)
    stops at the first compiled call, before Dynamo starts (stopped inside it, Dynamo's state
    was left behind and the next compiled trace could not place its tensors on the virtual GPU)."""
    from xmem_engine.batch_family import NotSymbolic, symbolic_family
    from xmem_engine.estimate import estimate

    script = tmp_path / "train.py"
    script.write_text(FUSABLE.replace("model = MLP().cuda()", "model = torch.compile(MLP().cuda())"))
    with pytest.raises(NotSymbolic, match=r"batch_size was fixed at 64: .*torch.compile traces its graphs at concrete"):
        symbolic_family(str(script), "batch_size", 64)
    est = estimate(MLP, "H100-SXM-80GB", mode="fake", compile="inductor")
    assert est.trace.meta["compile"]["graphs"] >= 1


def test_the_advisor_measures_compiling_the_model(tmp_path):
    """The "torch.compile" lever compiles the outermost model for the target GPU: the pointwise
    chain after ``l1`` (gelu, *2, +1) is one fused kernel, so eager's intermediates never exist;
    a step that compiles already is not compiled again."""
    from xmem_engine.advisor import advise

    script = tmp_path / "train.py"
    script.write_text(FUSABLE)
    advice = advise(str(script), "H100-SXM-80GB", mode="fake")
    lever = next(m for m in advice.levers if m.lever.name == "torch.compile")
    assert lever.applicable and not lever.error, lever
    assert lever.change == "model = torch.compile(model)"
    compiled = lever.estimate.trace.meta["compile"]
    assert compiled["graphs"] == 1 and compiled["backward_graphs"] == 1
    assert lever.peak_device_bytes < advice.baseline.peak_device_bytes
    eager_ops = {e.op for e in advice.baseline.trace.events if e.kind == "alloc"}
    assert "aten.gelu.default" in eager_ops
    assert "aten.gelu.default" not in {e.op for e in lever.estimate.trace.events if e.kind == "alloc"}

    script.write_text(FUSABLE.replace("model = MLP().cuda()", "model = torch.compile(MLP().cuda())"))
    again = advise(str(script), "H100-SXM-80GB", mode="fake")
    lever = next(m for m in again.levers if m.lever.name == "torch.compile")
    assert not lever.applicable and lever.detail == "the step is compiled already"


def test_compiled_matmuls_take_cublas_workspaces_as_eager_ones_do():
    """Inductor calls cuBLAS as ``extern_kernels.mm(a, b, out=buf)`` into a buffer it allocated
    itself: no GEMM output is allocated, yet the handle's workspace is taken at the first GEMM of
    forward and of backward as in eager code (the kk recording's 32 MiB one was missing)."""
    from xmem_engine.estimate import estimate
    from xmem_engine.gpus.cuda_libraries import WORKSPACE_OP

    def workspaces(compile: str) -> list:
        est = estimate(MLP, "H100-SXM-80GB", mode="fake", compile=compile)
        return [(e.phase, e.bytes) for e in est.simulated_events if e.kind == "alloc" and e.op == WORKSPACE_OP]

    compiled, eager = workspaces("inductor"), workspaces("eager")
    assert compiled == eager == [("forward", 32 << 20), ("backward", 32 << 20)]


HF_LLAMA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)
model = torch.compile(LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 512, (2, 64), device="cuda")
for step in range(2):
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step(); opt.zero_grad()
"""


def test_a_compiled_hugging_face_forward_with_its_cache_compiles():
    """transformers' ``DynamicCache`` (on in training too) makes ``torch.tensor([], device="cuda")``
    in the compiled forward; AOTAutograd moves that constant to ``cuda`` for real to propagate
    it, which failed without a driver ("Found no NVIDIA driver": the graph ran eagerly)."""
    pytest.importorskip("transformers")
    tr = trace(HF_LLAMA, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["failures"] == 0 and tr.meta["compile"]["graphs"] >= 1, tr.meta["notes"]
    assert tr.meta["compile"]["backward_graphs"] >= 1
    assert any("compiled for the target GPU" in n for n in tr.meta["notes"])


def test_compiles_after_import_lightning_set_the_nvml_check(monkeypatch):
    """``import lightning`` sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` for the process; under it
    ``torch.cuda.is_available()`` asks ``device_count()``, the virtual GPU's while tracing, so
    the compile took the machine for one with a GPU and Inductor's pattern set-up made real
    CUDA tensors: every compile after a Lightning import ran eagerly."""
    from xmem_engine.tracing.compiler import inductor_gpu

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    with monkeypatch.context() as m:  # as the tracer patches it (Inductor's patterns are set up once a process)
        m.setattr(torch.cuda, "device_count", lambda: 1)
        assert inductor_gpu.REAL_AVAILABILITY[0]() is False  # what a compile is told: no GPU here
    tr = trace(MLP, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["failures"] == 0 and tr.meta["compile"]["graphs"] == 1, tr.meta["notes"]


def test_compiles_after_has_triton_was_asked_outside_the_trace():
    """``torch.utils._triton.has_triton`` is cached for the process; asked outside a trace (a
    Lightning run asked it), its answer on this machine is False, and Inductor then refused
    to compile for CUDA ("TritonMissing"). The trace asks it afresh for the virtual GPU."""
    from torch.utils._triton import has_triton

    has_triton.cache_clear()
    assert has_triton() is False  # outside a trace: no GPU here
    tr = trace(MLP, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["failures"] == 0 and tr.meta["compile"]["graphs"] == 1, tr.meta["notes"]
    assert has_triton() is False  # and the machine's answer is back after it


def test_each_kernels_first_launch_allocates_what_its_autotuning_would():
    """On the GPU a kernel with several configs times them at its first launch: a cache-flush
    buffer and copies of what it writes in place (inductor_autotune.py; measured on an H200:
    60 MiB buffers and copies of GPT-2's logits). The buffer is L2-sized where Inductor times
    with its own benchmarker (torch 2.13, 2.14), Triton's 256 MiB where with Triton's (2.10).
    First step only, freed at once."""
    from torch._inductor.runtime import benchmarking

    l2 = 50 * 2**20
    size = l2 if type(benchmarking.benchmarker).__name__ == "InductorBenchmarker" else 256 * 2**20
    tr = trace(GPT, {}, mode="fake", device=dict(H100, L2_cache_size=l2))
    flush = [e for e in tr.events if e.kind == "alloc" and e.bytes == size]
    assert flush and {e.iteration for e in flush} == {0}
    assert all(e.dtype in ("int32", "torch.int32") for e in flush), {e.dtype for e in flush}
    freed = {e.id for e in tr.events if e.kind == "free"}
    assert all(e.id in freed for e in flush)
    # the step after compiled nothing new: it allocates only the wrapper's buffers and attention's
    later = [op for _, op in _allocs(tr, 1, "forward") + _allocs(tr, 1, "backward")]
    assert "aten.empty.memory_format" not in later


def test_the_flush_buffer_is_the_installed_benchmarkers(monkeypatch):
    """Inductor's own benchmarker flushes the L2 with a buffer its size; Triton's ``do_bench``
    (what torch 2.6 and 2.10 time with) with 256 MiB: the kk compiled recording (torch 2.6)
    holds 37 of 268,435,456 B."""
    from torch._inductor.runtime import benchmarking

    from xmem_engine.tracing.compiler.inductor_autotune import flush_bytes

    class TritonBenchmarker:
        pass

    class InductorBenchmarker:
        pass

    monkeypatch.setattr(benchmarking, "benchmarker", TritonBenchmarker())
    assert flush_bytes(60 * 2**20) == 268_435_456
    monkeypatch.setattr(benchmarking, "benchmarker", InductorBenchmarker())
    assert flush_bytes(60 * 2**20) == 60 * 2**20


def test_autotuning_is_read_off_the_generated_kernel():
    from xmem_engine.tracing.compiler.inductor_autotune import autotune_of

    src = '''
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.pointwise(
    size_hints={'x': 1048576}, filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'},
                 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9,
                                            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                            max_threads_per_block=1024, warp_size=32),
                 'constants': {}, 'configs': [{(0,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'kernel_name': 'triton_poi_fused_gelu_0',
                   'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': True, 'autotune_hints': set(),
                   'are_deterministic_algorithms_enabled': False},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_gelu_0(in_out_ptr0, in_ptr0, xnumel, XBLOCK : tl.constexpr):
    pass
'''
    tune = autotune_of("triton_poi_fused_gelu_0", src)
    assert tune is not None and tune.configs >= 2  # a 1-D pointwise kernel is timed in two shapes
    assert tune.mutated == {"in_out_ptr0"} and tune.optimize_mem
    assert tune.arg_names[:2] == ("in_out_ptr0", "in_ptr0")
    assert autotune_of("user_kernel", "@triton.jit\ndef user_kernel(x):\n    pass\n") is None


HEAD = """
import torch, torch.nn as nn
model = torch.compile(nn.Linear(768, 50257, bias=False).cuda())
x = torch.randn(4096, 768, device="cuda")
for i in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    y.float().sum().backward()
"""


def test_pad_mm_times_a_misaligned_half_matmul_and_pads_it():
    """An H200 compiling GPT-2's 50,257-word head timed padded and unpadded matmuls on real
    matrices while compiling, then padded it (logits strided 50,264): both are modelled."""
    tr = trace(HEAD, {}, mode="fake", device=H100)
    timing = [e for e in tr.events if e.op == "inductor.pad_mm_timing"]
    sizes = {e.bytes for e in timing if e.kind == "alloc"}
    assert 4096 * 50257 * 2 in sizes and 4096 * 50264 * 2 in sizes  # unpadded and padded outputs
    assert {e.iteration for e in timing} == {0}
    assert sum(e.kind == "alloc" for e in timing) == sum(e.kind == "free" for e in timing)
    # the compiled step's own output is the padded one, every step
    outs = [e.bytes for e in tr.events if e.kind == "alloc" and e.iteration == 1 and e.op == "aten.empty_strided.default"]
    assert 4096 * 50264 * 2 in outs
    fp32 = trace(HEAD.replace('dtype=torch.bfloat16', 'enabled=False'), {}, mode="fake", device=H100)
    # float32 is left as it is
    assert not any(e.kind == "alloc" and e.bytes == 4096 * 50264 * 4 for e in fp32.events)


def test_inductors_memory_planning_carves_buffers_out_of_pools():
    """``config.memory_planning`` (Unsloth compiles with it; Inductor plans inference graphs so):
    the wrapper allocates a few pools and takes its buffers as views of them
    (``alloc_from_pool``); the trace holds the pools, in the wrapper's order, and nothing else."""
    src = """
import torch, torch.nn as nn
import torch._inductor.config as config
config.memory_planning = True
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64)).cuda()
step = torch.compile(model)
x = torch.randn(32, 64, device="cuda")
with torch.no_grad():
    for i in range(2):
        y = step(x)
"""
    tr = trace(src, {}, mode="fake", device=H100)
    info = tr.meta["compile"]
    assert not info["eager"] and info["graphs"] == 1
    (wrapper,) = info["wrappers"]
    assert "alloc_from_pool(" in open(wrapper).read()
    pools = _buffers(wrapper)
    got = [shape for shape, op in _allocs(tr, 0, "forward") if op == "aten.empty_strided.default"]
    assert pools and got == pools * 2  # two calls (the other allocation: the kernel's first-launch timing)


def test_a_compiled_call_that_raises_is_said_when_the_code_runs_something_else():
    """Libraries catch a compiled call's error and fall back to eager code (Unsloth's block
    compile does): the estimate is then of the fallback, and the notes say which call raised."""
    src = """
import torch
def fast(x):
    if x.shape[0] > 32:
        raise ValueError("too many rows for the fast path")
    return torch.relu(x).sum()
compiled = torch.compile(fast)
x = torch.randn(64, 64, device="cuda")
try:
    out = compiled(x)
except ValueError:
    out = x.clamp(min=0).sum()  # the library's eager path
"""
    tr = trace(src, {}, mode="fake", device=H100)
    raised = [n for n in tr.meta["notes"] if "the compiled call raised under the tracer" in n]
    assert len(raised) == 1 and "ValueError: too many rows for the fast path" in raised[0] and "<cell>:7" in raised[0]


def test_code_dynamo_leaves_to_python_allocates_on_the_virtual_gpu():
    """A ``torch.compiler.disable``d function inside a compiled call runs eagerly, between graphs,
    without the device mode: its ``torch.empty(device=x.device)`` (which asked for a driver) and a
    custom op's fake kernel that allocates on its input's device (Unsloth's NF4 dequantize) are
    allocations on the virtual GPU, as on the GPU."""
    src = """
import torch

@torch.library.custom_op("xmemtest::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@scale.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)

@torch.compiler.disable
def helper(x):
    buf = torch.empty(x.shape[0], 1024, device=x.device)
    return scale(x @ buf[:, :x.shape[1]].t())

def f(x):
    return (helper(torch.relu(x) * 2) + 1).sum()

out = torch.compile(f)(torch.randn(64, 64, device="cuda"))
assert out.device.type == "cuda" and out.is_cuda
"""
    tr = trace(src, {}, mode="fake", device=H100)
    allocs = [(e.op, tuple(e.shape)) for e in tr.events if e.kind == "alloc"]
    assert ("aten.empty.memory_format", (64, 1024)) in allocs  # the helper's buffer
    assert ("aten.mm.default", (64, 64)) in allocs
    assert ("xmemtest.scale.default", (64, 64)) in allocs  # the custom op's output, on the GPU
    assert tr.meta["compile"]["graphs"] == 2
    assert not [n for n in tr.meta["notes"] if "raised" in n]


def test_alloc_from_pool_views_pools_of_any_layout():
    """``alloc_from_pool`` over a byte pool at an offset, and over a pool Inductor made in the
    buffer's own dtype with transposed strides (Unsloth's LoRA weights): views, no allocation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from xmem_engine.tracing.compiler.inductor_gpu import alloc_from_pool

    with FakeTensorMode():
        pool = torch.empty(4096, dtype=torch.uint8)
        a = alloc_from_pool(pool, 1024, torch.float16, (16, 32), (32, 1))
        assert a.shape == (16, 32) and a.stride() == (32, 1) and a.dtype == torch.float16
        assert a.storage_offset() == 512 and a.untyped_storage()._cdata == pool.untyped_storage()._cdata
        transposed = torch.empty_strided((16, 512), (1, 16), dtype=torch.float16)
        b = alloc_from_pool(transposed, 0, torch.float16, (16, 512), (1, 16))
        assert b.stride() == (1, 16) and b.untyped_storage()._cdata == transposed.untyped_storage()._cdata
        c = alloc_from_pool(transposed, 0, torch.float32, (8, 256), (256, 1))
        assert c.dtype == torch.float32 and c.untyped_storage()._cdata == transposed.untyped_storage()._cdata


def test_a_compiled_functions_buffers_are_not_inputs():
    """Outside any module, data the code puts on the GPU (``torch.randn(..., device="cuda")``) is
    "input"; the buffers of a compiled function (Inductor's ``empty_strided_cuda``) and of code
    between its graphs are not, as the same function's eager ops are not."""
    src = """
import torch
def f(x):
    return (torch.relu(x) * 2 + 1).sum(dim=0)
x = torch.randn(64, 64, device="cuda")
y = torch.compile(f)(x)
z = f(x)
"""
    tr = trace(src, {}, mode="fake", device=H100)
    cats = [(e.op, e.category.value) for e in tr.events if e.kind == "alloc"]
    assert cats[0] == ("aten.randn.default", "input")
    assert all(c != "input" for _, c in cats[1:]), cats


def test_a_backend_other_than_inductor_is_named_as_what_compiled():
    """``backend="aot_eager"`` (a common debugging step) runs AOTAutograd's graphs op by op: the
    note names that backend and claims none of Inductor's buffers."""
    tr = trace(MLP.replace("torch.compile(model)", "torch.compile(model, backend='aot_eager')"), {}, mode="fake",
               device=H100)
    note = next(n for n in tr.meta["notes"] if n.startswith("torch.compile at"))
    assert "compiled for the target GPU by the 'aot_eager' backend" in note and "Inductor" not in note
    assert tr.meta["compile"]["graphs"] >= 1 and not tr.meta["compile"]["wrappers"]


def test_a_compiled_in_place_update_forgets_what_was_known(capsys):
    """Inductor's kernels do not run here, so what they write is unknown: a compiled
    ``buf.add_(1)`` had left the zeros known of ``buf`` in place, and ``buf.sum()`` said 0 where a
    GPU says 8. Now the values are guessed (ones at the leaves), as after a Triton launch."""
    src = """
import torch
buf = torch.zeros(8, device="cuda")
@torch.compile
def bump(buf):
    buf.add_(1)
bump(buf)
print("sum", buf.sum().item())
"""
    t = trace(src, {}, mode="fake", device=H100)
    assert t.meta["compile"]["graphs"] == 1
    assert capsys.readouterr().out.split() == ["sum", "8.0"]


def test_a_compiled_copy_to_pinned_host_memory_allocates_on_the_host():
    """A compiled ``.to("cpu", non_blocking=True)`` (transformers' static-cache ``generate``
    with a compiled forward makes one) is an ``empty_strided_cpu_pinned`` buffer in Inductor's
    wrapper, which asked the driver to pin it ("Found no NVIDIA driver"). Pinned memory is the
    host's: the GPU's allocations are the device buffers only."""
    src = """
import torch
@torch.compile
def f(x):
    y = x * 2
    return y.to("cpu", non_blocking=True), y.sum()
x = torch.randn(1024, 1024, device="cuda")
host, total = f(x)
where = (host.device.type, total.device.type, tuple(host.shape))
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake", device=H100)
    assert ns["where"] == ("cpu", "cuda", (1024, 1024))
    # x and y (or a pool holding y, where a test before turned memory planning on); the sum, split
    # in two stages or not, and on torch 2.10 its autotuning's 40 MiB cache-flush buffer, as the
    # configs go: nothing of y's size for the host copy
    allocs = [e.bytes for e in tr.events if e.kind == "alloc"]
    assert sum(4 << 20 <= b < 8 << 20 for b in allocs) == 2 and allocs[-1] == 4, allocs


def test_a_compiled_torch_func_grad_compiles_whole_with_eager_grad_allowed():
    """The tracer lets ``torch.func.grad`` run eagerly by a ``disable_saved_tensors_hooks`` of its
    own (mode_stacks.saved_hooks_yielding); inside a compiled call Dynamo must meet torch's, which
    it knows by identity: the tracer's was an unsupported call, a graph break, the step eager."""
    src = """
import torch, torch.nn as nn
from torch.func import functional_call, grad_and_value
model = nn.Linear(1024, 1024).cuda()
params = {k: v.detach() for k, v in model.named_parameters()}
def loss_fn(p, x):
    return functional_call(model, p, (x,)).pow(2).mean()
x = torch.randn(256, 1024, device="cuda")
g, v = torch.compile(grad_and_value(loss_fn))(params, x)
eager, _ = grad_and_value(loss_fn)(params, x)
shapes = (tuple(g["weight"].shape), tuple(eager["weight"].shape))
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake", device=H100)
    assert ns["shapes"] == ((1024, 1024), (1024, 1024))
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["failures"] == 0
    assert not [n for n in tr.meta["notes"] if "graph break" in n]


def test_a_compiled_function_with_a_try_is_compiled():
    """``@torch.compile def step(x): try: ... except Exception:``: the out-of-memory marks
    (``oom_tries.py``) are left out of it, and Dynamo compiles it as on the GPU (it had compiled
    no graph and the step ran eagerly)."""
    code = (
        "import torch\nmodel = torch.nn.Linear(256, 256).cuda()\n\n@torch.compile\ndef step(x):\n    try:\n"
        "        y = model(x)\n    except Exception:\n        y = model(x * 0)\n    return y.square().mean()\n\n"
        "step(torch.randn(64, 256, device='cuda')).backward()\n")
    tr = trace(code, {}, mode="fake")
    assert tr.meta["compile"]["graphs"] == 1


def test_the_same_failure_of_several_graphs_is_said_once():
    """A T4 skips each bf16 graph of a model (the Trainer's ``bf16=True, torch_compile=True`` on
    GPT-2 with LoRA: four graphs): one note, with the count, not four of the same."""
    from xmem_engine.tracing.compiler.torch_compile import CompileRecord

    skipped = "torch.compile at accelerate/accelerator.py:2045: no bf16 here; that graph ran eagerly"
    rec = CompileRecord(failures=[skipped] * 4 + ["torch.compile at s.py:3: it raised; that graph ran eagerly"])
    assert rec.notes() == ["torch.compile at accelerate/accelerator.py:2045: no bf16 here; 4 such graphs ran eagerly",
                           "torch.compile at s.py:3: it raised; that graph ran eagerly"]
    assert rec.as_json()["failures"] == 5
