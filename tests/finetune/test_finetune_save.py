"""Saving in fake mode (checkpoints.py): ``save_pretrained``, ``Trainer`` checkpoints and
``safetensors`` write no weights (a placeholder while the trace runs, removed after), a later
load in the traced code reads back what was kept, the save allocates nothing on the GPU, and
the notes say what was not written."""

from __future__ import annotations

import os

import pytest

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from xmem_engine.tracing import trace  # noqa: E402

CONFIG = ("LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, "
          "num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=TIED)")
# Its parameters: per layer q, o 256x256; k, v 256x128; gate, up, down 256x512; two norms.
PER_LAYER = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512 + 2 * 256
N_PARAMS = 2 * PER_LAYER + 1000 * 256 + 256  # + embedding + final norm
LM_HEAD = 1000 * 256

STEP = f"""
import os
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
model = AutoModelForCausalLM.from_config({CONFIG}).cuda()
ids = torch.randint(0, 1000, (2, 32), device="cuda")
model(input_ids=ids, labels=ids).loss.backward()
"""

SAVE = """
model.save_pretrained(OUT)
listed = sorted(os.listdir(OUT))
"""

LOAD = """
again = AutoModelForCausalLM.from_pretrained(OUT).cuda()
shapes_equal = all(a.shape == b.shape and a.dtype == b.dtype and a.is_cuda
                   for a, b in zip(again.parameters(), model.parameters()))
n_loaded = sum(p.numel() for p in again.parameters())
"""


def _line(src: str, text: str) -> int:
    """The line of ``src`` that starts with ``text`` (as a note names it: ``<cell>:N``)."""
    return next(i for i, line in enumerate(src.splitlines(), 1) if line.startswith(text))


def _stream(tr) -> list[tuple]:
    return [(e.kind, e.bytes, str(e.category)) for e in tr.events if e.kind in ("alloc", "free")]


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_writes_no_weights_allocates_nothing_and_says_so(tmp_path, tied):
    src = STEP.replace("TIED", str(tied))
    out = tmp_path / "out"
    ns: dict = {"OUT": str(out)}
    saved = trace(src + SAVE, ns, mode="fake")
    plain = trace(src, {}, mode="fake")
    assert _stream(saved) == _stream(plain)  # the save made no GPU allocation, and freed nothing
    # While the trace ran, the weights file was there (a placeholder); after it, it is gone.
    assert ns["listed"] == ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json"]
    n = N_PARAMS + (0 if tied else LM_HEAD)
    tensors = 2 * 9 + 2 + (0 if tied else 1)
    notes = [x for x in saved.meta["notes"] if "safetensors" in x]
    at = _line(src + SAVE, "model.save_pretrained")
    assert notes == [f"PreTrainedModel.save_pretrained at <cell>:{at} wrote nothing: 1 safetensors file of {tensors} fake "
                     f"tensors ({n * 4 / 2**20:.1f} MiB) kept in memory (a load of it in the traced code reads it back)"]


def test_a_model_saved_in_the_trace_loads_back_in_the_trace(tmp_path):
    ns: dict = {"OUT": str(tmp_path / "out")}
    src = STEP.replace("TIED", "False")
    tr = trace(src + SAVE + LOAD, ns, mode="fake")
    assert ns["shapes_equal"] and ns["n_loaded"] == N_PARAMS + LM_HEAD
    # The loaded copy is the same parameters again on the GPU (float32, as saved).
    base = trace(src, {}, mode="fake")
    extra = sum(e.bytes for e in tr.events if e.kind == "alloc") - sum(e.bytes for e in base.events if e.kind == "alloc")
    assert extra == pytest.approx((N_PARAMS + LM_HEAD) * 4, rel=0.01)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_an_existing_weights_file_is_left_as_it_was(tmp_path):
    from safetensors.torch import save_file
    import torch

    out = tmp_path / "out"
    out.mkdir()
    save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(out / "model.safetensors"))
    before = (out / "model.safetensors").read_bytes()
    ns: dict = {"OUT": str(out)}
    tr = trace(STEP.replace("TIED", "False") + SAVE + LOAD, ns, mode="fake")
    assert ns["shapes_equal"]  # the load in the trace read what the trace saved...
    assert (out / "model.safetensors").read_bytes() == before  # ...and the user's file is untouched
    assert any("model.safetensors was there before and was left as it was" in n for n in tr.meta["notes"])


