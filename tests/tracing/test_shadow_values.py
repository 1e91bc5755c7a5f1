"""Fake mode knows the values of small GPU tensors that come from the host (shadow_values.py),
so code that branches on masks, ids or labels stays in fake mode and takes the branch a GPU
takes; unknown values are guessed (guesses.py, tests/tracing/test_guesses.py)."""

from __future__ import annotations

import pytest
import torch

from xmem_engine.trace import Trace
from xmem_engine.tracing import UnsupportedOpError, trace


def alloc_stream(tr: Trace) -> list[tuple[str, int]]:
    return [(e.kind, e.bytes) for e in tr.events if e.kind in ("alloc", "free")]


MASK_BRANCH = """
import torch
ids = torch.tensor([[5, 6, 7, 0], [1, 2, 3, 4]])
mask = (ids != 0).long()
mask_gpu = mask.to("cuda")
if torch.all(mask_gpu == 1):           # Hugging Face's test before it drops the mask
    branch = "no padding"
    bias = None
else:
    branch = "padding"
    bias = (1.0 - mask_gpu[:, None, None, :].float()) * -1e9
n_real = int(mask_gpu.sum().item())
first_pad = mask_gpu.view(-1).nonzero()[0].tolist()
where = torch.nonzero(mask_gpu == 0)
x = torch.randn(2, 4, 8, device="cuda")
y = x * mask_gpu[..., None]
"""


def test_a_branch_on_a_host_mask_stays_in_fake_mode_and_sees_the_real_values():
    ns: dict = {}
    tr = trace(MASK_BRANCH, ns, mode="auto")
    assert tr.mode == "fake" and "fallback" not in tr.meta and "guesses" not in tr.meta
    assert ns["branch"] == "padding" and ns["n_real"] == 7 and ns["first_pad"] == [0]
    real_ns: dict = {}
    real = trace(MASK_BRANCH, real_ns, mode="real")
    assert {k: ns[k] for k in ("branch", "n_real", "first_pad")} == {k: real_ns[k] for k in ("branch", "n_real", "first_pad")}
    assert alloc_stream(tr) == alloc_stream(real)  # nonzero's output has the real shape
    where = [e for e in tr.events if e.kind == "alloc" and "nonzero" in e.op]
    assert [e.shape for e in where][-1] == (1, 2)


def test_the_other_branch_is_taken_when_the_values_say_so():
    ns: dict = {}
    tr = trace(MASK_BRANCH.replace("[5, 6, 7, 0]", "[5, 6, 7, 8]"), ns, mode="auto")
    assert tr.mode == "fake" and ns["branch"] == "no padding" and ns["n_real"] == 8


def test_in_place_ops_on_known_values_keep_them_in_step():
    src = """
import torch
m = torch.zeros(6, dtype=torch.long).cuda()
m[2:4] = 1
m.add_(torch.arange(6, device="cuda"))
total = m.sum().item()
"""
    ns: dict = {}
    assert trace(src, ns, mode="fake").mode == "fake"
    assert ns["total"] == 0 + 1 + 3 + 4 + 4 + 5


@pytest.mark.parametrize("unknown", [
    "m.copy_(torch.randn(6, device='cuda') > 0)",         # random values written in
    "m.mul_((w.sum() > 0).long())",                        # a value computed from a parameter
])
def test_writing_unknown_values_forgets_the_shadow(unknown):
    src = f"""
import torch
w = torch.nn.Parameter(torch.randn(4, device="cuda"))
m = torch.ones(6, dtype=torch.long).cuda()
{unknown}
if m.any():
    hit = True
"""
    tr = trace(src, {}, mode="fake")
    # no longer known: the value is a guess (the last known one: ones), and says so
    assert [(g["what"], g["value"], g["where"]) for g in tr.meta["guesses"]] == [("bool(tensor)", "True", "<cell>:6")]


def test_random_gpu_tensors_and_big_transfers_stay_unknown():
    rand = "import torch\nx = torch.randint(0, 2, (4,), device='cuda')\nif x.sum() > 0:\n    pass\n"
    big = ("import torch\nx = torch.ones(300_000).cuda()\n"  # 1.2 MB: beyond SHADOW_BYTES
           "if x.sum() > 0:\n    pass\n")
    for src in (rand, big):
        tr = trace(src, {}, mode="auto")
        assert tr.mode == "fake" and [g["where"] for g in tr.meta["guesses"]] == ["<cell>:3"]


def test_shadows_use_no_random_numbers_of_the_user():
    # (random GPU factories draw nothing in fake mode, so the cell has none)
    src = MASK_BRANCH.split("x = torch.randn")[0] + "after = torch.rand(3).tolist()\n"
    torch.manual_seed(0)
    ns: dict = {}
    trace(src, ns, mode="fake")
    torch.manual_seed(0)
    real_ns: dict = {}
    trace(src, real_ns, mode="real")
    assert ns["after"] == real_ns["after"]


