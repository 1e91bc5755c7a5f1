"""The workload behind the ``kk_*.pickle`` recordings: kkaitlyn111/cs336-a2-systems,
``cs336_systems/benchmark.py`` (the "2.7b" config, batch 4, vocab 10000; torch 2.6.0 on an H100),
with the author's own assignment-1 model (kkaitlyn111/cs336-assignment1 @ eae72a6:
``cs336_basics/transformer.py``, ``optimizers.py``, ``training.py``, vendored beside this file,
MIT licence). README.md beside this file says which code and which knobs made which recording.

Two harnesses of that benchmark.py:

- ``harness = "memory_files"`` (the ``memory_files/*.pickle`` recordings): its
  ``profile_memory_forward_fullstep()`` / ``run_memory_foward_fullstep()`` as at ebf6548. One
  process runs ``for forward_only in [True, False]: for context_length in [128, 256, 512]``, each
  run building a fresh model, AdamW and batch, then recording one forward (or one full step:
  zero_grad, forward, loss, backward, AdamW step, so Adam's state is created inside the
  recording), with ``torch.cuda.empty_cache()`` inside the recording. The previous runs' blocks
  stay cached in the allocator until that ``empty_cache()``, and the new model is built into
  them, so ``loop = True`` runs the loop's earlier iterations first and stops after the recorded
  one. ``loop = False`` runs the recorded one alone, first in its process (the c1c174d-era
  recordings ``memory_ctx128_forward`` / ``memory_ctx128_fullstep``, whose code had no
  ``empty_cache()``: ``empty_cache = False``).
- ``harness = "memory_logs"`` (``cs336_systems/memory_logs/memory_ctx128_*.pickle``): its
  ``profile_2_7b_memory_forward_and_fullstep()`` as at cd5e9db: the model is
  ``torch.compile``d, and the forward (then the full step) run under
  ``torch.autocast("cuda", dtype=torch.float32)``; compilation happens inside the recording.

Same ops in the same order as the author's code. Left out: the snapshot dumps, pandas tables and
logging (no GPU memory). ``torch.cuda.reset_peak_memory_stats()`` is called right before each
``_record_memory_history(...)``: the recorded region is what follows the last one. (The author
called it right after ``_record_memory_history`` with no GPU op between, or, in cd5e9db, after
an ``empty_cache()`` that had nothing to free.)
"""
import os
import sys
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cs336_basics  # noqa: E402,F401
from cs336_basics.transformer import TransformerLM  # noqa: E402
from cs336_basics.optimizers import AdamW  # noqa: E402
from cs336_basics.training import cross_entropy_loss  # noqa: E402

# benchmark.py also did `from cs336_systems import transformer_annotated` and then
# `cs336_basics.transformer = transformer_annotated`, after TransformerLM was imported, so the
# model stayed cs336_basics.transformer.TransformerLM (the recordings' frames are all in
# assignment1/cs336_basics/transformer.py); that no-op is left out.

# get_model_config('2.7b')
d_model = 2560
d_ff = 10240
num_layers = 32
num_heads = 32

batch_size = 4
vocab_size = 10000
theta = 10000

context_length = 128  # the recorded run's context length
mixed_precision = False  # autocast to bf16 (the model is given dtype=bf16 too; its weights stay fp32)
pattern = "fullstep"  # "forward" (forward_only=True) or "fullstep"
harness = "memory_files"  # or "memory_logs"
loop = True  # memory_files: run the author's loop up to the recorded run, in this process
context_lengths = [128, 256, 512]  # memory_files: the author's loop
empty_cache = True  # memory_files: empty_cache() inside the recording (ebf6548; not in the c1c174d-era code)


