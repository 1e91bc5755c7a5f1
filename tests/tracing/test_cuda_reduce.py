"""The port of gpu_reduce_kernel's scratch buffers (xmem_engine/tracing/kernels/cuda_reduce.py).

The recorded cases come from ../shared/allocator-traces (real GPUs); their figures are repeated
here so the pure tests run without them, and the recording tests re-read the recordings.

* kk_memory_files_memory_ctx{128,256,512}_full*.pickle: H100 SXM (132 SMs, 2048 threads/SM),
  torch 2.6.0+cu124, kkaitlyn111's 2.7B model (d_model 2560, batch 4, vocab 10000):
  - ``sum(dim=-1)`` of an RMSNorm gradient (4, ctx, 2560) laid out d-major (strides
    (ctx, 1, 4*ctx), from einsum's backward): 65 per step;
  - ``max(dim=-1)`` and ``sum(dim=-1)`` of the logits, reshaped to (4*ctx, 10000) and laid out
    vocabulary-major (strides (1, 4*ctx)): one each.
  The layouts are the only ones the semaphore sizes allow (grid.x = 4*ctx / 4 / 32); with the
  reduced dim contiguous these reductions allocate nothing.
* wed_medium_{128,256,512,1024}_training.pickle: torch 2.11.0+cu130, a consumer (non-Hopper)
  GPU: RMSNorm weight gradients, ``sum`` of (4, ctx, 1024) float32 over dims (0, 1): 49 per
  step, none at ctx 128. Every SM count >= 43 (at 1536 threads/SM; >= 32 at 2048) gives the
  recorded sizes, so the recordings do not pin the GPU down.
* sil_mem_snapshot.pickle: a v2.6-era build (no input_vec_size in the kernel's name): a full
  ``sum()`` of 524288 float32 to a scalar.
"""

from __future__ import annotations

import functools
import re

import pytest
from conftest import TRACES, needs_shared_traces

from xmem_engine.tracing.kernels.cuda_reduce import (
    ReduceBuffers,
    ReducePlan,
    kernel_params,
    reduce_buffers,
    reduce_config,
    reduce_plan,
)

H100 = {"sm_count": 132, "max_threads_per_sm": 2048}
CONSUMER_SMS = (170, 84, 70, 48)  # RTX 5090, 5080, 5070 Ti, 5070 (1536 threads/SM)


def contiguous(shape):
    st, run = [], 1
    for s in reversed(shape):
        st.append(run)
        run *= s
    return tuple(reversed(st))


# --------------------------------------------------------------------------- recorded figures
KK_RMS_GRAD = {128: (10485760, 16), 256: (20971520, 32), 512: (41943040, 64)}
KK_LOGITS_MAX = {128: (164626432, 16), 256: (329252864, 32), 512: (553648128, 64)}
KK_LOGITS_SUM = {128: (41156608, 16), 256: (82313216, 32), 512: (138412032, 64)}
WED_WEIGHT_GRAD = {128: (0, 0), 256: (8388608, 32), 512: (16777216, 32), 1024: (33554432, 32)}


def kk_rms_grad(ctx):
    return reduce_buffers((4, ctx, 2560), (ctx, 1, 4 * ctx), (2,), 4, 4, 4, **H100, torch_version="2.6.0")


def kk_logits(ctx, op):
    vt0, ivs, acc = kernel_params(op, "float32", "2.6.0")
    outs = (4, 8) if op == "max_dim" else 4
    return reduce_buffers((4 * ctx, 10000), (1, 4 * ctx), (-1,), 4, acc, outs, **H100, vt0=vt0,
                          input_vec_size=ivs, torch_version="2.6.0")


def wed_weight_grad(ctx, sm, threads=1536):
    shape = (4, ctx, 1024)
    vt0, ivs, acc = kernel_params("sum", "float32", "2.11")
    return reduce_buffers(shape, contiguous(shape), (0, 1), 4, acc, 4, sm, threads, vt0, ivs, "2.11.0+cu130")


@pytest.mark.parametrize("ctx", [128, 256, 512])
def test_h100_rmsnorm_grad_sum_over_a_strided_last_dim(ctx):
    assert kk_rms_grad(ctx) == ReduceBuffers(*KK_RMS_GRAD[ctx])


