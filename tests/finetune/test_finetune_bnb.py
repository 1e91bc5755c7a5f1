"""bitsandbytes on the virtual GPU (bitsandbytes_shim.py): 4-bit and 8-bit weights quantized at
``.cuda()`` / ``from_pretrained(device_map=...)`` take the bytes bitsandbytes itself gives them,
the 8-bit optimizers' block-wise states too, paged optimizer states are counted as unified
memory outside the caching allocator, and real mode (bitsandbytes' CPU kernels) and fake mode
(its fake kernels) record the same events."""

from __future__ import annotations

import math
import sys
from collections import Counter

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from xmem_engine.estimate import estimate_trace, resolve_gpu  # noqa: E402
from xmem_engine.tracing import trace  # noqa: E402
from xmem_engine.tracing.shims.bitsandbytes_shim import MANAGED_HEADLINE  # noqa: E402

N, K = 384, 256  # a weight of 98,304 elements: 1,536 blocks of 64, 6 nested blocks of 256


def key(e) -> tuple:
    if e.kind in ("alloc", "free"):
        return (e.kind, e.bytes, e.category, e.op, e.phase, e.dtype, tuple(e.shape))
    return (e.kind, e.phase)


def same_events(a, b) -> bool:
    """The same events in the same order, but for the frees after the last allocation (the
    objects left when the code ends die in an order of the garbage collector's)."""
    ka, kb = [key(e) for e in a.events], [key(e) for e in b.events]
    last = max(i for i, k in enumerate(ka) if k[0] == "alloc") + 1
    return ka[:last] == kb[:last] and Counter(ka[last:]) == Counter(kb[last:])


def param_allocs(tr) -> Counter:
    return Counter(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "parameter")


def quantized_sizes(quant_type: str, double: bool, storage: torch.dtype) -> Counter:
    """What bitsandbytes' own quantize_4bit (CPU) gives a N x K weight: packed data and every
    tensor of its QuantState."""
    from bitsandbytes.functional import quantize_4bit

    w = torch.randn(N, K, dtype=torch.bfloat16)
    packed, qs = quantize_4bit(w, blocksize=64, compress_statistics=double, quant_type=quant_type,
                               quant_storage=storage)
    tensors = [packed, qs.absmax, qs.code]
    if double:
        tensors += [qs.offset, qs.state2.absmax, qs.state2.code]
    return Counter(t.numel() * t.element_size() for t in tensors)


LINEAR4 = """
import torch
import bitsandbytes as bnb
lin = bnb.nn.Linear4bit({K}, {N}, bias=False, compute_dtype=torch.bfloat16, compress_statistics={double},
                        quant_type="{qt}", quant_storage={storage})
lin = lin.cuda()
x = torch.randn(8, {K}, device="cuda", dtype=torch.bfloat16, requires_grad=True)
lin(x).float().sum().backward()
"""


