"""``torch.cuda.FloatTensor`` and its kin on the virtual GPU (legacy_types.py): code from before
PyTorch 0.4 (PyTorch-GAN's ``Tensor = torch.cuda.FloatTensor``) asked the driver and stopped."""

from __future__ import annotations

import pytest
import torch

from xmem_engine.tracing import trace

LEGACY = """
import torch
Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
valid = Tensor(64, 1).fill_(1.0)                       # 256 B on the GPU
ids = torch.cuda.LongTensor([1, 2, 3])                 # 24 B
imgs = torch.randn(64, 784)
real_imgs = imgs.type(Tensor)                          # 200,704 B: moved and typed
half = real_imgs.type("torch.cuda.HalfTensor")         # 100,352 B
same = real_imgs.type(torch.cuda.FloatTensor) is real_imgs
back = real_imgs.type(torch.FloatTensor)               # to the host: nothing on the GPU
names = real_imgs.type(), back.type(), ids.type()
checks = isinstance(real_imgs, torch.cuda.FloatTensor), isinstance(back, torch.cuda.FloatTensor), isinstance(ids, Tensor)
where = str(back.device), str(half.dtype), str(valid.device)
torch.set_default_tensor_type(torch.cuda.FloatTensor)
made = torch.zeros(16)                                 # 64 B, on the GPU
torch.set_default_tensor_type(torch.FloatTensor)
host = str(torch.zeros(16).device)
"""


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_legacy_cuda_types_make_and_convert_as_on_a_gpu(mode):
    ns: dict = {}
    tr = trace(LEGACY, ns, mode=mode)
    assert ns["same"] is True
    assert ns["names"] == ("torch.cuda.FloatTensor", "torch.FloatTensor", "torch.cuda.LongTensor")
    assert ns["checks"] == (True, False, False)
    assert ns["where"] == ("cpu", "torch.float16", "cuda:0")
    assert ns["host"] == "cpu"
    gpu = [e.bytes for e in tr.events if e.kind == "alloc"]
    assert gpu == [256, 24, 200704, 100352, 64], gpu
    # nothing of it outlives the trace
    assert type(torch.cuda.FloatTensor).__name__ == "tensortype"
    assert torch.get_default_device() == torch.device("cpu") and torch.get_default_dtype() == torch.float32
