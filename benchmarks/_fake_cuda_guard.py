"""A no-op CUDA device guard for torch older than 2.7 on a CUDA build with no driver.

``torch.compile`` for a CUDA target on the CPU needs the ``cuda`` fake tensors' device guard to
ask no driver. From torch 2.7, ``torch._C._ensureCUDADeviceGuardSet()`` puts c10's
``FakeGuardImpl<CUDA>`` in place where the CUDA guard sees no device, and xmem calls it
(``tracing/compiler/torch_compile.py``). torch 2.6 has no such call, so its Dynamo failed at the
first indexing of a ``cuda`` fake ("CUDA driver version is insufficient"). This registers the
same ``FakeGuardImpl`` through c10's public ``DeviceGuardImplRegistrar`` from a small C++
extension built on first use (about 15 s; g++ and the wheel's headers).

Benchmarks only: ``recordings.py`` traces the compiled kk recording under the torch that made it
(2.6), outside xmem's supported 2.10-2.14.
"""

from __future__ import annotations

from pathlib import Path

import torch

_SOURCE = r"""
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <torch/extension.h>

static c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_cuda_guard;

void use_fake_cuda_guard() {
  static c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::CUDA, &fake_cuda_guard);
}
"""


def needed() -> bool:
    """A CUDA build of a torch without ``_ensureCUDADeviceGuardSet`` and no driver here."""
    return (not hasattr(torch._C, "_ensureCUDADeviceGuardSet") and torch.cuda._is_compiled()
            and torch._C._cuda_getDeviceCount() == 0)


def ensure() -> bool:
    """Register the no-op guard where :func:`needed`; whether it did."""
    if not needed():
        return False
    from torch.utils.cpp_extension import load_inline

    build = Path(__file__).resolve().parent / ".build" / f"fake_cuda_guard-{torch.__version__}"
    build.mkdir(parents=True, exist_ok=True)
    mod = load_inline("xmem_fake_cuda_guard", cpp_sources=[_SOURCE], functions=["use_fake_cuda_guard"],
                      build_directory=str(build))
    mod.use_fake_cuda_guard()
    return True
