"""A torchrun training script: a Llama-style model sharded with FSDP2 (``fully_shard`` on each
block, then on the root), AdamW, fp32 parameters (or bf16 compute with ``mixed_precision``).

    torchrun --nproc-per-node 8 train_fsdp2.py
    xmem estimate train_fsdp2.py --gpu H100 --world-size 8 --set size='"8b"'
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from llama import Llama

size = "1b"
batch_size = 1
seq_len = 2048
steps = 2
reshard_after_forward = True
mixed_precision = False  # bf16 parameters in forward and backward, fp32 gradients reduced
cpu_offload = False

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
torch.manual_seed(0)
with torch.device("meta"):
    model = Llama(size)
kw = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
if mixed_precision:
    kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
if cpu_offload:
    kw["offload_policy"] = CPUOffloadPolicy()
for layer in model.layers:
    fully_shard(layer, **kw)
fully_shard(model, **kw)
model.to_empty(device="cpu" if cpu_offload else "cuda")
for p in model.parameters():
    torch.nn.init.normal_(p, std=0.02)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(steps):
    idx = torch.randint(0, 128256, (batch_size, seq_len + 1), device="cuda")
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
