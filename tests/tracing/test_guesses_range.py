"""Guessed values stay in their dtype's range (issue #31, item 6).

A guess is made from ones (guesses.py): a sum over 65,536 fp16 elements is guessed to be
65,536, which fp16 cannot hold. Written into an fp16 tensor it was the real kernel's error
(``value cannot be converted to type c10::Half without overflow``): fp16 autocast with a
GradScaler failed from the batch size at which a bias gradient sums 65,536 rows. A guess now
saturates at the dtype's largest finite value."""

from __future__ import annotations

import math

import pytest
import torch

from xmem_engine.estimate import estimate
from xmem_engine.tracing import trace
from xmem_engine.tracing.fake.placeholders import FakeFloat, in_range, placeholder


@pytest.mark.parametrize("dtype, value, expected", [
    (torch.float16, 65_536.0, 65_504.0),
    (torch.float16, -1e9, -65_504.0),
    (torch.float16, math.inf, 65_504.0),
    (torch.float16, 3.0, 3.0),
    (torch.bfloat16, 1e39, torch.finfo(torch.bfloat16).max),
    (torch.float8_e4m3fn, 1_000.0, 448.0),
    (torch.float8_e5m2, 65_536.0, 57_344.0),
    (torch.int8, 300, 127),
    (torch.int8, -300, -128),
    (torch.uint8, -5, 0),
    (torch.uint8, 1_000.0, 255),
    (torch.int32, 2**40, 2**31 - 1),
    (torch.bool, 2, True),
    (torch.bool, 0.0, False),
    (torch.float32, 65_536.0, 65_536.0),
])
def test_a_guess_is_brought_into_its_dtypes_range(dtype, value, expected):
    got = in_range(value, dtype)
    assert got == expected and type(got) is type(expected)
    if dtype != torch.bool:  # the real kernel takes it
        assert torch.full((3,), got, dtype=dtype).double().tolist() == [float(expected)] * 3


def test_nan_stays_nan_for_floats_and_a_guessed_number_is_not_used_by_the_check():
    assert math.isnan(in_range(math.nan, torch.float16))
    uses: list = []
    guess = FakeFloat(1e6)
    guess.on_use = lambda what, result: uses.append(what) or result
    assert in_range(guess, torch.float16) == 65_504.0
    assert uses == []  # clamping a guess is not a use of it
    n = placeholder(torch.float16, 70_000.0)
    assert float(n) == 65_504.0 and isinstance(n, FakeFloat)


PRE = """
import torch
w = torch.nn.Parameter(torch.randn(512, 256, device="cuda"))
big = w.half() @ torch.ones(256, 512, device="cuda", dtype=torch.float16)   # 512 x 512 fp16, unknown
"""


@pytest.mark.parametrize("src, expected", [
    # a reduction of ones over 1M fp16 elements: 65,504, finite (the step is taken)
    ("s = big.repeat(4, 1).sum()\nok = bool(torch.isfinite(s))\nvalue = float(s)", (True, 65_504.0)),
    # a dim reduction (a bias gradient under autocast): written as a full tensor of the guess
    ("s = big.repeat(256, 1).sum(0, keepdim=True)\nok = bool(torch.isfinite(s).all())\nvalue = float(s[0, 0])",
     (True, 65_504.0)),
    # a guess from fp32 written into a small fp16 / float8 tensor with fill_
    ("v = big.float().sum().item()\nt = torch.zeros(4, dtype=torch.float16, device='cuda').fill_(v)\n"
     "ok = bool(torch.isfinite(t).all())\nvalue = float(t[0])", (True, 65_504.0)),
    ("v = big.float().sum().item()\nt = torch.zeros(4, device='cuda').to(torch.float8_e4m3fn)\nt.fill_(v)\n"
     "ok = True\nvalue = float(t.float()[0])", (True, 448.0)),
    # an int8 sum of ones (dtype kept): saturated, not wrapped
    ("q = (big > 0).to(torch.int8)\nc = q.repeat(300, 1).sum(dtype=torch.int8)\nok = True\nvalue = int(c)",
     (True, 127)),
])
def test_guessed_values_written_into_narrow_dtypes_fit(src, expected):
    ns: dict = {}
    trace(PRE + src, ns, mode="fake")
    assert (ns["ok"], ns["value"]) == expected


def test_a_literal_the_dtype_cannot_hold_is_still_the_kernels_error():
    src = "import torch\nt = torch.zeros(4, dtype=torch.float16, device='cuda').fill_(1e6)\n"
    with pytest.raises(RuntimeError, match="without overflow"):
        trace(src, {}, mode="fake")


AMP_STEP = """
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda()
opt = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(ROWS, 32, device="cuda")
y = torch.randn(ROWS, 8, device="cuda")
steps = 0
for _ in range(2):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()          # fp16 bias gradients: sums over ROWS rows
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    steps += 1
scale = scaler.get_scale()
"""


@pytest.mark.parametrize("rows", [4_096, 70_000, 300_000])
def test_fp16_autocast_with_a_grad_scaler_at_batches_where_a_sum_of_ones_overflows(rows):
    """The T4 notebook's setup (fp16, no bf16): it traced at small batches only."""
    ns: dict = {}
    src = AMP_STEP.replace("ROWS", str(rows))
    tr = trace(src, ns, mode="fake")
    assert tr.mode == "fake" and ns["steps"] == 2
    assert ns["scale"] == 65_536.0  # no overflow was guessed: the scale was not backed off
    # the optimizer stepped: AdamW's two moments of every parameter were allocated
    params = sum(p.numel() for p in
                 torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)).parameters())
    state = sum(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "optimizer_state")
    assert state >= 2 * params * 4
    est = estimate(src, "T4", mode="fake")
    assert est.breakdown["optimizer_state"] >= 2 * params * 4

