"""A batch-size search written by hand: start large, and on ``torch.cuda.OutOfMemoryError``
free what the failed try held, empty the cache and halve, until a training step runs. Full
fine-tuning of a GPT-2 model in fp32 with AdamW, blocks of 1024 tokens, from a batch of 256.

Pattern: PyTorch docs, "Frequently Asked Questions", "My out of memory exception handler can't
allocate memory" (https://pytorch.org/docs/stable/notes/faq.html): the step runs in a function,
and the recovery happens outside the ``except`` clause, once the failed try's frames are gone.

Stands for GPT-2 medium (355M; its config, written in code: nothing can be downloaded).
"""
import gc

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024)
model = GPT2LMHeadModel(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def train_steps(batch_size, steps=2):
    for _ in range(steps):
        ids = torch.randint(0, config.vocab_size, (batch_size, 1024), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


batch_size = 256
while batch_size > 0:
    oom = False
    try:
        train_steps(batch_size)
    except torch.cuda.OutOfMemoryError:
        oom = True
    if not oom:
        break
    print(f"batch size {batch_size}: out of memory, halving")
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    batch_size //= 2
print("trains at batch size", batch_size, "peak", torch.cuda.max_memory_allocated() / 2**30, "GiB")