@pytest.mark.parametrize("ctx", [128, 256, 512])
def test_h100_vocab_wide_max_and_sum(ctx):
    assert kk_logits(ctx, "max_dim") == ReduceBuffers(*KK_LOGITS_MAX[ctx])
    assert kk_logits(ctx, "sum") == ReduceBuffers(*KK_LOGITS_SUM[ctx])
    # the same view as a 3-d tensor: coalescing makes it the same iteration
    three_d = reduce_buffers((4, ctx, 10000), (ctx, 1, 4 * ctx), (2,), 4, 4, 4, **H100, torch_version="2.6")
    assert three_d == ReduceBuffers(*KK_LOGITS_SUM[ctx])


@pytest.mark.parametrize("ctx", [128, 256, 512])
def test_h100_contiguous_layouts_would_allocate_nothing(ctx):
    shape = (4, ctx, 2560)
    assert reduce_buffers(shape, contiguous(shape), (2,), 4, 4, 4, **H100, torch_version="2.6") == ReduceBuffers(0, 0)
    assert reduce_buffers((4 * ctx, 10000), (10000, 1), (1,), 4, 16, (4, 8), **H100,
                          torch_version="2.6") == ReduceBuffers(0, 0)


@pytest.mark.parametrize("sm", CONSUMER_SMS)
@pytest.mark.parametrize("ctx", [128, 256, 512, 1024])
def test_rmsnorm_weight_grad_on_the_consumer_gpu(ctx, sm):
    assert wed_weight_grad(ctx, sm) == ReduceBuffers(*WED_WEIGHT_GRAD[ctx])


def test_consumer_gpu_sm_count_is_only_bounded_below():
    fits = [sm for sm in range(16, 200)
            if all(wed_weight_grad(ctx, sm) == ReduceBuffers(*WED_WEIGHT_GRAD[ctx]) for ctx in WED_WEIGHT_GRAD)]
    assert fits == list(range(43, 200))
    fits_2048 = [sm for sm in range(16, 200)
                 if all(wed_weight_grad(ctx, sm, 2048) == ReduceBuffers(*WED_WEIGHT_GRAD[ctx])
                        for ctx in WED_WEIGHT_GRAD)]
    assert fits_2048 == list(range(32, 200))


@pytest.mark.parametrize("sm,threads", [(132, 2048), (108, 2048), (128, 1536), (46, 1536)])
def test_full_sum_to_a_scalar_recorded(sm, threads):
    # sil_mem_snapshot.pickle: sum() of 524288 float32 (the sum of a (.., 2097152 B) output)
    assert reduce_buffers((524288,), (1,), (), 4, 4, 4, sm, threads, torch_version="2.6") == ReduceBuffers(256, 4)


# --------------------------------------------------------------------------- edge cases
def test_small_contiguous_last_dim_reduction_allocates_nothing():
    for shape in [(8, 1024), (4, 128, 1024), (2, 3)]:
        for v in ("2.6", "2.11", None):
            assert reduce_buffers(shape, contiguous(shape), (-1,), 4, 4, 4, **H100,
                                  torch_version=v) == ReduceBuffers(0, 0)


def test_full_reduction_of_a_big_tensor():
    # 8192 x 8192 float32 -> one output: block 512 x 1, target grid 132 * 4 = 528 blocks,
    # ctas_per_output = max(min(528, 131072 / 16), 131072 / 256) = 528
    shape = (8192, 8192)
    got = reduce_buffers(shape, contiguous(shape), (), 4, 4, 4, **H100)
    assert got == ReduceBuffers(4 * 528, 4)
    cfg, = reduce_config(shape, contiguous(shape), (0, 1), 4, 4, 4, **H100)
    assert (cfg.block_width, cfg.block_height, cfg.ctas_per_output) == (512, 1, 528)
    assert cfg.vectorize_input and cfg.grid() == (1, 528)
    # the transposed view reduces the same memory the same way
    assert reduce_buffers((8192, 8192), (1, 8192), (), 4, 4, 4, **H100) == got