SAFETENSORS = """
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(512, 128)
        self.head = torch.nn.Linear(128, 512, bias=False)
        self.head.weight = self.emb.weight

net = Tied().cuda()
save_model(net, PATH)                     # the tied weight is saved once
save_file({"a": torch.zeros(64, 64, device="cuda"), "b": torch.ones(3, device="cuda")}, PATH2, metadata={"k": "v"})
back = load_file(PATH2, device="cuda")
with safe_open(PATH2, framework="pt", device="cpu") as f:
    keys, meta = f.keys(), f.metadata()
    sl = f.get_slice("a")
    part = sl[:8, 2:4]
    shape, dtype = sl.get_shape(), sl.get_dtype()
load_model(net, PATH)
result = (sorted(back), tuple(back["a"].shape), bool(back["a"].is_cuda), keys, meta, tuple(part.shape), shape, dtype)
"""


def test_safetensors_save_file_save_model_and_loads(tmp_path):
    ns: dict = {"PATH": str(tmp_path / "net.safetensors"), "PATH2": str(tmp_path / "ab.safetensors")}
    tr = trace(SAFETENSORS, ns, mode="fake")
    assert ns["result"] == (["a", "b"], (64, 64), True, ["a", "b"], {"k": "v"}, (8, 2), [64, 64], "F32")
    assert not list(tmp_path.iterdir())
    notes = [n for n in tr.meta["notes"] if "safetensors" in n]
    assert notes[0].startswith(f"safetensors.torch.save_model at <cell>:{_line(SAFETENSORS, 'save_model(')} wrote nothing: 1 safetensors file of 1 fake tensor (256.0 KiB)")
    assert notes[1].startswith(f"safetensors.torch.save_file at <cell>:{_line(SAFETENSORS, 'save_file(')} wrote nothing: 1 safetensors file of 2 fake tensors")
    loaded = [e for e in tr.events if e.kind == "alloc" and e.source.endswith(f":{_line(SAFETENSORS, 'back =')}")]
    assert sorted(e.bytes for e in loaded) == [12, 64 * 64 * 4]  # load_file(device="cuda") allocates each tensor


def test_safetensors_bytes_of_fake_tensors_fall_back_to_real_mode():
    src = "import torch\nfrom safetensors.torch import save\nblob = save({'w': torch.zeros(4, 4, device='cuda')})\nn = len(blob)\n"
    ns: dict = {}
    tr = trace(src, ns, mode="auto")
    assert tr.mode == "real" and "safetensors.torch.save" in str(tr.meta["fallback"]) and ns["n"] > 64


TRAINER = f"""
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config({CONFIG.replace("TIED", "False")})
ids = torch.randint(0, 1000, (8, 32))
ds = Dataset.from_dict({{"input_ids": ids.tolist(), "labels": ids.tolist()}})
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=4, max_steps=2, save_strategy=STRATEGY, save_steps=1,
                         report_to=[], logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                         logging_nan_inf_filter=False)  # (a branch on the loss's value: a guess, not this test's business)
trainer = Trainer(model=model, args=args, train_dataset=ds)
trainer.train()
"""


