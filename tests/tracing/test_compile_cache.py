"""Inductor's compiled graphs kept between estimates in xmem's own cache
(xmem_engine/tracing/compiler/compile_cache.py).

A second estimate of the same compiled step reads Inductor's output code back instead of
compiling it again, and must trace exactly the events the first one traced: the same buffers,
and the same allocations of pad_mm's timings while compiling (AOTAutograd still runs). The cache
is per target GPU, is xmem's directory and not torch's, and ``XMEM_CACHE_DIR=off`` keeps none."""

from __future__ import annotations

import json
import os

import pytest
import torch

from xmem_engine.tracing import trace
from xmem_engine.tracing.compiler.compile_cache import CACHE_DIR_VAR, CACHE_MAX_VAR, compile_cache_dir
from xmem_engine.tracing.compiler.torch_compile import PAD_MM_TIMING, compile_unavailable

pytestmark = pytest.mark.skipif(compile_unavailable() is not None,
                                reason=f"Inductor cannot compile for CUDA here: {compile_unavailable()}")

H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_045_870_592, "major": 9, "minor": 0,
        "multi_processor_count": 132}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "total_memory": 42_505_273_344, "major": 8, "minor": 0,
        "multi_processor_count": 108}

# a bf16 head whose vocabulary (501) misses the tensor cores' multiple of 8: pad_mm times it while compiling
STEP = """
import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(501, 128); s.fc = nn.Linear(128, 512); s.head = nn.Linear(512, 501)
    def forward(s, idx):
        return F.cross_entropy(s.head(F.gelu(s.fc(s.emb(idx)))).view(-1, 501), idx.view(-1))
model = torch.compile(Net().cuda())
opt = torch.optim.AdamW(model.parameters())
idx = torch.randint(0, 501, (8, 256), device="cuda")
for i in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx)
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
"""


# the logits held by a reference cycle after the forward (as a Dynamo frame compile's variable
# trackers hold a model's output after a graph break): only a collection frees them
CYCLE = STEP.replace("        loss = model(idx)", """        loss = model(idx)
        holder = {"logits": model._orig_mod.head.weight.new_empty(8 * 256, 501)}
        holder["self"] = holder
        del holder""")


def _events(tr) -> list[dict]:
    return [e.to_json() for e in tr.events]


def test_a_second_estimate_reads_the_compiled_graphs_back_and_traces_the_same_events(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path))
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    cold = trace(STEP, {}, mode="fake", device=H100)
    warm = trace(STEP, {}, mode="fake", device=H100)
    assert cold.meta["compile"]["graphs"] == warm.meta["compile"]["graphs"] == 1
    assert cold.meta["compile"]["cached"] == 0
    assert warm.meta["compile"]["cached"] == 2  # the forward graph and the backward
    assert any(e.op == PAD_MM_TIMING for e in warm.events)  # AOTAutograd's passes ran again
    assert _events(warm) == _events(cold)
    note = next(n for n in warm.meta["notes"] if n.startswith("torch.compile"))
    assert "2 of its graphs Inductor read from xmem's compile cache" in note
    assert "compile cache" not in next(n for n in cold.meta["notes"] if n.startswith("torch.compile"))
    # the graphs are in xmem's directory, and torch's own cache setting is as it was
    assert all(p.startswith(str(tmp_path / "inductor")) for p in warm.meta["compile"]["wrappers"])
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before
    (folder,) = (tmp_path / "inductor").iterdir()  # named for what it was compiled for (xmem cache lists it)
    assert json.loads((folder / "about.json").read_text()) == {"gpu": H100["name"], "torch": torch.__version__}


def test_tensors_that_cycles_hold_are_freed_at_the_same_point_warm_or_cold(tmp_path, monkeypatch):
    """Inductor's compile allocates enough Python objects for full collections to run in it (on a
    GPU as here); reading a graph back allocates almost none, so the trace collects after every
    compile: Lightning's GPT-2 was 13.99 GiB cold and 17.17 GiB warm before."""
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path))
    cold = trace(CYCLE, {}, mode="fake", device=H100)
    warm = trace(CYCLE, {}, mode="fake", device=H100)
    assert warm.meta["compile"]["cached"] == 2
    assert _events(warm) == _events(cold)
    # freed in the first backward, by the collection after its (lazy) compile
    held = next(e for e in cold.events if e.kind == "alloc" and e.shape == (2048, 501) and e.phase == "forward")
    freed = next(e for e in cold.events if e.kind == "free" and e.id == held.id)
    assert (freed.phase, freed.iteration) == ("backward", held.iteration)