@pytest.mark.parametrize("qt,double,storage", [
    ("nf4", True, torch.uint8), ("nf4", False, torch.uint8), ("fp4", True, torch.uint8),
    ("nf4", True, torch.bfloat16),
])
def test_4bit_weight_bytes_equal_bitsandbytes_and_real_equals_fake(qt, double, storage):
    src = LINEAR4.format(K=K, N=N, double=double, qt=qt, storage=str(storage))
    fake = trace(src, {}, mode="fake")
    real = trace(src, {}, mode="real")
    assert fake.mode == "fake" and same_events(fake, real)
    expected = quantized_sizes(qt, double, storage)
    assert param_allocs(fake) == expected
    # and bitsandbytes' sizes are the formulas: 4 bits a weight, one absmax per block of 64
    # (fp32, or uint8 + fp32 per 256 of them + the offset with double quantization), 16 codes
    blocks = math.ceil(N * K / 64)
    formula = Counter({N * K // 2: 1, 16 * 4: 1})
    formula.update([blocks] if double else [blocks * 4])
    if double:
        formula.update([math.ceil(blocks / 256) * 4, 4, 256 * 4])  # nested absmax, offset, nested code
    assert expected == formula
    # the bf16 weight taken to the GPU to be quantized there, then freed
    assert any(e.kind == "alloc" and e.category == "input" and e.bytes == N * K * 4 for e in fake.events)
    # its dequantized copy is a temporary of the backward pass (fp32, then the compute dtype)
    backward = [e.bytes for e in fake.events if e.kind == "alloc" and e.phase == "backward"]
    assert N * K * 4 in backward and N * K * 2 in backward


INT8 = """
import torch
import bitsandbytes as bnb
lin = bnb.nn.Linear8bitLt({K}, {N}, bias=True, has_fp16_weights=False, threshold=0.0).cuda()
x = torch.randn(8, {K}, device="cuda", dtype=torch.float16, requires_grad=True)
lin(x).float().sum().backward()
"""


def test_int8_weight_bytes_and_real_equals_fake():
    src = INT8.format(K=K, N=N)
    fake = trace(src, {}, mode="fake")
    real = trace(src, {}, mode="real")
    assert same_events(fake, real)
    from bitsandbytes.functional import int8_vectorwise_quant

    cb, scb, _ = int8_vectorwise_quant(torch.randn(N, K, dtype=torch.float16))
    weight = [e for e in fake.events if e.kind == "alloc" and e.op.startswith("bitsandbytes.int8_vectorwise_quant")
              and e.category == "parameter"]
    assert [e.bytes for e in weight] == [cb.numel() * cb.element_size(), scb.numel() * scb.element_size()]
    assert [e.bytes for e in weight] == [N * K, N * 4]
    # on CUDA the int8 matmul is a composite: cuBLASLt's int32 product, then the fp16 output
    mm = [e.bytes for e in fake.events if e.kind == "alloc" and e.op == "bitsandbytes.int8_scaled_mm.default"]
    assert mm == [8 * N * 2, 8 * N * 4]


def test_llm_int8_outlier_columns_take_their_upper_bound_in_fake_mode():
    # threshold 6.0 (LLM.int8()'s default): which columns hold outliers depends on the
    # activations' values; fake mode takes every column (and said so), where it had re-run the
    # whole script on real tensors (and timed out on the zoo's bnb_int8_lora.py)
    src = INT8.format(K=K, N=N).replace("threshold=0.0", "threshold=6.0")
    fake = trace(src, {}, mode="fake")
    assert any(str(g["value"]).startswith(f"{K:,} outlier columns") for g in fake.meta["guesses"]), fake.meta["guesses"]
    mixed = [e for e in fake.events if e.kind == "alloc" and e.op == "bitsandbytes.int8_mixed_scaled_mm.default"]
    assert 8 * K * 2 in [e.bytes for e in mixed]  # A[:, outlier_cols] in fp16, every column
    assert N * K * 4 in [e.bytes for e in mixed]  # the weights' outlier columns dequantized (CUDA)


OPTIM = """
import torch
import bitsandbytes as bnb
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda()
opt = bnb.optim.{name}(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randn(16, 512, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""
SHAPES = [(512, 512), (512,), (64, 512), (64,)]


def state_bytes_on_cpu(name: str) -> Counter:
    """The optimizer's state as bitsandbytes makes it on the CPU (same rules, same sizes): each
    state tensor once (the 8-bit code books are shared by all parameters)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    opt = getattr(bnb.optim, name)(model.parameters(), lr=1e-3)
    model(torch.randn(16, 512)).square().mean().backward()
    opt.step()
    seen, out = set(), Counter()
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and id(v) not in seen:
                seen.add(id(v))
                out[v.numel() * v.element_size()] += 1
    return out


def test_8bit_optimizer_state_bytes_equal_bitsandbytes():
    src = OPTIM.format(name="AdamW8bit")
    fake = trace(src, {}, mode="fake")
    real = trace(src, {}, mode="real")
    assert same_events(fake, real)
    states = Counter(e.bytes for e in fake.events if e.kind == "alloc" and e.category == "optimizer_state")
    assert states == state_bytes_on_cpu("AdamW8bit")
    # the rules: uint8 states + one fp32 absmax per 256 elements for tensors of 4096 elements
    # or more, fp32 states below; two 256-entry fp32 code books
    formula = Counter({256 * 4: 2})
    for shape in SHAPES:
        n = math.prod(shape)
        formula.update([n, n, math.ceil(n / 256) * 4, math.ceil(n / 256) * 4] if n >= 4096 else [n * 4, n * 4])
    assert states == formula
    assert "managed_bytes" not in fake.meta


@pytest.mark.parametrize("name", ["LAMB", "LAMB8bit", "LARS"])
def test_optimizers_clipping_by_the_weights_norm_run_in_fake_mode(name):
    # max_unorm > 0 (LAMB's and LARS's default; GaLore's AdamW8bit too) passes the weight's
    # norm, a 0-dim tensor, as the op's ``float param_norm``: C++ reads it (item() on a GPU)
    # and refused a fake tensor ("cannot extract float from tensor with meta storage")
    src = OPTIM.format(name=name)
    if name == "LARS":
        src = src.replace("lr=1e-3", "lr=1e-3, momentum=0.9")  # bitsandbytes' LARS needs momentum
    fake = trace(src, {}, mode="fake")
    real = trace(src, {}, mode="real")
    assert fake.mode == "fake"
    assert same_events(fake, real)
    assert any("bitsandbytes/functional.py" in str(g.get("where", "")) + str(g) for g in fake.meta["guesses"])


@pytest.mark.parametrize("name,itemsize", [("PagedAdamW8bit", 1), ("PagedAdamW32bit", 4)])
def test_paged_optimizer_states_are_unified_memory(name, itemsize):
    src = OPTIM.format(name=name)
    fake = trace(src, {}, mode="fake")
    real = trace(src, {}, mode="real")
    assert same_events(fake, real)
    # bitsandbytes pages the states of tensors of 100,000 elements and more: here the 512 x 512
    # weight's two states; the others stay in the caching allocator.
    paged = 2 * 512 * 512 * itemsize
    assert fake.meta["managed_bytes"] == real.meta["managed_bytes"] == paged
    states = [e.bytes for e in fake.events if e.kind == "alloc" and e.category == "optimizer_state"]
    assert 512 * 512 * itemsize not in states and states
    assert any(n.startswith(MANAGED_HEADLINE) for n in fake.meta["notes"])
    gpu = resolve_gpu("A100-80GB")
    est = estimate_trace(fake, gpu)
    without = estimate_trace(type(fake)(fake.events, fake.mode, fake.seconds,
                                        {k: v for k, v in fake.meta.items() if k != "managed_bytes"}), gpu)
    assert est.peak_device_bytes - without.peak_device_bytes == paged
    assert est.allocator_limit_bytes == without.allocator_limit_bytes  # the driver pages it out


QLORA = """
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
import bitsandbytes as bnb
cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, quantization_config=cfg, device_map={"": 0}, use_kernels=False)
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
kinds = sorted({type(m.weight).__name__ for m in model.modules() if type(m).__name__ == "Linear4bit"})
opt = bnb.optim.AdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4)
model.train()
for step in range(2):
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A small Llama saved from a config (outside any trace), to load with from_pretrained."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    path = tmp_path_factory.mktemp("llama")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    return str(path)


def test_qlora_from_pretrained_in_fake_mode(tiny_llama):
    ns = {"MODEL_DIR": tiny_llama}
    fake = trace(QLORA, ns, mode="fake")
    assert fake.mode == "fake" and ns["kinds"] == ["Params4bit"]
    real = trace(QLORA, dict(ns), mode="real", max_iterations=1)
    # loading and quantizing: the same events in both modes (up to the first training step;
    # in the step, transformers' mask code branches on values: a guess in fake mode)
    first = next(i for i, e in enumerate(real.events) if e.kind == "iteration")
    assert [key(e) for e in fake.events[:first]] == [key(e) for e in real.events[:first]]
    # every projection quantized: packed NF4 bytes (half a byte a weight) of 7 per layer
    weights = 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512)
    packed = sum(e.bytes for e in fake.events if e.kind == "alloc" and e.op == "bitsandbytes.quantize_4bit.default"
                 and e.category == "parameter")
    assert packed == weights // 2


def test_prequantized_checkpoint_loads_on_the_virtual_gpu(tiny_llama, tmp_path):
    """A 4-bit checkpoint (quantized on the CPU, saved, outside the trace) loaded with
    device_map: transformers would load it in worker threads; here in the calling thread, as
    the same events in both modes show, with the packed weights of the saved shapes."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, quantization_config=cfg, device_map="cpu",
                                                      use_kernels=False).save_pretrained(tmp_path)
    src = f"""
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, device_map={{"": 0}}, use_kernels=False)
kinds = sorted({{type(m.weight).__name__ for m in model.modules() if type(m).__name__ == "Linear4bit"}})
with torch.no_grad():
    model(input_ids=torch.randint(0, 1000, (2, 16), device="cuda"))
"""
    ns: dict = {}
    fake = trace(src, ns, mode="fake")
    real = trace(src, {}, mode="real")
    assert fake.mode == "fake" and ns["kinds"] == ["Params4bit"] and same_events(fake, real)
    packed = sum(e.bytes for e in fake.events if e.kind == "alloc" and e.dtype == "uint8" and len(e.shape) == 2
                 and e.shape[1] == 1)
    assert packed == 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512) // 2


