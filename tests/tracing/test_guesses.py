"""Fake mode keeps going where code reads values nobody has (guesses.py): values are guessed
from the op chain with ones at its unknown leaves, data-dependent sizes take their upper
bound, and each guess is noted with its line."""

from __future__ import annotations

import sysconfig

import pytest
import torch

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.estimate import estimate
from xmem_engine.tracing import UnsupportedOpError, trace
from xmem_engine.tracing.fake import guesses

GUARDED_STEP = """
import torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(8, 16, device="cuda")
y = torch.randint(0, 4, (8,), device="cuda")
skipped = 0
for step in range(3):
    loss = F.cross_entropy(model(x), y)
    if torch.isnan(loss) or torch.isinf(loss):   # guessed: finite
        skipped += 1
        continue
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if not torch.isfinite(norm).all():          # guessed: finite
        skipped += 1
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_a_guarded_training_step_is_guessed_onto_the_path_a_gpu_takes():
    ns: dict = {}
    fake = trace(GUARDED_STEP, ns, mode="auto")
    assert fake.mode == "fake" and "fallback" not in fake.meta and ns["skipped"] == 0
    lines = {(g["what"], g["value"], g["where"], g["count"]) for g in fake.meta["guesses"]}
    assert lines == {("bool(tensor)", "False", "<cell>:13", 6), ("bool(tensor)", "True", "<cell>:18", 3)}
    real = trace(GUARDED_STEP, {}, mode="real")
    assert alloc_stream(fake) == alloc_stream(real)


def test_a_loop_on_a_guessed_value_is_not_guessed(monkeypatch):
    monkeypatch.setattr(guesses, "LOOP_LIMIT", 50)
    src = """
import torch
big = torch.rand(300_000, device="cuda") + 1     # too big to stand in for: its max is guessed
halvings = 0
while big.max() > 1e-3:
    big = big * 0.5
    halvings += 1
"""
    with pytest.raises(UnsupportedOpError, match="loop") as ei:
        trace(src, {}, mode="fake")
    assert "bool(tensor) at <cell>:5" in str(ei.value)
    ns: dict = {}
    tr = trace(src, ns, mode="auto")
    assert tr.mode == "real" and "loop" in tr.meta["fallback"] and 10 <= ns["halvings"] <= 12


@pytest.mark.parametrize("site", [
    "/opt/env/site-packages",
    # where pip puts a library in this very environment (inside a venv's platstdlib)
    sysconfig.get_paths()["purelib"],
])
def test_a_guess_inside_a_library_names_both_lines(site):
    lib_src = "def get_lr(rms, eps=1e-3):\n    return max(eps, rms)\n"
    lib: dict = {}
    exec(compile(lib_src, f"{site}/somelib/optim.py", "exec"), lib)
    src = """
import torch
w = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
rms = w.norm(2) / 64
lr = get_lr(rms)
"""
    tr = trace(src, {"get_lr": lib["get_lr"]}, mode="fake")
    (g,) = tr.meta["guesses"]
    assert (g["what"], g["value"], g["where"], g["inside"]) == ("bool(tensor)", "True", "<cell>:5", "somelib/optim.py:2")
    assert any("at <cell>:5 (in somelib/optim.py:2)" in n for n in tr.meta["notes"])


def test_constant_initialisers_make_small_parameters_known():
    src = """
import torch
import torch.nn as nn
b = nn.Parameter(torch.empty(4, device="cuda"))
nn.init.zeros_(b)
g = nn.Parameter(torch.empty(4, device="cuda"))
g.data.fill_(2.0)
zero_bias = not bool(b.abs().sum() > 0)
total = (g * 2).sum().item()
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["zero_bias"] is True and ns["total"] == 16.0 and "guesses" not in tr.meta


@pytest.mark.parametrize("call, shapes", [
    ("torch.unique(x)", [(64,)]),
    ("torch.unique(x, return_inverse=True, return_counts=True)", [(64,), (8, 8), (64,)]),
    ("torch.unique_consecutive(x, return_counts=True)", [(64,), (64,)]),
    ("torch.unique(x, dim=0, return_inverse=True)", [(8, 8), (8,)]),
    ("torch.masked_select(x, x > 0)", [(64,)]),
    ("torch.where(x > 0)", [(64,), (64,)]),
    ("x[(x > 0).any(1)]", [(8, 8)]),
])
def test_data_dependent_sizes_take_their_upper_bound(call, shapes):
    src = f"import torch\nx = torch.randn(8, 8, device='cuda') @ torch.randn(8, 8, device='cuda')\nout = {call}\n" \
          "out = out if isinstance(out, tuple) else (out,)\nshapes = [tuple(t.shape) for t in out]\n"
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["shapes"] == shapes
    assert {g["kind"] for g in tr.meta["guesses"]} == {"size"} and tr.meta["guesses"][0]["where"] == "<cell>:3"