def test_reduced_dims_order_and_size_one_dims_do_not_matter():
    shape = (4, 256, 1, 1024)
    base = reduce_buffers(shape, contiguous(shape), (0, 1), 4, 4, 4, 84, 1536)
    assert base == ReduceBuffers(*WED_WEIGHT_GRAD[256])
    assert reduce_buffers(shape, contiguous(shape), (1, 0, 2), 4, 4, 4, 84, 1536) == base
    assert reduce_buffers(shape, contiguous(shape), (-4, -3), 4, 4, 4, 84, 1536) == base


def test_output_vectorization_follows_alignment():
    shape = (4, 1024, 1024)
    aligned, = reduce_config(shape, contiguous(shape), (0, 1), 4, 4, 4, **H100)
    odd, = reduce_config(shape, contiguous(shape), (0, 1), 4, 4, 4, **H100, input_offset=1)
    assert aligned.output_vec_size == 4 and odd.output_vec_size == 1
    assert aligned.buffers() != odd.buffers()
    # 1022 outputs: the output dim is only even
    shape = (4096, 1022)
    two, = reduce_config(shape, contiguous(shape), (0,), 4, 4, 4, **H100)
    assert two.output_vec_size == 2


def test_vectorize_along_input_changed_in_2_10():
    # bf16 sum of 3000 contiguous values per output: dim0 / 4 = 750 (v2.9) vs dim0 / 8 = 375 (v2.10)
    shape = (1, 3000)
    vt0, ivs_old, _ = kernel_params("sum", "bfloat16", "2.9")
    old = reduce_config(shape, (3000, 1), (1,), 2, 4, 2, **H100, vt0=vt0, input_vec_size=ivs_old,
                        torch_version="2.9")[0]
    vt0, ivs_new, _ = kernel_params("sum", "bfloat16", "2.10")
    new = reduce_config(shape, (3000, 1), (1,), 2, 4, 2, **H100, vt0=vt0, input_vec_size=ivs_new,
                        torch_version="2.10")[0]
    assert old.block_width == 512 and new.block_width == 256
    # 128 values: v2.6-v2.9 vectorize only above 128, v2.10 from 128
    assert not reduce_config((64, 128), (128, 1), (1,), 4, 4, 4, **H100, torch_version="2.9")[0].vectorize_input
    assert reduce_config((64, 128), (128, 1), (1,), 4, 4, 4, **H100, torch_version="2.10")[0].vectorize_input
    # v2.6: Welford (vt0 = 2) never vectorizes (vt0 >= ReduceConfig::input_vec_size = 4 fails)
    args = ((64, 4096), (4096, 1), (1,), 4, 16, 4)
    assert not reduce_config(*args, **H100, vt0=2, torch_version="2.6")[0].vectorize_input
    assert reduce_config(*args, **H100, vt0=2, torch_version="2.7")[0].vectorize_input


def test_semaphores_and_buffer_order():
    plan = reduce_plan((4, 512, 2560), (512, 1, 2048), (2,), 4, 4, 4, **H100, torch_version="2.6")
    assert plan == ReducePlan((ReduceBuffers(*KK_RMS_GRAD[512]),))
    assert plan.steps() == [("alloc", "reduce_buffer0", 41943040), ("alloc", "reduce_semaphores0", 64),
                            ("free", "reduce_semaphores0", 0), ("free", "reduce_buffer0", 0)]
    assert reduce_plan((8, 64), (64, 1), (1,), 4, 4, 4, **H100).steps() == []