def test_shadows_go_with_their_storages():
    src = """
import torch
for _ in range(50):
    m = torch.arange(1000).cuda()
    ok = bool((m >= 0).all())
"""
    from xmem_engine.tracing import tracer as tracer_mod

    seen = []
    orig = tracer_mod.Tracer.finish

    def finish(self):
        seen.append(len(self.shadows) if self.shadows is not None else None)
        return orig(self)

    tracer_mod.Tracer.finish = finish
    try:
        trace(src, {}, mode="fake")
    finally:
        tracer_mod.Tracer.finish = orig
    assert seen and seen[0] is not None and seen[0] <= 6  # the last iteration's, not 50 of each


ISIN_CASES = [
    (torch.arange(1000), torch.tensor([2])),                                   # generate(): vocabulary vs stop tokens
    (torch.arange(10).float(), torch.tensor([2, 5])),                          # promoted to float
    (torch.tensor([1.0, float("nan")]), torch.tensor([float("nan")])),         # NaN is in nothing
    (torch.arange(6).view(2, 3), torch.tensor([[1], [4]], dtype=torch.int32)),  # any shapes
    (torch.tensor(3), torch.tensor([3])),                                      # a 0-d tensor
    (torch.arange(5, dtype=torch.uint8), torch.tensor([2.5, 3.0])),
    (torch.arange(20), torch.arange(9)),                                       # more than a few: isin itself
]


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("elements,test_elements", ISIN_CASES)
def test_the_shadows_isin_gives_isins_values(elements, test_elements, invert):
    from xmem_engine.tracing.fake.shadow_values import _isin_few

    got = _isin_few(elements, test_elements, invert=invert)
    want = torch.isin(elements, test_elements, invert=invert)
    assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)


def test_a_known_isin_in_fake_mode_has_the_real_values():
    src = """
import torch
vocab = torch.arange(50, device="cuda")
stop = torch.tensor([2, 7], device="cuda")
hits = int(torch.isin(vocab, stop).sum())
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["hits"] == 2 and "guesses" not in tr.meta


def test_a_parameters_cast_copy_is_not_computed_for_real(monkeypatch):
    """Autocast casts each weight again every forward; a weight made on the host is small and
    known, and its cast was computed for real each time (11% of a GRPO trace: 256 generated
    tokens are 256 forwards). A parameter's copy feeds matmuls with activations, never known:
    it gets no shadow. Other known tensors' casts still do (ids, masks)."""
    from xmem_engine.tracing.fake import shadow_values

    computed: list = []

    class Spy(dict):
        def get(self, func, default=None):
            computed.append(str(func))
            return super().get(func, default)

    monkeypatch.setattr(shadow_values, "_SHADOW_KERNELS", Spy(shadow_values._SHADOW_KERNELS))
    src = """
import torch
lin = torch.nn.Linear(8, 4)
with torch.no_grad():
    lin.weight.fill_(0.5); lin.bias.fill_(0.25)   # known values (a checkpoint's are too)
lin = lin.cuda()
nonzero = int((lin.weight.detach() != 0).sum().item())
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = lin(torch.randn(2, 8, device="cuda"))
mask = torch.tensor([1, 0, 1], device="cuda").to(torch.float16)
n = int(mask.sum().item())
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["nonzero"] == 32 and ns["n"] == 2 and "guesses" not in tr.meta  # the weights and the mask known
    # computed for real: the mask's cast and the two host-to-GPU copies, not autocast's casts of the weights
    assert computed.count("aten._to_copy.default") == 3, computed


def test_factories_shaped_like_an_unknown_tensor_are_known():
    """``torch.ones_like(input_ids)`` (an attention mask for "no padding") reads only the shape of
    random ids: its values are known, and so is ``torch.all(mask == 1)``."""
    ns: dict = {}
    tr = trace("import torch\n"
               "ids = torch.randint(0, 100, (4, 16), device='cuda')\n"
               "mask = torch.ones_like(ids)\n"
               "zeros = torch.zeros_like(ids, dtype=torch.float32)\n"
               "full = torch.full_like(ids, 7)\n"
               "ok = bool(torch.all(mask == 1)) and float(zeros.sum()) == 0 and int(full.max()) == 7\n"
               "rand = torch.rand_like(zeros)\n"
               "guessed = bool(rand.sum() > 0)\n", ns, mode="fake")
    assert ns["ok"]
    assert [g["where"] for g in tr.meta["guesses"]] == ["<cell>:8"]  # only the random one is guessed