def test_trainer_checkpoints_write_nothing_big_and_allocate_nothing(tmp_path):
    pytest.importorskip("datasets")
    runs = {}
    for strategy in ("steps", "no"):
        out = tmp_path / strategy
        runs[strategy] = trace(TRAINER, {"OUT": str(out), "STRATEGY": strategy}, mode="fake")
    assert _stream(runs["steps"]) == _stream(runs["no"])
    files = [p for p in (tmp_path / "steps").rglob("*") if p.is_file()]
    assert {p.parent.name for p in files} == {"checkpoint-1", "checkpoint-2"}
    names = {p.name for p in files}
    assert {"config.json", "trainer_state.json", "scheduler.pt", "rng_state.pth"} <= names
    assert not names & {"model.safetensors", "optimizer.pt"} and max(p.stat().st_size for p in files) < 64 * 1024
    notes = runs["steps"].meta["notes"]
    n, at = N_PARAMS + LM_HEAD, _line(TRAINER, "trainer.train()")
    assert f"Trainer.train at <cell>:{at} wrote nothing: 2 safetensors files of 42 fake tensors ({2 * n * 4 / 2**20:.1f} MiB)" in " ".join(notes)
    # AdamW's state: exp_avg and exp_avg_sq of each of the 21 parameters, and a step count each
    assert any(x.startswith(f"Trainer.train at <cell>:{at} wrote nothing: 2 torch.save files of 126 fake tensors") for x in notes)


PEFT = STEP.replace("TIED", "False").replace(".cuda()\n", ".cuda()\nfrom peft import LoraConfig, PeftModel, get_peft_model\n"
                                             "model = get_peft_model(model, LoraConfig(r=8, target_modules=['q_proj', 'v_proj']))\n", 1) + """
model.save_pretrained(OUT)
base = AutoModelForCausalLM.from_config(model.base_model.model.config).cuda()
again = PeftModel.from_pretrained(base, OUT)
n_lora = sum(p.numel() for n, p in again.named_parameters() if "lora_" in n)
"""


def test_peft_adapters_save_and_load_back(tmp_path):
    pytest.importorskip("peft")
    ns: dict = {"OUT": str(tmp_path / "adapter")}
    tr = trace(PEFT, ns, mode="fake")
    # LoRA r=8 on q (256->256) and v (256->128) of 2 layers: A is 8 x in, B is out x 8
    n = 2 * (8 * 256 + 256 * 8 + 8 * 256 + 128 * 8)
    assert ns["n_lora"] == n
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["README.md", "adapter_config.json"]
    at = _line(PEFT, "model.save_pretrained")
    assert f"PeftModel.save_pretrained at <cell>:{at} wrote nothing: 1 safetensors file of 8 fake tensors ({n * 4 / 2**10:.1f} KiB)" in " ".join(tr.meta["notes"])


ACCELERATE = """
import os
import torch
from accelerate import Accelerator
acc = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters())
model, opt = acc.prepare(model, opt)
acc.backward(model(torch.randn(32, 256, device=acc.device)).float().square().mean())
opt.step()
opt.zero_grad()
acc.save_state(OUT)
listed = sorted(os.listdir(OUT))
acc.load_state(OUT)
"""


