"""torch.save / torch.load in fake mode (checkpoints.py): nothing written, a later load in
the traced code returns a copy allocated where map_location puts it, as a real load is."""

from __future__ import annotations

import collections

import pytest

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace

SAVE_LOAD = """
import io
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
torch.save(model.state_dict(), PATH)
torch.save({"step": 3, "lr": 0.1}, META)              # no tensors: written as usual
state = torch.load(PATH, map_location=LOCATION)
model.load_state_dict(state)
devices = sorted({str(t.device) for t in state.values()})
meta = torch.load(META)
"""


@pytest.mark.parametrize("location, devices", [("None", ["cuda:0"]), ("'cpu'", ["cpu"]), ("'cuda'", ["cuda:0"])])
def test_a_checkpoint_round_trip_allocates_as_a_real_one(tmp_path, location, devices):
    runs = {}
    for mode in ("fake", "real"):
        path, meta = tmp_path / f"{mode}.pt", tmp_path / f"{mode}-meta.pt"
        ns = {"PATH": str(path), "META": str(meta)}
        tr = trace(SAVE_LOAD.replace("LOCATION", location), ns, mode=mode)
        runs[mode] = (tr, ns, path.exists(), meta.exists())
    (fake, fns, fake_written, fake_meta), (real, rns, real_written, real_meta) = runs["fake"], runs["real"]
    assert fake.mode == "fake" and not fake_written and real_written  # fake mode wrote no checkpoint...
    assert fake_meta and real_meta and fns["meta"] == rns["meta"] == {"step": 3, "lr": 0.1}  # ...but a plain one
    assert fns["devices"] == rns["devices"] == devices
    assert alloc_stream(fake) == alloc_stream(real)
    assert any(n.startswith("torch.save at <cell>:5 wrote nothing") for n in fake.meta["notes"])


def test_a_checkpoint_in_a_file_object_and_a_whole_module():
    src = """
import io
import torch
model = torch.nn.Linear(32, 32).cuda()
buf = io.BytesIO()
torch.save(model, buf)
buf.seek(0)
copy = torch.load(buf, weights_only=False)
same_shape = copy.weight.shape == model.weight.shape and copy.weight is not model.weight
on_gpu = copy.weight.is_cuda
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert ns["same_shape"] and ns["on_gpu"]
    assert sum(e.bytes for e in tr.events if e.kind == "alloc" and e.op == "aten._to_copy.default") >= 2 * 32 * 32 * 4 - 1


def test_loading_what_was_never_saved_is_torchs_error(tmp_path):
    src = f"import torch\nstate = torch.load({str(tmp_path / 'missing.pt')!r})\n"
    with pytest.raises(FileNotFoundError):
        trace(src, {}, mode="fake")


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_weights_saved_before_the_trace_load_onto_the_virtual_gpu(tmp_path, mode):
    import torch

    path = tmp_path / "pretrained.pt"
    torch.save(torch.nn.Linear(256, 256).state_dict(), path)
    src = f"""
import torch
model = torch.nn.Linear(256, 256).cuda()
model.load_state_dict(torch.load({str(path)!r}, map_location="cuda"))
on_gpu = all(t.is_cuda for t in torch.load({str(path)!r}, map_location=torch.device("cuda", 0)).values())
"""
    ns: dict = {}
    tr = trace(src, ns, mode=mode)
    assert ns["on_gpu"] is True
    loaded = [e for e in tr.events if e.kind == "alloc" and e.phase == "other" and e.bytes == 256 * 256 * 4]
    assert len(loaded) == 3  # the model's weight, and each load's copy of it on the GPU


def test_a_kept_checkpoint_holds_no_gpu_memory_and_keeps_host_values(tmp_path):
    """What torch.save kept does not keep the saved GPU tensors alive (a real save does not
    either); its host tensors come back with their values; its fake ones as new storages."""
    src = """
