"""Lightning's ``Trainer(accelerator="gpu", precision="bf16-mixed")`` traced: its automatic
optimization runs ``training_step`` and ``backward`` inside the closure it passes to
``optimizer.step``, and the trace must still call them forward and backward, and what they save
an activation (tracer.py), as for the same step written as a plain loop."""

from __future__ import annotations

import collections

import pytest

L = pytest.importorskip("lightning")

from xmem_engine.tracing import trace  # noqa: E402

MODULE = """
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(256, 512))


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))


class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_net()

    def training_step(self, batch, i):
        (x,) = batch
        return self.net(x).float().square().mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
"""

LIGHTNING = MODULE + """
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Lit(), DataLoader(ds, batch_size=64))
"""

PLAIN = MODULE + """
net = make_net().cuda()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
for step, (x,) in enumerate(DataLoader(ds, batch_size=64)):
    if step == 2:
        break
    x = x.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = net(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _by(tr, *fields):
    counts: collections.Counter = collections.Counter()
    for e in tr.events:
        if e.kind == "alloc":
            counts[tuple(str(getattr(e, f)) for f in fields)] += e.bytes
    return counts


def test_lightning_bf16_steps_have_forward_backward_and_activations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Lightning's default root dir (lightning_logs) is the cwd
    lit = trace(LIGHTNING, {}, mode="fake")
    plain = trace(PLAIN, {}, mode="fake")
    got, want = _by(lit, "iteration", "phase", "category"), _by(plain, "iteration", "phase", "category")
    for it in ("0", "1"):
        acts = got[(it, "forward", "activation")]
        # Linear(512->2048) in bf16 saves x and the GELU's input and output, 64 rows each.
        assert acts >= 64 * (512 + 2 * 2048) * 2
        assert acts == want[(it, "forward", "activation")]
        assert got[(it, "backward", "gradient")] == want[(it, "backward", "gradient")] == 4 * sum(
            n for n in (512 * 2048, 2048, 2048 * 512, 512))
    assert got[("0", "optimizer", "optimizer_state")] == want[("0", "optimizer", "optimizer_state")] > 0
    assert not any(phase == "optimizer" and cat in ("activation", "gradient") for _, phase, cat in got)
    assert {it for it, _, _ in got} == {"-1", "0", "1"}
    assert not list(tmp_path.iterdir())  # enable_checkpointing=False, logger=False: nothing written


CHECKPOINTED = MODULE + """
import glob, os
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, logger=False,
                    enable_checkpointing=CHECKPOINTING, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=ROOT)
trainer.fit(Lit(), DataLoader(ds, batch_size=64))
"""

LOAD_BACK = """
ckpts = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "**", "*.ckpt"), recursive=True))
back = Lit.load_from_checkpoint(os.path.join(ROOT, ckpts[0]))
shape = tuple(back.net[0].weight.shape)
"""


def test_lightning_checkpoints_write_no_tensors_allocate_nothing_and_load_back(tmp_path):
    ns: dict = {"ROOT": str(tmp_path / "with"), "CHECKPOINTING": True}
    saved = trace(CHECKPOINTED + LOAD_BACK, ns, mode="fake")
    plain = trace(CHECKPOINTED, {"ROOT": str(tmp_path / "without"), "CHECKPOINTING": False}, mode="fake")
    assert ns["ckpts"] == ["checkpoints/epoch=0-step=2.ckpt"] and ns["shape"] == (2048, 512)
    # the checkpoint file holds a placeholder, not 24 MiB of weights and AdamW state
    assert (tmp_path / "with" / ns["ckpts"][0]).stat().st_size < 4096
    stream = [(e.kind, e.bytes) for e in saved.events if e.kind in ("alloc", "free")]
    fit = [(e.kind, e.bytes) for e in plain.events if e.kind in ("alloc", "free")]
    assert stream[:len(fit)] == fit  # saving allocated nothing on the GPU; what follows is the load
    params = 512 * 2048 + 2048 + 2048 * 512 + 512
    at = next(i for i, line in enumerate((CHECKPOINTED + LOAD_BACK).splitlines(), 1) if line.startswith("trainer.fit"))
    assert any(n.startswith(f"Trainer.fit at <cell>:{at} wrote nothing: 1 torch.save file of 12 fake tensors "
                            f"({3 * params * 4 / 2**20:.1f} MiB)") for n in saved.meta["notes"])


COMPILED = MODULE + """
lit = torch.compile(Lit())
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(lit, DataLoader(ds, batch_size=64))
"""


def test_a_compiled_lightning_module_compiles_its_training_step_for_the_gpu(tmp_path, monkeypatch):
    """``Trainer.fit(torch.compile(lit))`` compiles ``training_step`` with the compiled module's
    Dynamo context (``from_compiled``). It had been compiled for the CPU the traced tensors are on,
    and Inductor's CPU kernel ran on a fake tensor: the process died of SIGSEGV."""
    from xmem_engine.tracing.compiler.torch_compile import compile_unavailable

    if compile_unavailable() is not None:
        pytest.skip(compile_unavailable())
    monkeypatch.chdir(tmp_path)
    tr = trace(COMPILED, {}, mode="fake")
    info = tr.meta["compile"]
    assert info["graphs"] >= 1 and info["backward_graphs"] >= 1 and info["failures"] == 0
    assert all("tangents_" in open(p).read() or "empty_strided_cuda" in open(p).read() for p in info["wrappers"])
    line = next(i for i, s in enumerate(COMPILED.splitlines(), 1) if s.startswith("lit = torch.compile"))
    # named by the user's line, not by Lightning's wrapper of torch.compile (lightning/fabric/wrappers.py)
    assert info["where"] == [f"<cell>:{line}"]
    # the compiled training_step is each step's forward (its allocations had had no step, no phase)
    got = _by(tr, "iteration", "phase", "category")
    for it in ("0", "1"):
        assert got[(it, "forward", "activation")] >= 64 * (512 + 2048) * 2
        assert got[(it, "backward", "gradient")] == 4 * (512 * 2048 + 2048 + 2048 * 512 + 512)
    assert got[("0", "optimizer", "optimizer_state")] == 2 * got[("0", "backward", "gradient")]
    assert {it for it, _, _ in got} == {"-1", "0", "1"} and got[("-1", "other", "other")] < 1024
