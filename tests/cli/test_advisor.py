"""`xmem advise`: each lever measured on the step, and the change it names, made by hand in the
script, estimated to fit (a CNN, a transformer, an LSTM on an 8 GB RTX 4060)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xmem_engine.advisor import advise, repeated_blocks
from xmem_engine.estimate import estimate_script

SCRIPTS = Path(__file__).resolve().parents[1] / "advise_scripts"
GPU = "RTX-4060-8GB"


def by_hand(lever: str, detail: str) -> tuple[dict[str, str], str | None]:
    """The script's own switches for a lever's change (what a user edits), and the allocator setting."""
    if lever.startswith("autocast "):
        return {"AMP": "True", "AMP_DTYPE": repr(lever.split()[1])}, None
    if lever == "activation checkpointing":
        return {"CKPT": "True"}, None
    if lever.startswith("gradient accumulation x"):
        return {"ACCUM": lever.rsplit("x", 1)[1]}, None
    if lever == "expandable segments":
        return {}, "expandable_segments:True"
    if lever == "largest batch that fits":
        return {"batch_size": detail.rsplit("= ", 1)[1]}, None
    if lever == "torch.compile":  # the CNN's (a CUDA build of torch compiles it)
        return {"COMPILE": "True"}, None
    raise AssertionError(f"no hand-made version of {lever!r} in these scripts")


@pytest.mark.slow
@pytest.mark.parametrize("name, batch_var", [("cnn", "batch_size"), ("transformer", "batch_size"), ("lstm", "batch_size")])
def test_the_cheapest_change_made_by_hand_fits(name, batch_var):
    script = str(SCRIPTS / f"{name}.py")
    advice = advise(script, GPU, batch_var=batch_var)
    assert not advice.baseline.fits
    for m in advice.levers:  # every lever measured, or said why not
        assert m.error == "" and (m.peak_device_bytes > 0 or (not m.applicable and m.detail)), m
    assert advice.combination, advice.summary()
    overrides, conf = {}, None
    for lever in advice.combination:
        detail = next(m.detail for m in advice.levers if m.lever.name == lever)
        ov, c = by_hand(lever, detail)
        overrides.update(ov)
        conf = c or conf
    est = estimate_script(script, GPU, overrides=overrides, alloc_conf=conf)
    assert est.fits, (advice.combination, est.headline)
    # measured by patching, made by hand: the same change, peaks within 15% of each other (with
    # accumulation the hand-made loop runs every micro-batch, and the cache fills more: advisor.py)
    assert abs(est.peak_device_bytes - advice.combination_peak_bytes) <= 0.15 * est.peak_device_bytes
    text = advice.summary()
    assert "cheapest change that fits: " in text and advice.combination[0] in text


def test_repeated_blocks_are_the_model_s_layers():
    gpt = torch.nn.Module()
    gpt.emb = torch.nn.Embedding(10, 4)
    gpt.body = torch.nn.Module()
    gpt.body.h = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    assert repeated_blocks(gpt) == list(gpt.body.h)
    cnn = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.ReLU()),
                              torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1)), torch.nn.Flatten())
    assert repeated_blocks(cnn) == [cnn[0], cnn[1]]  # the parameter-free Flatten is not a block
    assert repeated_blocks(torch.nn.LSTM(4, 4)) == []


def test_the_largest_batch_lever_traces_once_with_the_batch_a_symbol(monkeypatch):
    import xmem_engine.batch_family as bf

    made = []
    real = bf.symbolic_family
    monkeypatch.setattr(bf, "symbolic_family", lambda path, var, v, **kw: made.append(v) or real(path, var, v, **kw))
    script = str(SCRIPTS / "transformer.py")
    advice = advise(script, GPU, batch_var="batch_size")
    lever = next(m for m in advice.levers if m.lever.name == "largest batch that fits")
    v = int(lever.detail.rsplit("= ", 1)[1])
    assert len(made) == 1  # one trace for the whole search (the script does not branch on the batch)
    fits = [estimate_script(script, GPU, overrides={"batch_size": str(b)}).fits for b in (v, v + 1)]
    assert fits == [True, False]


def test_cli_advise_json(capsys):
    from xmem_engine.cli import main

    code = main(["advise", str(SCRIPTS / "transformer.py"), "--gpu", GPU, "--batch-var", "batch_size", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"] is False and out["combination"]
    names = [lv["lever"] for lv in out["levers"]]
    assert {"expandable segments", "activation checkpointing", "gradient accumulation x2", "largest batch that fits"} <= set(names)
    assert main(["advise", str(SCRIPTS / "transformer.py"), "--gpu", GPU, "--batch-var", "seq_len"]) == 2


def test_a_step_that_checkpoints_itself_is_not_checkpointed_again():
    """Wrapping blocks a step already checkpoints would checkpoint them twice (a recompute
    mismatch on the GPU as here): the lever says n/a instead."""
    script = str(SCRIPTS / "transformer.py")
    advice = advise(script, GPU, overrides={"CKPT": "True", "batch_size": "2"})
    ckpt = next(m for m in advice.levers if m.lever.name == "activation checkpointing")
    assert not ckpt.applicable and "checkpoints already" in ckpt.detail and not ckpt.error, ckpt


TRANSFORMERS_LIKE = '''
import functools
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint


class Model(nn.Module):
    """What the lever needs of a transformers PreTrainedModel: its own checkpointing switch.
    Its layers also append to a cache, as a KV cache does while use_cache is on: wrapping them
    in checkpoint() from outside would extend it again in the recomputation."""
    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
                                    for _ in range(6))
        self.is_gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self._ckpt = functools.partial(checkpoint, **(gradient_checkpointing_kwargs or {}))
        self.is_gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.is_gradient_checkpointing = False

    def forward(self, x):
        cache = []
        for layer in self.layers:
            use_cache = not self.is_gradient_checkpointing
            step = (lambda h, layer=layer: layer(h)) if not use_cache else \\
                (lambda h, layer=layer: cache.append(h.shape) or layer(h))
            x = self._ckpt(step, x) if self.is_gradient_checkpointing else step(x)
        return x


model = Model().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 512, 1024, device="cuda")
model(x).sum().backward()
opt.step()
'''


def test_a_transformers_model_is_checkpointed_its_own_way(tmp_path):
    script = tmp_path / "hf_like.py"
    script.write_text(TRANSFORMERS_LIKE)
    advice = advise(str(script), GPU)
    ckpt = next(m for m in advice.levers if m.lever.name == "activation checkpointing")
    assert ckpt.applicable and not ckpt.error, ckpt
    assert ckpt.change.startswith("model.gradient_checkpointing_enable(")
    assert ckpt.peak_device_bytes < 0.7 * advice.baseline.peak_device_bytes
    row = advice.levers.index(ckpt)
    assert json.loads(json.dumps(advice.to_json()))["levers"][row]["change"] == ckpt.change


def test_a_warning_of_the_script_is_shown_once_not_once_per_lever(tmp_path):
    # issue #35 item 6: every lever re-runs the script, and its own warning came 7 times
    import warnings

    script = tmp_path / "warns.py"
    script.write_text("import torch, warnings\nwarnings.warn('from the script itself')\n"
                      "model = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.Adam(model.parameters())\n"
                      "for _ in range(2):\n    model(torch.randn(8, 64, device='cuda')).sum().backward()\n"
                      "    opt.step()\n    opt.zero_grad()\n")
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
        advice = advise(str(script), GPU)
    assert len(advice.levers) > 3  # the script ran once per lever
    assert shown.count("from the script itself") == 1, shown


@pytest.mark.parametrize("knobs, expected", [
    ({"batch_size": 32, "lr": 3e-4}, "batch_size"), ({"bs": 8}, "bs"), ({"batch": 16, "epochs": 3}, "batch"),
    ({"batch": 16, "batch_size": 32}, None),  # two: the user says which (--batch-var)
    ({"batch_size": 0}, None), ({"batch_size": True}, None), ({"batch_size": "32"}, None), ({"width": 64}, None)])
def test_the_batch_variable_is_inferred_only_from_one_obvious_name(knobs, expected):
    from xmem_engine.overrides import infer_batch_var

    assert infer_batch_var(knobs) == expected


def test_cli_advise_infers_the_batch_variable_and_says_so(tmp_path, capsys):
    from xmem_engine.cli import main

    script = tmp_path / "train.py"
    script.write_text("import torch\nbatch = 16\nmodel = torch.nn.Linear(256, 256).cuda()\n"
                      "opt = torch.optim.Adam(model.parameters())\nfor _ in range(2):\n"
                      "    model(torch.randn(batch, 256, device='cuda')).sum().backward()\n"
                      "    opt.step()\n    opt.zero_grad()\n")
    assert main(["advise", str(script), "--gpu", "T4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch_var"] == "batch" and out["batch"] == 16 and out["batch_var_inferred"] is True
    assert any(lv["lever"] == "gradient accumulation x2" for lv in out["levers"])


# ------------------------------------------------------------------ costs in one unit (issue #35 item 3)

def test_levers_are_ranked_by_the_stated_rule_accumulation_before_checkpointing():
    """Accumulation x2 (no extra FLOPs, two micro-steps) is cheaper than checkpointing (one extra
    forward: about +33% compute); changes to what is trained come last; every cost is printed in
    one unit first, extra compute."""
    from xmem_engine.advisor import levers
    from xmem_engine.advisor_cost import RANKING
    from xmem_engine.estimate import resolve_gpu

    order = [lv.name for lv in levers(resolve_gpu(GPU), "batch_size")]
    assert order.index("gradient accumulation x2") < order.index("gradient accumulation x4") \
        < order.index("activation checkpointing") < order.index("Adafactor instead of Adam(W)")
    assert order[-2:] == ["Adafactor instead of Adam(W)", "largest batch that fits"] or \
        order[-2:] == ["largest batch that fits", "Adafactor instead of Adam(W)"]
    keys = [lv.cost.key() for lv in levers(resolve_gpu(GPU), "batch_size")]
    assert keys == sorted(keys)
    by = {lv.name: lv.cost for lv in levers(resolve_gpu(GPU), "batch_size")}
    assert by["activation checkpointing"].extra_compute_pct == 33 and by["gradient accumulation x2"].micro_steps == 2
    assert by["gradient accumulation x2"].extra_compute_pct == 0 and not by["gradient accumulation x2"].training
    assert all(c.text.startswith(f"+{'~' if c.extra_compute_pct else ''}{c.extra_compute_pct}% compute")
               for c in by.values())
    assert by["gradient accumulation x2"].text.startswith("+0% compute; 2 micro-steps per optimizer step")
    assert RANKING.count(". ") == 0 and RANKING.endswith(".")  # one sentence


def test_the_cheapest_change_that_fits_is_accumulation_when_checkpointing_fits_too():
    from xmem_engine.advisor import Advice, Measured, _combine, levers
    from xmem_engine.advisor_cost import RANKING
    from xmem_engine.estimate import estimate, resolve_gpu

    base = estimate("import torch\nx = torch.empty(1 << 20, device='cuda')\n", GPU, namespace={}, mode="fake")
    advice = Advice(base, batch_var="batch_size", batch=64)
    for lv in levers(resolve_gpu(GPU), "batch_size"):
        fits = lv.name in ("activation checkpointing", "gradient accumulation x2", "largest batch that fits")
        # checkpointing saves the most: ranked by cost, not by the peak
        saved = 3000 if lv.name == "activation checkpointing" else 1000 if fits else 0
        advice.levers.append(Measured(lv, peak_device_bytes=base.peak_device_bytes - saved, fits=fits))

    def no_runs(*args):
        raise AssertionError("a lever that fits alone needs no combination run")

    _combine(advice, no_runs, 64)
    assert advice.combination == ["gradient accumulation x2"]
    text = advice.summary()
    assert RANKING in text and "+~33% compute" in text and "2 micro-steps per optimizer step" in text
    data = json.loads(json.dumps(advice.to_json()))
    assert data["ranking"] == RANKING
    terms = {lv["lever"]: lv["cost_terms"] for lv in data["levers"]}
    assert terms["gradient accumulation x2"]["micro_steps"] == 2 and terms["activation checkpointing"]["extra_compute_pct"] == 33
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parents[2] / "xmem_engine" / "data" / "report.schema.json").read_text())
    jsonschema.validate(data, schema["properties"]["advice"])


def test_the_compile_lever_says_why_it_is_not_tried_where_inductor_cannot_compile(tmp_path):
    from xmem_engine.tracing.compiler.torch_compile import compile_unavailable

    reason = compile_unavailable()
    if reason is None:
        pytest.skip("Inductor compiles here: tests/tracing/test_torch_compile.py measures the lever")
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(64, 64).cuda()\n"
                      "model(torch.randn(8, 64, device='cuda')).sum().backward()\n")
    lever = next(m for m in advise(str(script), GPU).levers if m.lever.name == "torch.compile")
    assert not lever.applicable and lever.detail == f"Inductor cannot compile for CUDA here: {reason}"
    assert lever.to_json()["peak_device_bytes"] is None


def test_a_lever_wraps_the_model_not_checkpointings_recomputation():
    """Non-reentrant checkpointing calls each block again from the backward: that call is not
    the model's. The torch.compile lever compiled the block there, the recomputation saved
    other tensors than the forward, and checkpoint raised CheckpointError (the lever read "n/a"
    on every checkpointed model)."""
    from torch.utils.checkpoint import checkpoint

    from xmem_engine.advisor import _outermost

    blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
    model = torch.nn.Sequential(*blocks)
    model.forward = lambda x: [x := checkpoint(b, x, use_reentrant=False) for b in blocks][-1]
    wrapped = []

    def wrap(module, call, args, kwargs):
        wrapped.append(module)
        return call(*args, **kwargs)

    with _outermost(wrap):
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert wrapped == [model]
