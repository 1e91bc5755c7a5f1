"""The workload behind ``wed_medium_*.pickle``: Wedsonlin/assignment2-systems @ 8630bcf,
``cs336_systems/nsys_profile.py`` run as ``scripts/run_profile_configs.sh --size medium
--memory-profile true --pattern ...`` (its ``memory_profile``), with the course model of
``cs336-basics/cs336_basics`` at the same commit (vendored beside this file, MIT licence).

Same ops in the same order as the author's script; only the file writes are left out (the
snapshot dump). The recorded region is what follows ``torch.cuda.reset_peak_memory_stats()``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cs336_basics.model import BasicsTransformerLM  # noqa: E402
from cs336_basics.nn_utils import cross_entropy  # noqa: E402
from cs336_basics.optimizer import AdamW  # noqa: E402

# scripts/run_profile_configs.sh: medium = d_model 1024, d_ff 4096, 24 layers, 16 heads
vocab_size = 10000
context_length = 128
d_model, d_ff, num_layers, num_heads = 1024, 4096, 24, 16
warmup_steps = 5
autocast = False
pattern = "full-training-step"  # or "forward-only"

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = BasicsTransformerLM(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                            num_layers=num_layers, num_heads=num_heads, d_ff=d_ff)
model.to(device)
optimizer = AdamW(model.parameters())

# memory_profile(model, optimizer, device, "medium", warmup_steps, autocast, pattern)
execution_steps = 1
batch_size = 4
warmup_inputs = torch.randint(low=0, high=model.config["vocab_size"],
                              size=(warmup_steps, batch_size, model.config["context_length"]),
                              dtype=torch.long, device=device)
execution_inputs = torch.randint(low=0, high=model.config["vocab_size"],
                                 size=(execution_steps, batch_size, model.config["context_length"]),
                                 dtype=torch.long, device=device)
if pattern == "full-training-step":
    warmup_targets = torch.randint(low=0, high=model.config["vocab_size"],
                                   size=(warmup_steps, batch_size, model.config["context_length"]),
                                   dtype=torch.long, device=device)
    execution_targets = torch.randint(low=0, high=model.config["vocab_size"],
                                      size=(execution_steps, batch_size, model.config["context_length"]),
                                      dtype=torch.long, device=device)

if pattern == "forward-only":
    model.eval()
    with torch.inference_mode():
        for i in range(warmup_steps):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
                model(warmup_inputs[i])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=1000000)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            model(execution_inputs[0])
            torch.cuda.synchronize()
    peak_memory = torch.cuda.max_memory_allocated()
    torch.cuda.memory._record_memory_history(enabled=None)
elif pattern == "full-training-step":
    model.train()
    for i in range(warmup_steps):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            output = model(warmup_inputs[i])
            loss = cross_entropy(output, warmup_targets[i])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()

    del output, loss
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1000000)

    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        output = model(execution_inputs[0])
        loss = cross_entropy(output, execution_targets[0])
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    peak_memory = torch.cuda.max_memory_allocated()
    torch.cuda.memory._record_memory_history(enabled=None)
print(f"Peak memory allocated: {peak_memory / 1024 / 1024} MB")