def test_huge_reductions_split_for_32_bit_indexing():
    # 2**31 bfloat16 values summed over the last dim into bfloat16: 2 launches of 32768 rows
    # (each spans 1 + 32767 * 2 + 32767 * 65536 = 2**31 - 1 bytes: just fits), and an
    # AccumulationBuffer of float for the whole output (65536 * 4 B)
    shape = (65536, 32768)
    vt0, ivs, acc = kernel_params("sum", "bfloat16")
    plan = reduce_plan(shape, contiguous(shape), (1,), 2, acc, 2, **H100, vt0=vt0, input_vec_size=ivs)
    assert len(plan.launches) == 2 and plan.accumulation_bytes == 65536 * 4
    assert plan.steps() == [("alloc", "acc_buffer", 262144), ("free", "acc_buffer", 0)]
    # into float32 the output can accumulate: no AccumulationBuffer
    assert reduce_plan(shape, contiguous(shape), (1,), 2, 4, 4, **H100, vt0=vt0,
                       input_vec_size=ivs).accumulation_bytes == 0
    # split launches that reduce globally: 2**30 float32 (4 GiB) summed over dim 0 into 8
    # outputs: two halves of 2**26 rows; each: output_vec_size 4, block 2 x 64, grid (1, 4096)
    # (ctas = max(min(2112, 2**20 / 16), 2**20 / 256)), buffer 4 B * 8 * 4096 * (2 * 4)
    shape = (2**27, 8)
    plan = reduce_plan(shape, contiguous(shape), (0,), 4, 4, 4, **H100)
    assert plan == ReducePlan((ReduceBuffers(1048576, 4),) * 2)
    assert reduce_plan((2**26, 8), (8, 1), (0,), 4, 4, 4, **H100) == ReducePlan((ReduceBuffers(1048576, 4),))
    assert reduce_buffers(shape, contiguous(shape), (0,), 4, 4, 4, **H100) == max(
        plan.launches, key=lambda b: b.buffer_bytes)


def test_empty_and_scalar_inputs():
    assert reduce_plan((0, 1024), (1024, 1), (1,), 4, 4, 4, **H100).launches == ()
    assert reduce_buffers((0, 1024), (1024, 1), (1,), 4, 4, 4, **H100) == ReduceBuffers(0, 0)
    assert reduce_buffers((), (), (), 4, 4, 4, **H100) == ReduceBuffers(0, 0)
    assert reduce_buffers((1, 1), (1, 1), (0,), 4, 4, 4, **H100) == ReduceBuffers(0, 0)


def test_kernel_params():
    assert kernel_params("sum", "float32", "2.6.0") == (4, 4, 4)
    assert kernel_params("sum", "bfloat16", "2.9") == (4, 4, 4)
    assert kernel_params("sum", "torch.bfloat16", "2.10") == (4, 8, 4)
    assert kernel_params("mean", "float16", (2, 11)) == (4, 8, 4)
    assert kernel_params("sum", "float64") == (4, 4, 8)
    assert kernel_params("max_dim", "bfloat16") == (4, 4, 16)
    assert kernel_params("amax", "bfloat16") == (4, 4, 2)
    assert kernel_params("norm", "bfloat16") == (4, 4, 4)
    assert kernel_params("var", "float32") == (2, 2, 16)
    assert kernel_params("std", "float64") == (2, 2, 32)
    assert kernel_params("any", "float32") == (4, 4, 1)
    with pytest.raises(ValueError):
        kernel_params("cumsum", "float32")


def test_bad_arguments():
    with pytest.raises(ValueError):
        reduce_buffers((4, 4), (4,), (0,), 4, 4, 4, **H100)
    with pytest.raises(ValueError):
        reduce_buffers((4, 4), (4, 1), (2,), 4, 4, 4, **H100)


# --------------------------------------------------------------------------- recordings
@functools.cache
def recorded_reduce_pairs(name: str) -> tuple[tuple[int, int, str], ...]:
    """(buffer, semaphores, kernel template arguments) of every gpu_reduce_kernel launch that
    allocated, checking the order: buffer, semaphores, free semaphores, free buffer."""
    from xmem_engine.simulation.snapshot import load_snapshot

    trace = load_snapshot(TRACES / name)["device_traces"][0]
    pairs, live = [], []
    for e in trace:
        names = [f.get("name", "") for f in e.get("frames") or []]
        kernel = next((n for n in names if "gpu_reduce_kernel<" in n), None)
        if kernel is None:
            continue
        if e["action"] == "alloc":
            live.append(e)
            if len(live) == 2:
                buf, sem = live
                args = re.match(r".*?gpu_reduce_kernel<([^<]*?), ([^<]*?), (\d+)(?:, (\d+))?, ", kernel)
                kind = "max" if "MaxOps" in kernel else "sum" if "sum_functor" in kernel else "other"
                pairs.append((buf["size"], sem["size"], kind + ":" + ",".join(g for g in args.groups() if g)))
        elif e["action"] == "free_requested":
            assert live and e["addr"] == live[-1]["addr"], "the semaphores go before the buffer"
            live.pop()
    assert not live
    return tuple(pairs)