def test_guesses_reach_the_estimate_notes():
    est = estimate(GUARDED_STEP, "A100-40GB")
    assert est.mode == "fake"
    assert guesses.GUESS_HEADLINE in est.notes
    assert any(n.startswith("guessed bool(tensor) = False at <cell>:13") for n in est.notes)
    out = est.to_json()["guesses"]
    assert {(g["where"], g["count"], g["kind"]) for g in out} == {("<cell>:13", 6, "value"), ("<cell>:18", 3, "value")}


def test_values_known_from_the_host_are_not_guesses():
    src = """
import torch
labels = torch.tensor([0, 1, 1, 0]).cuda()
if (labels == 1).sum() == 2:
    both = True
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["both"] is True and "guesses" not in tr.meta


def test_a_known_mask_selects_exactly_from_unknown_values():
    """TRL's fused loss scores hidden_states[labels != -100]: the labels come from the host, so
    the selection's size is known although the hidden states are not (before: every element,
    a guess)."""
    src = """
import torch
labels = torch.full((4, 100), -100)
labels[:, 60:] = 7
labels = labels.cuda()
h = torch.randn(4, 100, 512, device="cuda") @ torch.randn(512, 512, device="cuda")
shape = tuple(h[labels != -100].shape)
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["shape"] == (160, 512) and "guesses" not in tr.meta
    assert any(e.kind == "alloc" and e.bytes == 160 * 512 * 4 and e.op == "aten.index.Tensor" for e in tr.events)


def test_a_guessed_number_notes_each_use_once_and_stays_a_number():
    from xmem_engine.tracing.fake.placeholders import FakeFloat, FakeInt, placeholder

    used: list[str] = []
    n = placeholder(torch.int64, 3, lambda what, value: (used.append(what), value)[1])
    assert isinstance(n, FakeInt) and n + 1 == 4 and f"{n:d}" == "3"  # arithmetic and format: no note
    assert used == []  # n + 1 is a plain int: comparing it decides nothing about n
    used.clear()
    assert int(n) == 3 and n > 2 and bool(n)
    assert used == ["int(Tensor.item())", "Tensor.item() in a comparison", "Tensor.item() in a condition"]
    f = placeholder(torch.float32, 2.5, lambda what, value: value)
    assert isinstance(f, FakeFloat) and round(f) == 2 and round(f, 1) == 2.5 and int(f) == 2
    with pytest.raises(BaseException, match="control flow"):
        bool(FakeFloat(1.0))  # no on_use: a value fake mode needs and does not have


def test_a_guessed_number_is_copied_as_itself_and_pickled_as_a_plain_number():
    """``dataclasses.asdict`` deep-copies floats it does not know (a Trainer's log_history at each
    checkpoint): a copy must not reach through ``on_use`` into the trace's FakeTensorMode, whose
    copied StorageWeakRefs free a weak reference twice (Unsloth's SFT run crashed at GC)."""
    import copy
    import dataclasses
    import pickle

    from xmem_engine.tracing.fake.placeholders import FakeFloat, FakeInt, placeholder

    class Owner:  # stands for the trace's guesses: copying it is the bug
        def __deepcopy__(self, memo):
            raise AssertionError("the guesses were copied")

        def on_use(self, what, value):
            return value

    loss = placeholder(torch.float32, 0.5, Owner().on_use)
    step = placeholder(torch.int64, 7, Owner().on_use)

    @dataclasses.dataclass
    class State:
        log_history: list

    state = dataclasses.asdict(State([{"loss": loss, "step": step}]))
    assert state["log_history"][0]["loss"] is loss and copy.copy(step) is step
    assert copy.deepcopy([loss, step]) == [loss, step]
    back = pickle.loads(pickle.dumps({"loss": loss, "step": step}))
    assert back == {"loss": 0.5, "step": 7}
    assert type(back["loss"]) is float and type(back["step"]) is int
    assert not isinstance(back["loss"], FakeFloat) and not isinstance(back["step"], FakeInt)


def test_writing_a_guessed_number_as_json_is_not_a_use():
    """``json.dumps(..., indent=2)`` (a Trainer's ``trainer_state.json``) compares each float with
    itself and with infinity to spell NaN: formatting, not control flow, so no guess is noted."""
    import json

    from xmem_engine.tracing.fake.placeholders import placeholder

    used: list[str] = []
    loss = placeholder(torch.float32, 0.5, lambda what, value: (used.append(what), value)[1])
    assert json.dumps({"loss": loss, "log": [loss]}, indent=2, sort_keys=True).count("0.5") == 2
    assert used == []
    assert loss > 0.1 and used == ["Tensor.item() in a comparison"]  # the code's own comparison still is


