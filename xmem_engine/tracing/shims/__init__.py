"""What keeps users' scripts running under the tracer as they run on a GPU: one rank of a
``torchrun`` launch, checkpoints of fake tensors, packed sequences, DTensors, bitsandbytes,
``generate()``, transformers' tracing checks, Triton launches, Unsloth's weight checks.
"""