TRAINER = """
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, quantization_config=cfg, device_map={"": 0}, use_kernels=False)
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
model = get_peft_model(model, LoraConfig(r=256, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
ids = torch.randint(0, 1000, (4, 32))
ds = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=2, max_steps=2, optim="paged_adamw_8bit",
                         bf16=True, report_to=[], save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=ds).train()
"""


def test_trainer_paged_adamw_8bit(tiny_llama, tmp_path):
    pytest.importorskip("datasets")
    tr = trace(TRAINER, {"MODEL_DIR": tiny_llama, "OUT": str(tmp_path)}, mode="fake")
    assert tr.mode == "fake"
    # LoRA r=256: the gate / up projections' B (512 x 256) and down's A (256 x 512) have
    # 131,072 elements, paged (two uint8 states each); the others stay below 100,000
    assert tr.meta["managed_bytes"] == 2 * 3 * 131072 * 2
    assert any(n.startswith(MANAGED_HEADLINE) for n in tr.meta["notes"])


def test_gemm_4bit_unfused_path_dequantizes_the_weight():
    src = """
import torch
import bitsandbytes as bnb
lin = bnb.nn.Linear4bit(1024, 2048, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
with torch.no_grad():
    lin(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16))
    lin(torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16))
"""
    tr = trace(src, {}, mode="fake")
    gemm = [e for e in tr.events if e.kind == "alloc" and e.op == "bitsandbytes.gemm_4bit.default"]
    # M = 1: the fused kernel, its output only; M = 2048 (above 1536): the output, then the
    # nested absmax dequantized and offset (fp32 per block of 64), the weight in bf16
    blocks = 1024 * 2048 // 64
    assert [e.bytes for e in gemm] == [2048 * 2, 2048 * 2048 * 2, blocks * 4, blocks * 4, 2048 * 1024 * 2]
    assert all(e.category == "temporary" for e in gemm)