def test_accelerate_save_state_and_load_state(tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "state"
    ns: dict = {"OUT": str(out)}
    tr = trace(ACCELERATE, ns, mode="fake")
    assert ns["listed"] == ["model.safetensors", "optimizer.bin", "random_states_0.pkl"]  # placeholders among them
    assert sorted(p.name for p in out.iterdir()) == ["random_states_0.pkl"]  # no tensors of the model's: real
    params = 256 * 1024 + 1024 + 1024 * 256 + 256
    at = _line(ACCELERATE, "acc.save_state")
    notes = " ".join(tr.meta["notes"])
    assert f"Accelerator.save_state at <cell>:{at} wrote nothing: 1 safetensors file of 4 fake tensors ({params * 4 / 2**20:.1f} MiB)" in notes
    assert f"Accelerator.save_state at <cell>:{at} wrote nothing: 1 torch.save file of 8 fake tensors ({2 * params * 4 / 2**20:.1f} MiB)" in notes
    # load_state reads the weights to the host and copies them into the model (no GPU memory);
    # the optimizer's state, loaded to the host too, moves to its parameters' device: AdamW's 2.
    loads = [e for e in tr.events if e.kind == "alloc" and e.source.endswith(f":{_line(ACCELERATE, 'acc.load_state')}")]
    assert sum(e.bytes for e in loads) == 2 * params * 4


def test_each_trace_starts_with_a_new_processs_accelerate_state():
    """accelerate keeps one AcceleratorState per process. Traced twice in one process (the
    notebook, the advisor's levers), the second trace's ``Accelerator(mixed_precision=...)``
    met the first's state and refused another precision; and the user's own state changed."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, PartialState

    step = ("import torch\nfrom accelerate import Accelerator\nacc = Accelerator(mixed_precision=PREC)\n"
            "model = acc.prepare(torch.nn.Linear(64, 64))\nacc.backward(model(torch.randn(8, 64, device=acc.device)).sum())\n"
            "used = str(acc.mixed_precision)\n")
    users = {"_from_the_user": True}
    PartialState._shared_state.update(users)
    try:
        for prec in ("bf16", "fp16", "no"):
            ns: dict = {}
            trace(step.replace("PREC", repr(prec)), ns, mode="fake")
            assert ns["used"] == prec
            assert PartialState._shared_state == users and AcceleratorState._shared_state == {}
    finally:
        PartialState._shared_state.clear()


READ_TO_HOST = """
import torch
from safetensors.torch import load_file, save_file
# a model's worth of 8 MiB weights (each below the tracer's 16 MiB for real host tensors)
save_file({f"w{i:02d}": torch.zeros(2048, 1024, device="cuda") for i in range(12)}, PATH)
back = load_file(PATH, device="cpu")
torch.save({f"w{i:02d}": torch.zeros(2048, 1024, device="cuda") for i in range(12)}, PT)
state = torch.load(PT, map_location="cpu")
kinds = ([type(back[k]).__name__ for k in sorted(back)], [type(state[k]).__name__ for k in sorted(state)])
zeros = bool(back["w00"].eq(0).all()), bool(state["w00"].eq(0).all())
devices = {str(t.device) for t in (*back.values(), *state.values())}
"""


def test_weights_read_back_to_the_host_are_real_zeros_only_up_to_a_budget(tmp_path):
    """A kept file read to the host: real zeros up to KEPT_REAL_BYTES (64 MiB), fake host
    tensors past it. Gemma-3-1B's shape, read back slice by slice, had made 1.4 GB of host
    zeros (2.7 GB peak RSS)."""
    ns: dict = {"PATH": str(tmp_path / "w.safetensors"), "PT": str(tmp_path / "w.pt")}
    tr = trace(READ_TO_HOST, ns, mode="fake")
    assert tr.mode == "fake"
    # 8 MiB each: 8 of them fill the 64 MiB; the safetensors load spends it, torch.load gets none
    assert ns["kinds"] == (["Tensor"] * 8 + ["FakeTensor"] * 4, ["FakeTensor"] * 12)
    assert ns["zeros"][0] is True  # what is real reads as zeros, as before
    assert ns["devices"] == {"cpu"}
    assert not [e for e in tr.events if e.kind == "alloc" and e.source.endswith((":6", ":8"))]  # host loads


@pytest.mark.parametrize("device", ["0", "'cuda:0'", "'cpu'"])
def test_a_safetensors_file_on_disk_opens_on_a_device_given_by_index(tmp_path, device):
    # safetensors takes a GPU index (accelerate's load_checkpoint_and_dispatch passes one):
    # with an int, safetensors built its tensors through torch.asarray(storage), which the
    # tracer's modes refused ("could not determine the shape of object type 'UntypedStorage'")
    st = pytest.importorskip("safetensors.torch")
    import torch

    st.save_file({"w": torch.ones(64, 64), "b": torch.arange(4.0)}, str(tmp_path / "m.safetensors"))
    src = f"""
from safetensors.torch import load_file
from safetensors import safe_open
d = load_file({str(tmp_path / "m.safetensors")!r}, device={device})
with safe_open({str(tmp_path / "m.safetensors")!r}, framework="pt", device={device}) as f:
    b = f.get_tensor("b")
where = sorted({{str(t.device) for t in (*d.values(), b)}})
"""
    for mode in ("fake", "real"):
        ns: dict = {}
        trace(src, ns, mode=mode)
        assert ns["where"] == (["cpu"] if device == "'cpu'" else ["cuda:0"]), (mode, ns["where"])