def run_memory_foward_fullstep(d_model: int, num_heads: int, d_ff: int, context_length: int, num_layers: int,
                batch_size: int = 4,
                vocab_size: int = 10000,
                theta: float = None,
                dtype: torch.dtype | None = None,
                model_size: str = None, mixed_precision: bool = False, forward_only: bool = False):

    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')

    model = TransformerLM(d_model = d_model, d_ff = d_ff, vocab_size = vocab_size,
                          context_length = context_length, num_heads = num_heads, num_layers = num_layers,
                          theta = theta, device = device, dtype = dtype)
    #model = torch.compile(model)
    model.to(device)

    # Add optimizer and loss function (custom, matching your usual setup)
    optimizer = AdamW(
        model.parameters(),
        lr=1e-4,  # You can adjust this or make it an argument
        weight_decay=0.01,
        eps=1e-8,
        betas=(0.9, 0.95)
    )
    loss_fn = cross_entropy_loss  # Use as a function, not instantiated

    # generate random batch of data
    batch = torch.randint(low=0, high=vocab_size, size=(batch_size, context_length))
    batch = batch.to(device)

    # Prepare inputs and targets for language modeling
    inputs = batch
    targets = batch

    casting = torch.autocast(device_type='cuda',dtype=dtype) if mixed_precision else nullcontext()

    with casting:
        # the recorded region starts here (the author reset the peak right after this call)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.memory._record_memory_history(max_entries=1000000)

        if forward_only:
            if empty_cache:
                torch.cuda.empty_cache()
            torch.cuda.synchronize()
            logits = model(inputs)
            torch.cuda.synchronize()
        else:
        # Full training step timing with optimizer
            if empty_cache:
                torch.cuda.empty_cache()
            torch.cuda.synchronize()
            optimizer.zero_grad()
            logits = model(inputs)
            loss = loss_fn(logits, targets)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()

    peak_memory = torch.cuda.max_memory_allocated(device) / (1024 ** 2)  # Convert bytes to MB

    # torch.cuda.memory._dump_snapshot(full_path)  (left out: no file writes)
    torch.cuda.memory._record_memory_history(enabled=None)

    return peak_memory


def profile_memory_forward_fullstep():
    if mixed_precision:
        dtype = torch.bfloat16
    else:
        dtype = torch.float32
        torch.set_float32_matmul_precision('high')

    # the author's order: for forward_only in [True, False]: for context_length in context_lengths
    runs = [(forward_only, ctx) for forward_only in [True, False] for ctx in context_lengths]
    recorded = (pattern == "forward", context_length)
    if not loop or recorded not in runs:
        runs = [recorded]
    runs = runs[:runs.index(recorded) + 1]  # stop after the recorded run

    for forward_only, ctx in runs:
        print(f"[INFO] memory profiling: context length {ctx}, forward_only={forward_only}, "
              f"mixed precision {mixed_precision}")
        peak_memory = run_memory_foward_fullstep(
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            context_length=ctx,
            num_layers=num_layers,
            batch_size=batch_size,
            vocab_size=vocab_size,
            theta=theta,
            dtype=dtype,
            model_size='2.7b',
            mixed_precision=mixed_precision,
            forward_only=forward_only
        )
        print(f"[INFO]   peak memory {peak_memory:.2f} MB")


def profile_2_7b_memory_forward_and_fullstep():
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    dtype = torch.bfloat16 if mixed_precision else torch.float32  # the author's: torch.float32
    torch.set_float32_matmul_precision('high')
    # Model setup
    model = TransformerLM(
        d_model=d_model, d_ff=d_ff, vocab_size=vocab_size,
        context_length=context_length, num_heads=num_heads, num_layers=num_layers,
        theta=theta, device=device, dtype=dtype
    )
    model = torch.compile(model)
    model.to(device)
    optimizer = AdamW(
        model.parameters(),
        lr=1e-4, weight_decay=0.01, eps=1e-8, betas=(0.9, 0.95)
    )
    loss_fn = cross_entropy_loss
    batch = torch.randint(low=0, high=vocab_size, size=(batch_size, context_length), device=device)
    inputs = batch
    targets = batch
    # Forward pass only
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=1000000)
    torch.cuda.empty_cache()
    # (the author's torch.cuda.reset_peak_memory_stats(device) was here: moved up)
    with torch.autocast(device_type='cuda', dtype=dtype):
        logits = model(inputs)
    torch.cuda.synchronize()
    # torch.cuda.memory._dump_snapshot("memory_ctx128_forward.pickle")  (left out)
    torch.cuda.memory._record_memory_history(enabled=None)
    if pattern == "forward":
        return
    # Full training step (zero_grad, forward, backward, optimizer step)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=1000000)
    torch.cuda.empty_cache()
    # (the author's torch.cuda.reset_peak_memory_stats(device) was here: moved up)
    with torch.autocast(device_type='cuda', dtype=dtype):
        optimizer.zero_grad()
        logits = model(inputs)
        loss = loss_fn(logits, targets)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    # torch.cuda.memory._dump_snapshot("memory_ctx128_fullstep.pickle")  (left out)
    torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == '__main__':
    if harness == "memory_logs":
        profile_2_7b_memory_forward_and_fullstep()
    else:
        profile_memory_forward_fullstep()