def test_patches_are_undone_and_cost_nothing_without_bitsandbytes():
    from bitsandbytes.nn import Int8Params, Params4bit

    before = (vars(Params4bit)["__new__"], vars(Int8Params)["__new__"], vars(bnb.functional)["get_paged"],
              bnb.functional.name2qmap, list(sys.meta_path))
    trace(LINEAR4.format(K=K, N=N, double=True, qt="nf4", storage="torch.uint8"), {}, mode="fake")
    after = (vars(Params4bit)["__new__"], vars(Int8Params)["__new__"], vars(bnb.functional)["get_paged"],
             bnb.functional.name2qmap, list(sys.meta_path))
    assert all(a is b for a, b in zip(before[:4], after[:4])) and before[4] == after[4]
    assert "_make_subclass" not in vars(torch.Tensor)


def test_qdora_dequantizes_each_weight_for_its_norm(tiny_llama):
    """DoRA on a 4-bit model (peft ``use_dora=True``, "QDoRA"): each adapted layer's magnitude
    vector is a trainable parameter (one float32 per output feature), and each forward
    dequantizes the 4-bit weight to take its norms (``dequantize_module_weight``): a temporary of
    the whole weight in the compute dtype (bf16) per adapted layer, besides the matmul's own."""
    src = QLORA.replace('task_type="CAUSAL_LM")', 'task_type="CAUSAL_LM", use_dora=True)')
    tr = trace(src, {"MODEL_DIR": tiny_llama}, mode="fake")
    assert tr.mode == "fake"
    outs = [256, 128, 128, 256, 512, 512, 256] * 2  # q k v o gate up down (out, in), 2 layers
    ins = [256, 256, 256, 256, 256, 256, 512] * 2
    magnitudes = [e for e in tr.events if e.kind == "alloc" and e.category == "parameter"
                  and "lora_magnitude_vector" in (e.module or "")]
    assert sorted(e.bytes for e in magnitudes) == sorted(max(512, 4 * o) for o in outs)  # rounded up to 512
    plain = trace(QLORA, {"MODEL_DIR": tiny_llama}, mode="fake")

    def dequantized(t):
        return sorted(e.bytes for e in t.events if e.kind == "alloc" and e.iteration == 1 and e.phase == "forward"
                      and e.op == "bitsandbytes.dequantize_4bit.default" and e.bytes >= 2 * 128 * 256)

    extra = list(dequantized(tr))
    for b in dequantized(plain):
        extra.remove(b)
    assert sorted(extra) == sorted(2 * o * i for o, i in zip(outs, ins))  # one bf16 copy per layer, for its norm
