"""Loading a Hugging Face checkpoint onto the virtual GPU (transformers 5.x), no quantization.

transformers 5 loads a checkpoint's tensors in worker threads, outside the tracer's
thread-local modes; they reached the real CUDA ("no NVIDIA driver") until traces load them in
the calling thread (``HF_DEACTIVATE_ASYNC_LOAD``)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")


def _saved_llama(path, **sizes):
    """A small Llama's config, its checkpoint saved at ``path`` (nothing can be downloaded)."""
    cfg = transformers.LlamaConfig(**sizes)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return cfg


def test_from_pretrained_with_a_device_map_loads_onto_the_virtual_gpu(tmp_path):
    import torch

    from xmem_engine.tracing import trace

    cfg = _saved_llama(tmp_path, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    code = (f"import torch, transformers\n"
            f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, device_map={{'': 0}},\n"
            f"    dtype=torch.bfloat16)\n"
            f"assert m.device.type == 'cuda', m.device\n"
            f"m(torch.ones(2, 16, dtype=torch.long, device='cuda')).logits.sum().backward()\n")
    tr = trace(code, {}, mode="fake")
    weights = sum(e.bytes for e in tr.events if e.kind == "alloc" and e.category == "parameter")
    n = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert weights >= 2 * n  # every weight on the GPU, in bf16 (tied or not, at least once)
    import os

    assert "HF_DEACTIVATE_ASYNC_LOAD" not in os.environ and "USE_HUB_KERNELS" not in os.environ
    # transformers 5 would fetch Hub kernels for a model on cuda (a download; CUDA code): off, and said
    assert any("USE_HUB_KERNELS=NO" in n for n in tr.meta["notes"])


def test_device_map_auto_offloads_to_the_cpu_and_each_offloaded_layer_visits_the_gpu(tmp_path):
    """``device_map="auto"`` with more weights than the GPU takes: accelerate keeps what fits on
    the GPU and offloads the rest, whose hooks bring a layer's weights to the GPU for its forward
    and put them back on ``meta`` after it. That had failed (``FakeTensor(meta, requires_grad=...)``,
    accelerate rebuilding a parameter from its class), then kept every offloaded layer on the GPU
    (a ``meta`` copy counted as a GPU allocation)."""
    from xmem_engine.tracing import trace

    _saved_llama(tmp_path, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=8000)
    code = (f"import torch, transformers\n"
            f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, device_map='auto',\n"
            f"    max_memory={{0: '12MiB', 'cpu': '1GiB'}}, dtype=torch.float16)\n"
            f"places = set(m.hf_device_map.values())\n"
            f"loaded = torch.cuda.memory_allocated()\n"
            f"with torch.no_grad():\n"
            f"    m(torch.ones(1, 8, dtype=torch.long, device='cuda'))\n"
            f"    after = torch.cuda.memory_allocated()\n"
            f"peak = torch.cuda.max_memory_allocated()\n")
    ns: dict = {}
    trace(code, ns, mode="fake")
    layer = 2 * (4 * 256 * 256 + 3 * 256 * 1024)  # one decoder layer's fp16 weights
    assert ns["places"] == {0, "cpu"}
    assert ns["after"] == ns["loaded"]  # the offloaded layers went back to meta
    assert ns["peak"] >= ns["loaded"] + layer  # ...after each visited the GPU
