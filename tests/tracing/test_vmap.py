"""``torch.vmap`` under the tracer: vmap's ``BatchedTensor`` has no storage of its own, and the
tracer asked every tensor for its storage ("Cannot access storage of BatchedTensorImpl"); the
fake fast paths' meta kernels, run inside vmap's batch-dim removal, gave a tensor that is not a
meta tensor ("elem.device.type must be 'meta', got cuda"). Flex attention builds its block mask
with nested vmaps, so transformers' and Unsloth's flex-attention models (Gemma 3 under Unsloth on
a bf16 GPU) stopped in fake mode."""

from __future__ import annotations

import pytest

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace

DEVICE_IN_VMAP = """
import torch
x = torch.zeros(4, 3, device="cuda")
def row(r):
    return (r > 0).to(r.device) & (r < 1).to(r.device)   # transformers' and_mask asks .device
out = torch.vmap(row)(x)
dev = str(out.device)
shape = tuple(out.shape)
"""

BLOCK_MASK = """
import torch
from torch.nn.attention.flex_attention import create_block_mask
def sliding_causal(b, h, q, kv):
    return (q >= kv) & (q - kv < 64)
mask = create_block_mask(sliding_causal, 2, 1, 256, 256, device="cuda")
shape = tuple(mask.kv_num_blocks.shape)
"""

# Per-sample gradients as torch.func's tutorial computes them: grad refuses to run under any
# saved-tensor hook ("don't yet support saved tensor hooks"), the tracer's own included, and the
# module hook met the transform's wrapped parameters ("Cannot access storage of TensorWrapper").
PER_SAMPLE_GRADS = """
import torch, torch.nn as nn
from torch.func import functional_call, grad, vmap
model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
params = {k: v.detach() for k, v in model.named_parameters()}
def loss_fn(p, x, y):
    return nn.functional.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))
x, y = torch.randn(64, 784, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
grads = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)
shape = tuple(grads["0.weight"].shape)
"""


@pytest.mark.parametrize("src", [DEVICE_IN_VMAP, BLOCK_MASK, PER_SAMPLE_GRADS],
                         ids=["device-in-vmap", "flex-block-mask", "per-sample-grads"])
def test_vmap_runs_in_fake_mode_as_in_real_mode(src):
    runs = {}
    for mode in ("fake", "real"):
        ns: dict = {}
        tr = trace(src, ns, mode=mode)
        assert tr.mode == mode
        runs[mode] = (tr, ns)
    (fake, fns), (real, rns) = runs["fake"], runs["real"]
    assert fns["shape"] == rns["shape"]
    assert fns.get("dev", "cuda:0") == rns.get("dev", "cuda:0") == "cuda:0"
    assert alloc_stream(fake) == alloc_stream(real)


# A PINN's Laplacian as torch.func writes it: torch's own FakeTensorMode (without xmem) loses a
# tensor to the meta device in the backward of forward-mode AD under vmap, and the estimate
# stopped with "found at least two devices, meta and cpu". Auto mode now runs it on real tensors.
HESSIAN_UNDER_VMAP = """
import torch, torch.nn as nn
from torch.func import functional_call, hessian, vmap
net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).cuda()
def u(p, x):
    return functional_call(net, p, (x.unsqueeze(0),)).squeeze()
x = torch.rand(64, 2, device="cuda")
H = vmap(hessian(u, argnums=1), in_dims=(None, 0))(dict(net.named_parameters()), x)
H.diagonal(dim1=-2, dim2=-1).sum(-1).pow(2).mean().backward()
shape = tuple(net[0].weight.grad.shape)
"""


def test_hessian_under_vmap_is_traced_on_real_tensors_when_fake_ones_lose_a_device():
    ns: dict = {}
    tr = trace(HESSIAN_UNDER_VMAP, ns)
    assert tr.mode == "real"
    assert "tanh_backward" in tr.meta["fallback"] and "meta device" in tr.meta["fallback"]
    assert ns["shape"] == (16, 2)
    real = trace(HESSIAN_UNDER_VMAP, {}, mode="real")
    assert [(e.kind, e.bytes) for e in tr] == [(e.kind, e.bytes) for e in real]