import torch
acts = torch.zeros(1024, 1024, device="cuda")  # 4 MiB on the GPU
torch.save({"acts": acts, "rng": torch.get_rng_state(), "step": 7}, PATH)
del acts                                        # freed here, as on a GPU
back = torch.load(PATH)
rng_equal = bool(torch.equal(back["rng"], torch.get_rng_state()))
step = back["step"]
on_gpu = back["acts"].is_cuda
"""
    ns: dict = {"PATH": str(tmp_path / "ckpt.pt")}
    tr = trace(src, ns, mode="fake")
    assert not list(tmp_path.iterdir())
    assert ns["rng_equal"] and ns["step"] == 7 and ns["on_gpu"]
    big = [e for e in tr.events if e.bytes == 1024 * 1024 * 4 and e.kind in ("alloc", "free")]
    assert [e.kind for e in big] == ["alloc", "free", "alloc", "free"]  # the save's tensor died at `del`
    assert any(n.startswith("torch.save at <cell>:4 wrote nothing: 1 torch.save file of 1 fake tensor (4.0 MiB)") for n in tr.meta["notes"])


def test_saving_into_a_missing_directory_fails_as_torch_does(tmp_path):
    src = f"import torch\ntorch.save(torch.zeros(8, device='cuda'), {str(tmp_path / 'no' / 'x.pt')!r})\n"
    with pytest.raises(RuntimeError, match="Parent directory .* does not exist"):
        trace(src, {}, mode="fake")


def test_a_checkpoint_written_through_a_buffer_or_renamed_loads_back(tmp_path):
    """Lightning writes torch.save's bytes from a buffer to the file; other code saves to a
    temporary name and renames it: the placeholder's bytes carry what they stand for."""
    src = """
import io, os
import torch
model = torch.nn.Linear(128, 128).cuda()
buf = io.BytesIO()
torch.save({"state_dict": model.state_dict(), "epoch": 3}, buf)
with open(CKPT, "wb") as f:
    f.write(buf.getvalue())
torch.save(model.state_dict(), TMP)
os.replace(TMP, FINAL)
a = torch.load(CKPT, map_location="cpu")
b = torch.load(FINAL)
epoch, a_host, b_gpu = a["epoch"], not a["state_dict"]["weight"].is_cuda, b["weight"].is_cuda
"""
    ns: dict = {"CKPT": str(tmp_path / "x.ckpt"), "TMP": str(tmp_path / "tmp.pt"), "FINAL": str(tmp_path / "final.pt")}
    tr = trace(src, ns, mode="fake")
    assert (ns["epoch"], ns["a_host"], ns["b_gpu"]) == (3, True, True)
    # the files hold placeholders of a few hundred bytes, not the 64 KiB weight
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.pt", "x.ckpt"]
    assert all(p.stat().st_size < 4096 for p in tmp_path.iterdir())
    line = src.splitlines().index("b = torch.load(FINAL)") + 1
    loads = [e for e in tr.events if e.kind == "alloc" and e.source.endswith(f":{line}")]
    assert sorted(e.bytes for e in loads) == [128 * 4, 128 * 128 * 4]  # b: back on the GPU, where it was saved from


def test_a_file_object_s_record_dies_with_it():
    """Which file objects held GPU tensors is kept by id: a buffer that dies must take its
    record along, or a later buffer at its address (CPython reuses it at once) loads a host
    checkpoint onto the GPU. Real mode: torch.save of plain tensors goes through."""
    src = """
import io
import torch
host = io.BytesIO()
torch.save({"w": torch.ones(4)}, host)  # a checkpoint of host tensors
data = host.getvalue()
reused = on_gpu = 0
for _ in range(20):
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4, device="cuda")}, buf)  # one of GPU tensors, in a buffer that dies
    gone = id(buf)
    del buf
    other = io.BytesIO(data)
    reused += id(other) == gone
    on_gpu += torch.load(other)["w"].is_cuda
"""
    ns: dict = {}
    trace(src, ns, mode="real")
    assert ns["reused"] > 0 and ns["on_gpu"] == 0