@needs_shared_traces
@pytest.mark.parametrize("ctx", [128, 256, 512, 1024])
def test_recorded_wed_weight_grads(ctx):
    pairs = recorded_reduce_pairs(f"wed_medium_{ctx}_training.pickle")
    expected = WED_WEIGHT_GRAD[ctx]
    if expected == (0, 0):
        assert pairs == ()
        return
    assert len(pairs) == 49  # 24 layers x 2 RMSNorms + the final one
    assert set(pairs) == {(*expected, "sum:float,float,4,4")}
    for sm in CONSUMER_SMS:
        assert wed_weight_grad(ctx, sm) == ReduceBuffers(*expected)


@needs_shared_traces
@pytest.mark.parametrize("name,ctx", [("kk_memory_files_memory_ctx128_fullstep.pickle", 128),
                                      ("kk_memory_files_memory_ctx128_fullstep_.pickle", 128),
                                      ("kk_memory_files_memory_ctx256_fullstep_.pickle", 256),
                                      ("kk_memory_files_memory_ctx512_fullstep_.pickle", 512)])
def test_recorded_h100_reductions(name, ctx):
    pairs = recorded_reduce_pairs(name)
    sums = [p[:2] for p in pairs if p[2] == "sum:float,float,4" and p[:2] != KK_LOGITS_SUM[ctx]]
    maxes = [p for p in pairs if p[2] == "max:float,float,4"]
    logit_sums = [p for p in pairs if p[:2] == KK_LOGITS_SUM[ctx] and p[2] == "sum:float,float,4"]
    assert len(pairs) == 67 and len(maxes) == 1 and len(logit_sums) == 1
    assert set(sums) == {KK_RMS_GRAD[ctx]} and len(sums) == 65  # 32 layers x 2 RMSNorms + final
    assert kk_rms_grad(ctx) == ReduceBuffers(*KK_RMS_GRAD[ctx])
    assert kk_logits(ctx, "max_dim") == ReduceBuffers(*maxes[0][:2])
    assert kk_logits(ctx, "sum") == ReduceBuffers(*logit_sums[0][:2])


@needs_shared_traces
def test_recorded_full_sum():
    assert recorded_reduce_pairs("sil_mem_snapshot.pickle") == ((256, 4, "sum:float,float,4"),)
    assert reduce_buffers((524288,), (1,), (), 4, 4, 4, **H100, torch_version="2.6") == ReduceBuffers(256, 4)


def test_a_trace_re_simulated_for_another_gpu_has_that_gpu_s_reduction_buffers():
    """Reduction staging buffers follow the SM count: an estimate for another GPU sizes them
    again (``Trace.meta["by_sm"]``), event for event as a trace made for that GPU has them, so
    switching the GPU (widget, sweep) needs no re-trace."""
    from pathlib import Path

    from xmem_engine.estimate import estimate_trace
    from xmem_engine.gpus import get_gpu
    from xmem_engine.tracing import trace_script
    from xmem_engine.tracing.kernels.cuda_temporaries import resized_by_sm

    script = str(Path(__file__).resolve().parents[1] / "advise_scripts" / "transformer.py")
    gpus = ["RTX-4060-8GB", "H100-SXM-80GB", "T4"]  # 24, 132 and 40 SMs
    traces = {g: trace_script(script, mode="fake", device=get_gpu(g).properties(), overrides={"batch_size": "2"})
              for g in gpus}
    assert traces[gpus[0]].meta["by_sm"]["groups"]

    def seq(events):
        return [(e.kind, e.bytes, e.op) for e in events]

    for a in gpus:
        for b in gpus:
            g = get_gpu(b)
            resized = resized_by_sm(traces[a], g.sm_count, *g.compute_capability)
            assert (resized is None) == (a == b)
            if a != b:
                assert seq(traces[a].events) != seq(traces[b].events)  # the buffers do differ
                assert seq(resized) == seq(traces[b].events), (a, b)
                assert estimate_trace(traces[a], b).peak_device_bytes == estimate_trace(traces[b], b).peak_device_bytes
