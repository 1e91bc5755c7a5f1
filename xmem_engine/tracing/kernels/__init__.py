"""CUDA behaviour, re-created on the CPU: what a kernel or library allocates on the GPU where
the CPU run allocates differently (attention backends, reductions' staging buffers, kernels'
own temporaries, autocast's cast lists, einsum's lowering, backward's in-place gradient sums,
cuDNN's convolution problems).
"""