def test_another_gpu_compiles_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path))
    trace(STEP, {}, mode="fake", device=H100)
    other = trace(STEP, {}, mode="fake", device=A100)
    assert other.meta["compile"]["graphs"] == 1 and other.meta["compile"]["cached"] == 0
    assert len(list((tmp_path / "inductor").iterdir())) == 2  # a directory per target GPU


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, "off")
    assert compile_cache_dir(object()) is None
    trace(STEP, {}, mode="fake", device=H100)
    again = trace(STEP, {}, mode="fake", device=H100)
    assert again.meta["compile"]["graphs"] == 1 and again.meta["compile"]["cached"] == 0


def test_a_trace_that_compiles_makes_room_first(tmp_path, monkeypatch):
    """A folder of an older xmem (never read again) goes when the cache is over its limit."""
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path))
    monkeypatch.setenv(CACHE_MAX_VAR, "1")
    stale = tmp_path / "inductor" / "from-an-older-xmem"
    stale.mkdir(parents=True)
    (stale / "graph").write_bytes(b"x" * (2 << 20))
    os.utime(stale, (1.0, 1.0))
    trace(STEP, {}, mode="fake", device=H100)
    assert not stale.exists()
    (kept,) = (tmp_path / "inductor").iterdir()  # this trace's own, with its graphs
    assert any(kept.rglob("*.py"))


# a library that pops torch's cache variable mid-run (Unsloth's patching does), then compiles again
POPS_THE_VARIABLE = STEP + """
import os

import torch
os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
@torch.compile
def scale(x):
    return (x * 2).sin()
scale(torch.randn(64, 64, device="cuda"))
"""


def test_torchs_own_cache_is_neither_read_nor_written(tmp_path, monkeypatch):
    """Nothing xmem compiles reaches torch's cache folder, whatever the code does to the variable
    naming it, nor torch's portable artifacts (which Unsloth saves at exit and loads into later
    runs): these graphs were compiled under xmem's patches."""
    import tempfile

    from torch.compiler._cache import CacheArtifactManager

    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "xmem"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # torch's default folder is in there
    (tmp_path / "tmp").mkdir()
    CacheArtifactManager.clear()
    tr = trace(POPS_THE_VARIABLE, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["graphs"] == 2
    # (importing torch._dynamo makes the folder, empty)
    assert [p for p in (tmp_path / "tmp").rglob("*") if p.is_file()] == []
    assert len(list((tmp_path / "xmem").rglob("fxgraph/*/*"))) == 3  # the step's forward and backward, and scale's
    assert torch.compiler.save_cache_artifacts() is None


def test_a_module_imported_during_an_earlier_trace_answers_this_ones_folder(tmp_path, monkeypatch):
    """A torch module first imported while a trace compiled keeps that trace's ``cache_dir``
    stand-in (it asks torch's own once the trace is over); the next trace answers it too."""
    import sys
    import types

    from torch._inductor.runtime import cache_dir_utils

    real = cache_dir_utils.cache_dir
    earlier = lambda: real()  # noqa: E731  (what an earlier trace left behind)
    earlier.original = real
    monkeypatch.setitem(sys.modules, "torch._xmem_imported_earlier", types.SimpleNamespace(cache_dir=earlier))
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "xmem"))
    answer = tmp_path / "answer.txt"
    code = POPS_THE_VARIABLE + f"""
import sys
open({str(answer)!r}, "w").write(sys.modules["torch._xmem_imported_earlier"].cache_dir())
"""
    trace(code, {}, mode="fake", device=H100)
    assert answer.read_text().startswith(str(tmp_path / "xmem" / "inductor"))
    assert sys.modules["torch._xmem_imported_earlier"].cache_dir is earlier  # put back after


def test_a_folder_that_cannot_be_written_turns_the_cache_off_not_the_estimate(tmp_path, monkeypatch):
    """A cluster's compute node may have a read-only home: the compile went on without the cache
    (every compiled estimate had stopped in the cache's mkdir)."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_DIR_VAR, str(blocked))
    with pytest.warns(RuntimeWarning, match="xmem's compile cache is off for this estimate"):
        tr = trace(STEP, {}, mode="fake", device=H100)
    assert tr.meta["compile"]["graphs"] == 1 and tr.meta["compile"]["cached"] == 0