def test_a_dead_storage_s_symbolic_guess_is_not_the_next_one_s_at_its_address():
    """Guesses are keyed by storage address. A sum over a symbolic batch (pinned when read)
    that dies must take that mark with it: the allocator may put the next small storage, a
    loss read with ``.item()``, at the same address. Kept, the mark fixed the batch in a
    quarter of the runs of test_symbolic_batch's CNN."""
    from xmem_engine.tracing.fake.shadow_values import Shadows

    g = guesses.Guesses(Shadows(), fake_mode=None)
    summed = torch.zeros(1).untyped_storage()
    key = summed._cdata
    g._keep(summed, key, torch.ones(1).untyped_storage(), symbolic=True)
    assert key in g.from_symbol
    del summed
    assert key not in g.from_symbol and key not in g.stale
    loss = torch.zeros(1).untyped_storage()  # a storage that is no sum over the batch, at that address
    g._keep(loss, key, torch.ones(1).untyped_storage())
    assert key not in g.from_symbol


METRICS_STEP = """
import numpy as np
import torch
model = torch.nn.Linear(256, 4096).cuda()
logits = model(torch.randn(512, 256, device="cuda"))   # 8 MiB of predictions: too big to stand in for
preds = logits.detach().cpu().numpy()                   # as a Trainer's eval loop hands them to compute_metrics
labels = np.zeros(512, dtype=np.int64)
accuracy = float((preds.argmax(-1) == labels).mean())
preds[preds < 0] = 0                                    # metrics code writes into them too
shape, dtype = preds.shape, str(preds.dtype)
kept = logits * 2
"""


def test_numpy_of_a_large_unknown_tensor_is_zeros_and_stays_in_fake_mode():
    ns: dict = {}
    fake = trace(METRICS_STEP, ns, mode="auto")
    assert fake.mode == "fake" and "fallback" not in fake.meta
    assert (ns["shape"], ns["dtype"], ns["accuracy"]) == ((512, 4096), "float32", 1.0)
    (g,) = [g for g in fake.meta["guesses"] if g["what"].startswith("Tensor.numpy()")]
    assert (g["where"], g["kind"]) == ("<cell>:6", "rule") and g["value"].startswith("zeros (512 x 4096, float32")
    assert alloc_stream(fake) == alloc_stream(trace(METRICS_STEP, {}, mode="real"))


def test_a_guessed_number_brings_no_warning_of_xmems_own():
    """``float(loss)`` of a guess is a FakeFloat (a float subclass): Python's DeprecationWarning
    about ``__float__`` returning a subclass named xmem's type at the user's line."""
    import warnings

    code = ("import torch\nm = torch.nn.Linear(4, 4).cuda()\ny = m(torch.randn(2, 4, device='cuda')).sum()\n"
            "v = float(y.detach()) + int(y.detach())\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace(code, {}, mode="fake")
    assert not [str(w.message) for w in caught if "Fake" in str(w.message)]


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_warning_from_reading_a_number_names_the_users_line(mode):
    """A C++ warning names the innermost Python frame: on a GPU the code's ``float(loss)``,
    under the tracer its mode's method (``xmem_engine/tracing/device_mode.py``) did. torch warns
    once a process: each mode in a fresh one."""
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import warnings
from xmem_engine.tracing import trace
cell = "import torch\\nm = torch.nn.Linear(4, 4).cuda()\\nloss = m(torch.randn(2, 4, device='cuda')).sum()\\nv = float(loss)\\n"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trace(cell, {{}}, mode={mode!r})
print([(w.filename, w.lineno) for w in caught if "to a scalar" in str(w.message)])
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[('<cell>', 4)]"  # (torch 2.10 to 2.14 warn of it)


def test_float_of_an_integer_or_bool_tensor_is_a_float():
    # PyTorch's pruning tutorial: float(torch.sum(w == 0)) / w.nelement(); a guessed count was
    # an int, which float() refuses ("__float__ returned non-float (type FakeInt)")
    src = """
import torch
w = torch.nn.Linear(256, 256).cuda().weight
zeros = float(torch.sum(w == 0))
flag = float(w.abs().max() > 1)
count = int(torch.sum(w > 0))
kinds = type(zeros).__mro__[-2].__name__, type(flag).__mro__[-2].__name__, type(count).__mro__[-2].__name__
"""
    ns: dict = {}
    trace(src, ns, mode="fake")
    assert ns["kinds"] == ("float", "float", "int")
