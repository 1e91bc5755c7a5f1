"""A torchrun training script: a Llama-style model under DistributedDataParallel, AdamW, fp32.

    torchrun --nproc-per-node 8 train_ddp.py
    xmem estimate train_ddp.py --gpu H100 --world-size 8 --set size='"8b"'
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from llama import Llama

size = "1b"
batch_size = 1
seq_len = 2048
steps = 2

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
torch.manual_seed(0)
model = DDP(Llama(size).cuda(), device_ids=[local_rank], gradient_as_bucket_view=True)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(steps):
    idx = torch.randint(0, 128256, (batch_size, seq_len + 1), device="cuda")
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