def test_a_real_file_read_to_the_host_keeps_its_values(tmp_path, monkeypatch):
    """torch.load to the host under the fake mode read no data, and its tensors were plain meta
    ones: a step count's ``float()``, ``torch.set_rng_state`` failed (host_loads.py). Small
    tensors come back real, with their values; past the budget, fake (no host memory), tied
    ones still sharing their storage."""
    import torch

    import xmem_engine.tracing.shims.checkpoints as checkpoints

    emb = torch.randn(512, 256)
    torch.save({"step": torch.tensor(7.0), "rng": torch.get_rng_state(), "emb": emb, "head": emb,
                "big": torch.ones(1024, 1024)}, tmp_path / "ckpt.pt")
    torch.save({"epoch": torch.tensor(3)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)  # no mmap
    monkeypatch.setattr(checkpoints, "KEPT_REAL_BYTES", 1 << 20)  # the 4 MiB "big" is past it
    src = f"""
import io
import torch
ck = torch.load({str(tmp_path / "ckpt.pt")!r}, map_location="cpu")
step = float(ck["step"])
torch.set_rng_state(ck["rng"])
emb_sum = float(ck["emb"].sum())
tied = ck["emb"].untyped_storage().data_ptr() == ck["head"].untyped_storage().data_ptr()
big = type(ck["big"]).__name__, str(ck["big"].device), tuple(ck["big"].shape)
buf = io.BytesIO()
torch.save({{"n": torch.tensor([1, 2, 3])}}, buf)
buf.seek(0)
from_buffer = torch.load(buf)["n"].tolist()
epoch = int(torch.load({str(tmp_path / "old.pt")!r})["epoch"])
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake")
    assert tr.mode == "fake"
    assert ns["step"] == 7.0 and ns["tied"] and ns["from_buffer"] == [1, 2, 3] and ns["epoch"] == 3
    assert abs(ns["emb_sum"] - float(emb.sum())) < 1e-3
    assert ns["big"] == ("FakeTensor", "cpu", (1024, 1024))


DCP = """
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
opt = torch.optim.AdamW(model.parameters())
def step():
    model(torch.randn(64, 256, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad()
step()
model_sd, optim_sd = get_state_dict(model, opt)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=PATH)
model_sd, optim_sd = get_state_dict(model, opt)
dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=PATH)
set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
step()
"""


def test_torch_distributed_checkpoint_round_trip_in_one_process(tmp_path):
    # DCP reads each entry to the host, then copies it into the tensor it fills: the AdamW
    # step counts (real host tensors) were filled from meta tensors and the load stopped
    fake = trace(DCP, {"PATH": str(tmp_path / "fake")}, mode="fake")
    real = trace(DCP, {"PATH": str(tmp_path / "real")}, mode="real")
    assert fake.mode == "fake"
    a, b = alloc_stream(fake), alloc_stream(real)
    last = max(i for i, (kind, _) in enumerate(a) if kind == "alloc") + 1
    # the same requests in order; what is left when the code ends dies in the collector's order
    assert a[:last] == b[:last] and collections.Counter(a[last:]) == collections.Counter(b[last:])


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_map_location_function_or_dict_sends_storages_where_it_says(tmp_path, mode):
    # the old idioms: torch refused a function under the fake mode ("Callable map_location not
    # supported"), and storage.cuda() asked the driver in either mode
    import torch

    torch.save({"w": torch.ones(64, 64), "step": torch.tensor(9)}, tmp_path / "ckpt.pt")
    src = f"""
import torch
path = {str(tmp_path / "ckpt.pt")!r}
host = torch.load(path, map_location=lambda storage, loc: storage)
step = int(host["step"])
gpu = torch.load(path, map_location=lambda storage, loc: storage.cuda())
mapped = torch.load(path, map_location={{"cpu": "cuda:0"}})
where = str(host["w"].device), str(gpu["w"].device), str(mapped["w"].device)
"""
    ns: dict = {}
    tr = trace(src, ns, mode=mode)
    assert ns["where"] == ("cpu", "cuda:0", "cuda:0") and ns["step"] == 9
    assert [e.bytes for e in tr.events if e.kind == "alloc"] == [64 * 64 * 4, 8] * 2  # the two GPU loads
