"""The target GPU: what it gives a training process, and what its CUDA libraries take.

* :mod:`~xmem_engine.gpus.catalog`: the GPU catalog (``data/gpus.toml`` plus the user's own
  file): memory, CUDA context, compute capability, cuBLAS workspace size, with a public
  source for every figure.
* :mod:`~xmem_engine.gpus.cuda_libraries`: what a CUDA run allocates that the CPU trace
  does not (cuBLAS / cuBLASLt workspaces, kernels loaded outside the allocator), by GPU
  and PyTorch version, so that switching either re-simulates without re-tracing.

Both wings read it: the tracer reports the GPU's properties to the user's code, the
estimate adds the libraries' memory before simulating the allocator.
"""

from xmem_engine.gpus.catalog import (
    ADD_GPU_HELP,
    DEFAULT_KERNEL_BYTES,
    ENV_VAR,
    GPU,
    NUMERIC_FIELDS,
    GPUCatalogError,
    UnknownGPUError,
    get_gpu,
    load_catalog,
)

__all__ = [
    "ADD_GPU_HELP",
    "DEFAULT_KERNEL_BYTES",
    "ENV_VAR",
    "GPU",
    "NUMERIC_FIELDS",
    "GPUCatalogError",
    "UnknownGPUError",
    "get_gpu",
    "load_catalog",
]
