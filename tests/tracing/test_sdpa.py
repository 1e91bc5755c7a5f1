"""scaled_dot_product_attention allocates as the target GPU's CUDA backend does (sdpa.py)."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from xmem_engine.tracing.kernels import sdpa
from xmem_engine.estimate import estimate
from xmem_engine.trace import Trace, TraceEvent
from xmem_engine.tracing import trace

MODES = ["fake", "real"]
FLASH, EFF, MATH, CUDNN = sdpa.FLASH, sdpa.EFFICIENT, sdpa.MATH, sdpa.CUDNN
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

SM = {"T4": (7, 5), "V100": (7, 0), "A100": (8, 0), "3060": (8, 6), "4060": (8, 9), "H100": (9, 0),
      "P100": (6, 0), "K80": (3, 7), "5090": (12, 0)}


def device(cc: tuple[int, int], sms: int = 28) -> dict:
    return {"name": f"sm{cc[0]}{cc[1]}", "total_memory": 24 << 30, "major": cc[0], "minor": cc[1],
            "multi_processor_count": sms}


def allocs(tr: Trace, **match) -> list[TraceEvent]:
    return [e for e in tr.events if e.kind == "alloc" and all(getattr(e, k) == v for k, v in match.items())]


def params(dtype=F16, b=2, h=4, l=128, s=None, d=64, dv=None, mask=None, dropout=0.0, causal=False, grad=False,
           hk=None, gqa=False, q=None) -> sdpa.Inputs:
    s = l if s is None else s
    q = torch.empty(b, h, l, d, dtype=dtype, device="meta") if q is None else q
    k = torch.empty(b, hk or h, s, d, dtype=dtype, device="meta")
    v = torch.empty(b, hk or h, s, dv or d, dtype=dtype, device="meta")
    m = None
    if mask == "bool":
        m = torch.empty(l, s, dtype=torch.bool, device="meta")
    elif mask == "float":
        m = torch.empty(b, 1, l, s, dtype=dtype, device="meta")
    return sdpa.Inputs.of(q, k, v, m, dropout, causal, gqa, requires_grad=grad)


ALL_ON = {FLASH: True, EFF: True, MATH: True, CUDNN: True}


# --------------------------------------------------------------------------- backend choice
# (GPU, inputs, expected backend): sdp_utils.cpp's select_sdp_backend with default flags/order.
TABLE = [
    ("A100", dict(dtype=F16), FLASH),
    ("A100", dict(dtype=BF16), FLASH),
    ("A100", dict(dtype=F32), EFF),  # flash: fp16/bf16 only
    ("A100", dict(dtype=F16, dropout=0.1, grad=True), FLASH),  # flash supports dropout
    ("A100", dict(dtype=F16, mask="float"), EFF),  # flash: no attn_mask
    ("A100", dict(dtype=F16, mask="bool"), EFF),
    ("A100", dict(dtype=F32, mask="bool", dropout=0.1, grad=True), EFF),
    ("A100", dict(dtype=F16, d=256), FLASH),
    ("A100", dict(dtype=F16, d=264), EFF),  # flash: head dim <= 256; efficient: multiple of 8
    ("A100", dict(dtype=F16, d=30), FLASH),  # flash pads the head dim to 8
    ("A100", dict(dtype=F32, d=30), MATH),  # efficient: fp32 head dim % 4 on sm80+
    ("A100", dict(dtype=F16, d=60), FLASH),
    ("A100", dict(dtype=F16, d=64, dv=32), EFF),  # flash: equal head dims
    ("A100", dict(dtype=F16, causal=True, l=128, s=256), EFF),  # flash: causal needs L == S
    ("A100", dict(dtype=F16, hk=2, gqa=True), FLASH),  # flash supports GQA
    ("A100", dict(dtype=F32, hk=2, gqa=True), MATH),  # efficient: same heads
    ("A100", dict(dtype=F16, hk=2), MATH),  # different heads without enable_gqa
    ("A100", dict(dtype=torch.float64), MATH),
    ("3060", dict(dtype=F32, dropout=0.1, grad=True, causal=True), EFF),  # distilgpt2 on the paper's GPUs
    ("4060", dict(dtype=F32, grad=True, causal=True), EFF),  # opt-125m
    ("3060", dict(dtype=F16, d=200), FLASH),  # inference: no head-dim limit
    ("3060", dict(dtype=F16, d=200, grad=True), EFF),  # training on sm86: head dim <= 192
    ("4060", dict(dtype=F16, d=256, grad=True), FLASH),  # ... or > 224 without dropout
    ("4060", dict(dtype=F16, d=256, grad=True, dropout=0.1), EFF),
    ("A100", dict(dtype=F16, d=200, grad=True), FLASH),  # sm80 has no such limit
    ("5090", dict(dtype=F16, d=200, grad=True), EFF),  # sm120 has it
    ("H100", dict(dtype=BF16), FLASH),  # cuDNN first only with a CUDA build's cuDNN > 9.15
    ("T4", dict(dtype=F16), EFF),  # flash needs sm80
    ("T4", dict(dtype=F32, d=30), EFF),  # sm75 fp32 alignment 1
    ("T4", dict(dtype=F16, d=30), MATH),  # sm75 fp16 alignment 8
    ("T4", dict(dtype=BF16), MATH),  # efficient: bf16 needs sm80
    ("V100", dict(dtype=F32), EFF),
    ("P100", dict(dtype=F32), EFF),
    ("K80", dict(dtype=F32), MATH),  # efficient needs sm50
]


@pytest.mark.parametrize("gpu,kw,expected", TABLE, ids=[f"{g}-{i}" for i, (g, _, _) in enumerate(TABLE)])
def test_backend_choice_follows_select_sdp_backend(gpu, kw, expected):
    if gpu == "H100" and sdpa.prefer_cudnn(SM[gpu]):  # a CUDA build with cuDNN > 9.15 (2.10+)
        expected = CUDNN
    assert sdpa.select_backend(params(**kw), SM[gpu], ALL_ON, sdpa.DEFAULT_ORDER) == expected


def test_backend_choice_details():
    a100 = SM["A100"]
    # last dim not contiguous: no fused kernel
    q = torch.empty(2, 4, 128, 64, dtype=F16, device="meta").transpose(-1, -2).contiguous().transpose(-1, -2)
    assert sdpa.select_backend(params(q=q), a100, ALL_ON, sdpa.DEFAULT_ORDER) == MATH
    # efficient on sm80+: storage offsets aligned to the gemm alignment (2.10+)
    base = torch.empty(10_000_000, dtype=F32, device="meta")
    q = base[2:2 + 2 * 4 * 128 * 64].view(2, 4, 128, 64)
    assert sdpa.select_backend(params(dtype=F32, q=q), a100, ALL_ON, sdpa.DEFAULT_ORDER) == MATH
    assert sdpa.select_backend(params(dtype=F32, q=q), SM["T4"], ALL_ON, sdpa.DEFAULT_ORDER) == EFF
    # cuDNN when first in the order, and its own limits
    order = (CUDNN, FLASH, EFF, MATH)
    assert sdpa.select_backend(params(dtype=F16), SM["H100"], ALL_ON, order) == CUDNN
    assert sdpa.select_backend(params(dtype=F16, d=160), SM["H100"], ALL_ON, order) == FLASH  # d <= 128
    assert sdpa.select_backend(params(dtype=F16, dropout=0.1), SM["H100"], ALL_ON, order) == FLASH  # 1/16 steps
    assert sdpa.select_backend(params(dtype=F32), SM["H100"], ALL_ON, order) == EFF
    # nothing enabled / nothing viable
    with pytest.raises(RuntimeError, match="No viable backend"):
        sdpa.select_backend(params(), a100, dict.fromkeys(ALL_ON, False))
    with pytest.raises(RuntimeError, match="No available kernel"):
        sdpa.select_backend(params(dtype=BF16), SM["T4"], {**dict.fromkeys(ALL_ON, False), EFF: True})


def test_user_flags_and_sdpa_kernel_contexts_are_respected():
    p16, a100 = params(dtype=F16), SM["A100"]
    assert sdpa.select_backend(p16, a100) == FLASH
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        assert sdpa.select_backend(p16, a100) == EFF
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa.select_backend(p16, a100) == MATH
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        assert sdpa.select_backend(p16, a100) == CUDNN
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert sdpa.select_backend(p16, a100) == CUDNN
    assert sdpa.select_backend(p16, a100) == FLASH  # contexts restored
    try:
        torch.backends.cuda.enable_flash_sdp(False)
        assert sdpa.select_backend(p16, a100) == EFF
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        assert sdpa.select_backend(p16, a100) == MATH
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)


def test_prefer_cudnn_needs_sm90_and_a_recent_cudnn():
    assert not sdpa.prefer_cudnn(SM["A100"])
    if torch.backends.cudnn.version() is None:  # CPU builds report no cuDNN: never preferred
        assert not sdpa.prefer_cudnn(SM["H100"])


# --------------------------------------------------------------------------- allocations in the trace
BLOCK = """
import torch, torch.nn.functional as F
B, H, L, D = {b}, {h}, {l}, {d}
qkv = torch.nn.Linear(H * D, 3 * H * D).to("cuda", {dtype})
x = torch.randn(B, L, H * D, device="cuda", dtype={dtype})
q, k, v = qkv(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
out = F.scaled_dot_product_attention(q, k, v, dropout_p={p}, is_causal=True)
out.transpose(1, 2).reshape(B, L, H * D).float().pow(2).sum().backward()
"""


def _block(mode, cc, dtype="torch.float32", b=2, h=3, l=100, d=64, p=0.1) -> Trace:
    return trace(BLOCK.format(b=b, h=h, l=l, d=d, dtype=dtype, p=p), {}, mode=mode, device=device(cc))


def _square(tr: Trace, b=2, h=3, l=100) -> list[TraceEvent]:
    return [e for e in allocs(tr) if e.shape[-2:] == (l, l) and len(e.shape) == 4]


@pytest.mark.parametrize("mode", MODES)
def test_efficient_attention_allocations(mode):
    b, h, l, d = 2, 3, 100, 64
    tr = _block(mode, SM["3060"])
    fwd = allocs(tr, op="aten._efficient_attention_forward")
    assert [(e.shape, e.dtype, e.category) for e in fwd] == [
        ((b, l, h, d), "float32", "activation"), ((b, h, 128), "float32", "activation")]  # lse: ceil(L/32)*32
    bwd = allocs(tr, op="aten._efficient_attention_backward")
    ws = sdpa.efficient_backward_workspace(torch.float32, SM["3060"], b, h, l, l, d, d, dropout=True)
    assert [(e.shape, e.dtype) for e in bwd] == [((b, l, h, d), "float32")] * 3 + [
        ((b, h, l), "float32"), ((ws,), "uint8")]  # grad q/k/v, delta, workspace
    assert ws == b * h * 2 * (64 * 64 + 4) * 4  # grad_q staging: ceil(100/64) tiles of 64x64 floats + lock
    assert not _square(tr)  # no B x H x L x L tensor anywhere
    # fp32 delta: (grad_out * out).sum(-1) through float32 temporaries, as the CUDA code does
    assert allocs(tr, op="aten.mul.Tensor", shape=(b, l, h, d), phase="backward")


@pytest.mark.parametrize("mode", MODES)
def test_flash_attention_allocations(mode):
    b, h, l, d = 2, 3, 100, 64
    tr = _block(mode, SM["A100"], dtype="torch.float16")
    fwd = allocs(tr, op="aten._flash_attention_forward")
    assert [(e.shape, e.dtype, e.category) for e in fwd] == [
        ((b, l, h, d), "float16", "activation"), ((b, h, l), "float32", "activation")]
    bwd = allocs(tr, op="aten._flash_attention_backward")
    assert [(e.shape, e.dtype) for e in bwd] == [((b, l, h, d), "float16")] * 3 + [
        ((b, h, 128), "float32"), ((b, 128, h, 64), "float32")]  # softmax_d, dq_accum
    assert {e.category for e in bwd[3:]} == {"workspace"}
    assert not _square(tr)
    # q made contiguous as (B, H, L, D): flash's out is laid out like q, so backward copies it
    assert allocs(tr, op="aten.clone.default", shape=(b, l, h, d), dtype="float16", phase="backward")


@pytest.mark.parametrize("mode", MODES)
def test_math_on_gpus_without_fused_kernels(mode):
    b, h, l = 2, 3, 100
    tr = _block(mode, SM["T4"], dtype="torch.bfloat16")  # bf16 before sm80: math, in float32
    sq = _square(tr)
    assert {(e.shape, e.dtype) for e in sq} >= {((b, h, l, l), "float32"), ((b, h, l, l), "bool")}  # + dropout mask
    assert any(e.category == "activation" and e.dtype == "bool" for e in sq)  # native_dropout's mask
    assert not allocs(tr, op="aten._efficient_attention_forward")


@pytest.mark.parametrize("mode", MODES)
def test_no_grad_and_eval_allocate_no_logsumexp(mode):
    src = """
import torch, torch.nn.functional as F
q = torch.randn(2, 3, 50, 64, device="cuda")
with torch.no_grad():
    out = F.scaled_dot_product_attention(q, q, q)
"""
    tr = trace(src, {}, mode=mode, device=device(SM["3060"]))
    assert [e.shape for e in allocs(tr, op="aten._efficient_attention_forward")] == [(2, 50, 3, 64)]


@pytest.mark.parametrize("mode", MODES)
def test_masks_are_prepared_as_for_the_backend(mode):
    src = """
import torch, torch.nn.functional as F
q = torch.randn(2, 3, 50, 64, device="cuda", requires_grad=True)
mask = torch.ones(50, 50, dtype=torch.bool, device="cuda").tril()
out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
out.sum().backward()
"""
    tr = trace(src, {}, mode=mode, device=device(SM["3060"]))
    # bool -> additive float mask (50, 50), then pad_bias<16>: expanded and padded to (2, 3, 50, 64)
    assert allocs(tr, op="aten.where.self", shape=(50, 50), dtype="float32")
    assert [e.op for e in allocs(tr, shape=(2, 3, 50, 64), phase="other")][1:] == [
        "aten.constant_pad_nd.default"]  # after the input q


def test_autocast_casts_the_inputs_then_picks_the_half_backend():
    src = """
import torch, torch.nn.functional as F
q = torch.randn(2, 3, 50, 64, device="cuda", requires_grad=True)
with torch.autocast("cuda", dtype=torch.float16):
    out = F.scaled_dot_product_attention(q, q, q)
out.float().sum().backward()
"""
    tr = trace(src, {}, mode="fake", device=device(SM["A100"]))
    fwd = allocs(tr, op="aten._flash_attention_forward")
    assert [e.dtype for e in fwd] == ["float16", "float32"]


@pytest.mark.parametrize("mode", MODES)
def test_inputs_autocast_makes_one_dtype_take_the_gpus_backend(mode):
    """Hugging Face's rotary embedding turns q and k to float32 (cos and sin are float32) while
    v stays the linear's bfloat16: under autocast SDPA casts all three (and a mask) first, so
    the call is valid on a GPU. The inputs' own dtypes were checked instead, and the call went
    to PyTorch's CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``): every
    fp32-weights + bf16-autocast decoder (the ``Trainer``'s ``bf16=True``) with a padding mask."""
    src = """
import torch, torch.nn.functional as F
q = torch.randn(2, 4, 50, 64, device="cuda", requires_grad=True)
v = torch.randn(2, 4, 50, 64, device="cuda", dtype=VDT, requires_grad=True)
mask = torch.ones(2, 1, 50, 50, device="cuda", dtype=torch.bool)
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = F.scaled_dot_product_attention(q, q, v, attn_mask=mask)
out.float().sum().backward()
"""
    traces = [trace(src.replace("VDT", dt), {}, mode=mode, device=device(SM["A100"]))
              for dt in ("torch.float32", "torch.bfloat16")]
    for tr in traces:
        assert tr.meta.get("sdpa_calls") == 1
        assert [e.dtype for e in allocs(tr, op="aten._efficient_attention_forward")] == ["bfloat16", "float32"]
        assert not [e for e in tr.events if "for_cpu" in (e.op or "")]


MASK_DTYPE = """
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(2, 4, 50, 64, device="cuda", dtype=torch.float16, requires_grad=True)
mask = torch.zeros(2, 1, 50, 50, device="cuda")  # float32, as a mask made without a dtype is
with sdpa_kernel(BACKENDS):
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
out.float().sum().backward()
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_float32_mask_with_half_inputs_fails_where_the_gpu_fails(mode):
    """SDPA takes a float32 mask with half q, k, v (``validate_sdpa_input``) and picks the
    memory-efficient kernel for it, which raises "invalid dtype for bias" on the GPU: the
    script dies there. The call went to PyTorch's CPU kernel, which runs, and xmem answered
    with an estimate for a step that cannot run. cuDNN and math run it."""
    with pytest.raises(RuntimeError, match="invalid dtype for bias - should match query's dtype"):
        trace(MASK_DTYPE.replace("BACKENDS", "[SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]"), {},
              mode=mode, device=device(SM["T4"]))
    tr = trace(MASK_DTYPE.replace("BACKENDS", "[SDPBackend.MATH]"), {}, mode=mode, device=device(SM["T4"]))
    assert tr.meta.get("sdpa_calls") == 1 and not [e for e in tr.events if "for_cpu" in (e.op or "")]
    tr = trace(MASK_DTYPE.replace("BACKENDS", "[SDPBackend.CUDNN_ATTENTION]"), {}, mode=mode,
               device=device(SM["A100"]))
    assert [e.dtype for e in allocs(tr, op="aten._cudnn_attention_forward")][:1] == ["float16"]


def test_the_target_gpus_architecture_decides():
    src = BLOCK.format(b=2, h=3, l=64, d=64, dtype="torch.float16", p=0.0)
    ops = {}
    for gpu in ("A100", "T4", "K80"):
        tr = trace(src, {}, mode="fake", device=device(SM[gpu]))
        ops[gpu] = {e.op for e in allocs(tr, phase="forward")}
    assert "aten._flash_attention_forward" in ops["A100"]
    assert "aten._efficient_attention_forward" in ops["T4"]
    assert not any("attention" in op for op in ops["K80"])


# --------------------------------------------------------------------------- real-mode values
VALUE_CASES = [(b, c) for b in (MATH, EFF, FLASH, CUDNN) for c in ("plain", "causal", "bool", "float", "d20", "dropout")
               if not (b == FLASH and c in ("bool", "float"))]  # flash takes no mask


@pytest.mark.parametrize("backend,case", VALUE_CASES)
def test_values_and_gradients_match_plain_sdpa(backend, case):
    torch.manual_seed(0)
    d = 20 if case == "d20" else 32
    q, k, v = (torch.randn(2, 3, 17, d, requires_grad=True) for _ in range(3))
    mask = None
    if case == "bool":
        mask = torch.rand(17, 17) > 0.3
        mask[:, 0] = True
    elif case == "float":
        mask = torch.randn(2, 1, 17, 17)
    kw = dict(attn_mask=mask, is_causal=case == "causal", dropout_p=0.25 if case == "dropout" else 0.0)
    torch.manual_seed(1)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    ref_grads = torch.autograd.grad((ref * ref).sum(), (q, k, v))
    torch.manual_seed(1)
    out = sdpa.scaled_dot_product_attention(q, k, v, kw["attn_mask"], kw["dropout_p"], kw["is_causal"],
                                            backend=backend)
    grads = torch.autograd.grad((out * out).sum(), (q, k, v))
    if case == "dropout" and backend == MATH:  # native_dropout draws its mask differently
        assert out.shape == ref.shape
        return
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_gqa_and_scale_values():
    torch.manual_seed(0)
    q = torch.randn(2, 8, 16, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 16, requires_grad=True) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), (q, k, v))
    for backend in (FLASH, MATH):
        out = sdpa.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True, backend=backend)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        for g, r in zip(torch.autograd.grad(out.pow(2).sum(), (q, k, v)), ref_grads):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_real_trace_computes_the_values_of_plain_sdpa():
    src = """
import torch, torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(2, 3, 40, 64, device="cuda", requires_grad=True) for _ in range(3))
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
g = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
ref = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, True)[0]
r = torch.autograd.grad(ref.pow(2).sum(), (q, k, v))
assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(g, r))
"""
    tr = trace(src, {}, mode="real", device=device(SM["3060"]))
    assert allocs(tr, op="aten._efficient_attention_forward")


# --------------------------------------------------------------------------- a GPT-2-sized block
GPT2_BLOCK = """
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, e=768, h=12):
        super().__init__()
        self.h, self.ln1, self.ln2 = h, nn.LayerNorm(e), nn.LayerNorm(e)
        self.c_attn, self.c_proj = nn.Linear(e, 3 * e), nn.Linear(e, e)
        self.mlp = nn.Sequential(nn.Linear(e, 4 * e), nn.GELU(), nn.Linear(4 * e, e))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, l, e = x.shape
        q, k, v = self.c_attn(self.ln1(x)).split(e, dim=2)
        q, k, v = (t.view(b, l, self.h, e // self.h).transpose(1, 2).contiguous() for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)
        x = x + self.drop(self.c_proj(a.transpose(1, 2).contiguous().view(b, l, e)))
        return x + self.drop(self.mlp(self.ln2(x)))

model = nn.Sequential(*[Block() for _ in range(2)]).cuda()
opt = torch.optim.AdamW(model.parameters())
{ctx}
for _ in range(2):
    x = torch.randn(8, 512, 768, device="cuda")
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_gpt2_block_estimate_saves_no_attention_matrix():
    b, h, l = 8, 12, 512
    fused = estimate(GPT2_BLOCK.format(ctx=""), "RTX 3060", namespace={}, mode="fake")
    square = [e for e in fused.trace.events if e.kind == "alloc" and e.shape == (b, h, l, l)]
    assert not square
    assert any(e.op == "aten._efficient_attention_forward" for e in fused.trace.events)
    # the same code forced onto the math backend materialises it, saved for backward
    math_ = estimate(GPT2_BLOCK.format(ctx="torch.backends.cuda.enable_flash_sdp(False); "
                                           "torch.backends.cuda.enable_mem_efficient_sdp(False)"),
                     "RTX 3060", namespace={}, mode="fake")
    square = [e for e in math_.trace.events if e.kind == "alloc" and e.shape == (b, h, l, l)]
    assert any(e.category == "activation" and e.dtype == "float32" for e in square)
    assert any(e.category == "activation" and e.dtype == "bool" for e in square)
    attn_bytes = b * h * l * l * 4
    assert math_.peak_allocated_bytes - fused.peak_allocated_bytes > 2 * attn_bytes
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()  # restored


def test_a_trace_switched_to_another_architecture_says_its_attention_backend_may_differ():
    from xmem_engine.estimate import estimate, estimate_trace

    code = """
import torch
q = torch.randn(2, 4, 128, 64, device="cuda", requires_grad=True)
out = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
out.sum().backward()
"""
    est = estimate(code, "A100-40GB", namespace={})
    assert est.trace.meta["sdpa_calls"] == 1 and est.trace.meta["compute_capability"] == [8, 0]
    assert not any("scaled_dot_product_attention" in n for n in est.notes)
    same_arch = estimate_trace(est.trace, "A100-80GB")
    assert not any("scaled_dot_product_attention" in n for n in same_arch.notes)
    t4 = estimate_trace(est.trace, "T4")
    assert any("compute capability 8.0" in n and "7.5" in n for n in t4.notes)
    assert t4.backend_caveat and est.backend_caveat is None and same_arch.backend_caveat is None
    plain = estimate("import torch\nx = torch.ones(4, device='cuda')\n", "A100-40GB", namespace={})
    assert not any("scaled_dot_product_attention" in n for n in estimate_trace(plain.trace, "T4").notes)


def test_attention_keeps_its_name_and_docstring_while_traced():
    """Libraries read them: Unsloth looks for ``enable_gqa`` in the docstring to know whether it
    may use grouped-query attention, and stopped (``None`` is not iterable) on the tracer's."""
    ns: dict = {}
    trace("import torch.nn.functional as F\nf = F.scaled_dot_product_attention\ndoc, name = f.__doc__, f.__name__\n"
          "d = F.dropout.__doc__\n", ns, mode="fake")
    assert ns["doc"] == F.scaled_dot_product_attention.__doc__ and "enable_gqa" in ns["doc"]
    assert ns["name"] == "scaled_dot_product_attention" and ns["d"] == F.dropout.__doc__
