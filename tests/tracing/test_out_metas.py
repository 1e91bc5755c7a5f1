"""Meta kernels for ``out=`` overloads torch lacks (``tracing/fake/out_metas.py``): Inductor's
``_scaled_mm(out=)`` stays in fake mode instead of running a real float8 matmul on the CPU."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from xmem_engine.tracing.fake.out_metas import out_variant_metas


def _no_fallback(*args, **kwargs):
    raise AssertionError("FakeTensorMode ran the real kernel")


def _scaled_mm_out(out: torch.Tensor) -> torch.Tensor:
    a = torch.empty(64, 32, dtype=torch.float8_e4m3fn)
    b = torch.empty(48, 32, dtype=torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants it
    scale = torch.ones((), dtype=torch.float32)
    return torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16, out=out)


def test_scaled_mm_out_is_answered_by_a_meta_kernel_and_resizes_out():
    with out_variant_metas() as registered, FakeTensorMode(allow_non_fake_inputs=True), \
            mock.patch("torch._subclasses.fake_tensor.run_fallback_kernel", _no_fallback):
        assert "_scaled_mm.out" in registered
        out = torch.empty(0, dtype=torch.bfloat16)
        result = _scaled_mm_out(out)
        assert result is out
        assert (tuple(out.shape), out.dtype) == ((64, 48), torch.bfloat16)
        with pytest.raises(RuntimeError, match="dtype"):
            _scaled_mm_out(torch.empty(64, 48, dtype=torch.float32))


def test_without_it_fake_mode_falls_back_to_the_real_kernel_and_the_meta_is_gone_after():
    with out_variant_metas():
        pass
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm.out", "Meta")
    with FakeTensorMode(allow_non_fake_inputs=True), \
            mock.patch("torch._subclasses.fake_tensor.run_fallback_kernel", _no_fallback):
        with pytest.raises(AssertionError, match="real kernel"):
            _scaled_mm_out(torch.empty(0, dtype=torch.bfloat16))
