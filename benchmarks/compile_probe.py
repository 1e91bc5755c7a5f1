"""Self-contained demo (torch 2.14.1+cu130, triton 3.8, CPU only): torch.compile for a *virtual CUDA GPU*.

Dynamo + AOTAutograd (min-cut partitioner) + Inductor lower and schedule for cuda on fake cuda
tensors; the generated Python wrapper (empty_strided_cuda / del / reuse / extern_kernels.mm(out=))
then runs on fake tensors, Triton launches are no-ops, and a TorchDispatchMode logs every new
storage (allocation) and its death (free). Usage:
    python compile_on_cpu_for_cuda.py mlp|gpt [--efficient-sdpa] [--events] [--eager]
"""
import contextlib, types
import torch

PROPS = types.SimpleNamespace(
    name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
    total_memory=85_045_870_592, regs_per_multiprocessor=65536,
    max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32,
    L2_cache_size=52_428_800, shared_memory_per_block=49152,
    shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
    is_integrated=False, is_multi_gpu_board=False, gcnArchName="NVIDIA CUDA", uuid="0",
    pci_bus_id=0, pci_device_id=0, pci_domain_id=0, clock_rate=1980000, memory_clock_rate=2619000,
    memory_bus_width=5120,
)

@contextlib.contextmanager
def patched(obj, name, value):
    had = name in vars(obj); old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had: setattr(obj, name, old)
        else: delattr(obj, name)

@contextlib.contextmanager
def patched_item(d, k, v):
    had, old = k in d, d.get(k)
    d[k] = v
    try:
        yield
    finally:
        if had: d[k] = old
        else: d.pop(k, None)

def _props(device=None):
    return PROPS

@contextlib.contextmanager
def virtual_gpu(props=PROPS, sdpa_backend=None):
    import torch._dynamo.device_interface as di
    cuda = torch.cuda
    with contextlib.ExitStack() as st:
        P = lambda o, n, v: st.enter_context(patched(o, n, v))
        # P(cuda, "is_available", lambda: True)
        P(cuda, "get_rng_state", lambda device="cuda": torch.zeros(16, dtype=torch.uint8))
        P(cuda, "set_rng_state", lambda new_state, device="cuda": None)
        P(cuda, "device_count", lambda: 1)
        P(cuda, "current_device", lambda: 0)
        P(cuda, "get_device_properties", lambda device=None: props)
        P(cuda, "get_device_capability", lambda device=None: (props.major, props.minor))
        P(cuda, "get_device_name", lambda device=None: props.name)
        P(cuda, "synchronize", lambda device=None: None)
        P(cuda, "is_bf16_supported", lambda including_emulation=True: True)

        class VirtualCudaInterface(di.CudaInterface):
            class Worker:
                @staticmethod
                def set_device(device): pass
                @staticmethod
                def current_device(): return 0
                @staticmethod
                def get_device_properties(device=None): return props
            current_device = staticmethod(lambda: 0)
            set_device = staticmethod(lambda device: None)
            device_count = staticmethod(lambda: 1)
            synchronize = staticmethod(lambda device=None: None)
            get_device_properties = staticmethod(lambda device=None: props)
            get_raw_stream = staticmethod(lambda device=0: 0)
            exchange_device = staticmethod(lambda device: 0)
            maybe_exchange_device = staticmethod(lambda device: 0)
            memory_allocated = staticmethod(lambda device=None: 0)
            is_bf16_supported = staticmethod(lambda including_emulation=False: True)
            is_available = staticmethod(lambda: True)
            get_compute_capability = staticmethod(lambda device=None: props.major * 10 + props.minor)
            is_triton_capable = staticmethod(lambda device=None: True)
        import sys, triton.runtime.driver; tdrv = sys.modules["triton.runtime.driver"]
        from triton.backends.nvidia.driver import CudaDriver
        from triton.backends.compiler import GPUTarget

        class VirtualUtils:
            def get_device_properties(self, device=0):
                return {"max_shared_mem": props.shared_memory_per_block_optin,
                        "multiprocessor_count": props.multi_processor_count,
                        "max_num_regs": props.regs_per_multiprocessor, "warpSize": 32,
                        "sm_clock_rate": props.clock_rate, "mem_clock_rate": props.memory_clock_rate,
                        "mem_bus_width": props.memory_bus_width}

        class VirtualCudaDriver(CudaDriver):
            def __init__(self):
                self.utils = VirtualUtils()
            def get_current_target(self):
                return GPUTarget("cuda", props.major * 10 + props.minor, 32)
            def get_current_device(self): return 0
            def set_current_device(self, device): pass
            def get_current_stream(self, device=None): return 0
            def get_device_capability(self, device=0): return (props.major, props.minor)
            def get_active_torch_device(self): return torch.device("cuda", 0)
            @staticmethod
            def is_active(): return True
        old_active, old_default = tdrv.driver._active, tdrv.driver._default
        tdrv.driver._active = tdrv.driver._default = VirtualCudaDriver()
        st.callback(lambda: (setattr(tdrv.driver, "_active", old_active), setattr(tdrv.driver, "_default", old_default)))
        # Inductor: no caches, no subprocess pool, no autotuning
        import torch._inductor.config as icfg
        for k, v in dict(force_disable_caches=True, compile_threads=1, max_autotune=False,
                         max_autotune_gemm=False, cpp_wrapper=False).items():
            st.enter_context(icfg.patch(k, v))
        # triton kernels: never compiled, launches are no-ops
        from torch._inductor.async_compile import AsyncCompile
        P(AsyncCompile, "triton", lambda self, kernel_name, source_code, device_str="cuda": NoopKernel(kernel_name, source_code))
        P(AsyncCompile, "wait", lambda self, scope: None)
        from torch._inductor.codecache import PyCodeCache
        orig_load = PyCodeCache.load_by_key_path.__func__
        def load_by_key_path(cls, *a, **k):
            mod = orig_load(cls, *a, **k)
            if "empty_strided_cuda" in vars(mod):
                virtualize_wrapper_module(mod)
            return mod
        P(PyCodeCache, "load_by_key_path", classmethod(load_by_key_path))
        # constant folding runs real ops (values needed): run them on the CPU
        from torch._inductor.fx_passes import joint_graph as jg
        orig_run = jg.UniformValueConstantFolder.run
        def run(self, *a, **k):
            with CudaToCpu():
                return orig_run(self, *a, **k)
        P(jg.UniformValueConstantFolder, "run", run)
        # SDPA: the backend the target GPU picks (C++ _fused_sdp_choice cannot ask a driver; without
        # this it answers MATH and Inductor compiles bmm+softmax). Here: efficient attention (fp32).
        if sdpa_backend is not None:
            from torch._subclasses import fake_impls
            aten = torch.ops.aten
            st.enter_context(patched_item(fake_impls.op_implementations_dict, aten._fused_sdp_choice.default,
                                          lambda fake_mode, func, *args, **kwargs: int(sdpa_backend)))
        # pad_mm benchmarks padded vs unpadded mm on real cuda tensors: answer "don't pad" from its cache
        from torch._inductor.fx_passes import pad_mm
        P(pad_mm, "get_cached_should_pad", lambda key: False)
        P(cuda, "set_device", lambda device: None)
        P(cuda, "_DeviceGuard", _NullGuard)
        di.get_interface_for_device("cpu")  # init registry
        old = dict(di.device_interfaces)
        di.device_interfaces["cuda"] = VirtualCudaInterface
        di.device_interfaces["cuda:0"] = VirtualCudaInterface
        try:
            yield
        finally:
            di.device_interfaces.clear(); di.device_interfaces.update(old)


class _NullGuard:
    def __init__(self, index): pass
    def __enter__(self): return self
    def __exit__(self, *exc): return False


class NoopKernel:
    """What async_compile.triton returns: a launch allocates nothing and does nothing."""
    def __init__(self, name, source):
        self.name, self.source = name, source
        self.launches = 0
    def run(self, *args, **kwargs):
        self.launches += 1
    def __call__(self, *args, **kwargs):
        self.launches += 1


WRAPPER_MODULES = []

def virtualize_wrapper_module(mod):
    """The generated wrapper's globals that would touch the CUDA driver, made virtual."""
    g = vars(mod)
    g["empty_strided_cuda"] = lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cuda")
    g["get_raw_stream"] = lambda index=0: 0
    # the C++ helper builds a raw TensorImpl on the storage (a meta tensor for a fake one)
    g["reinterpret_tensor"] = lambda base, size, stride, offset: torch.as_strided(base, size, stride, base.storage_offset() + offset)
    if "copy_if_misaligned" in g:
        g["copy_if_misaligned"] = lambda t: t
    g["assert_alignment"] = lambda *a, **k: None
    WRAPPER_MODULES.append(mod)


from torch.utils._python_dispatch import TorchDispatchMode

class CudaToCpu(TorchDispatchMode):
    """Real (not fake) ops asked for ``cuda`` at compile time run on the CPU instead."""
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        d = kwargs.get("device")
        if d is not None and torch.device(d).type == "cuda":
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)

# ---------------------------------------------------------------- python autograd engine
import heapq
from torch.autograd.graph import get_gradient_edge
import torch.fx.traceback as fx_traceback


def _is_pynode(node):
    return hasattr(node, "_forward_cls")


def _call_node(node, grads, aot_hooks=True):
    if aot_hooks:  # what AOT's setup_stacktrace_preservation_hooks' pre/post hooks do
        fx_traceback.set_stack_trace(node.metadata.get("traceback_", []))
        fx_traceback.set_grad_fn_seq_nr(node._sequence_nr())
        fx_traceback._mark_autograd_backward()
    try:
        if _is_pynode(node):
            if getattr(node, "materialize_grads", True):
                grads = [g if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
                         for g, m in zip(grads, node._input_metadata)]
            out = node.apply(*grads)
        else:
            out = node(*grads)
    finally:
        if aot_hooks:
            fx_traceback.reset_grad_fn_seq_nr()
            fx_traceback._reset_autograd_backward()
    if not isinstance(out, tuple):
        out = (out,)
    return out


def _validate(grad, node, nr):
    """What the C++ engine's validate_outputs does: sum_to the expected shape, cast dtype."""
    if grad is None:
        return None
    meta = node._input_metadata[nr]
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    if grad.dtype != meta.dtype:
        grad = grad.to(meta.dtype)
    return grad


def run(roots, root_grads, targets=None, accumulate=False, create_graph=False):
    """roots: GradientEdges to start from, with their grads. targets: GradientEdges whose grads
    are captured (autograd.grad); accumulate: run AccumulateGrad nodes (backward)."""
    # reachable graph, dependency counts (per edge, as the C++ engine counts)
    deps = {}
    nodes = {}
    stack = [e.node for e in roots if e.node is not None]
    for n in stack:
        nodes[id(n)] = n
    seen = set(id(n) for n in stack)
    while stack:
        n = stack.pop()
        for fn, _ in n.next_functions:
            if fn is None:
                continue
            deps[id(fn)] = deps.get(id(fn), 0) + 1
            if id(fn) not in seen:
                seen.add(id(fn)); nodes[id(fn)] = fn; stack.append(fn)
    capture = {}
    if targets is not None:
        for i, e in enumerate(targets):
            capture.setdefault((id(e.node), e.output_nr), []).append(i)
        # needed: can reach a capture
        needed = {}
        def is_needed(n):
            k = id(n)
            if k in needed:
                return needed[k]
            needed[k] = False
            r = any(fn is not None and ((id(fn), nr) in capture or is_needed(fn)) for fn, nr in n.next_functions)
            needed[k] = r
            return r
        for n in list(nodes.values()):
            is_needed(n)
    else:
        needed = None
    captured = [None] * (len(targets) if targets is not None else 0)
    buffers = {}

    def deliver(node, nr, g):
        buf = buffers.setdefault(id(node), [None] * len(node._input_metadata))
        g = _validate(g, node, nr)
        if g is None:
            return
        buf[nr] = g if buf[nr] is None else buf[nr] + g

    ready = []
    for e, g in zip(roots, root_grads):
        if e.node is not None:
            deliver(e.node, e.output_nr, g)
    for n in {id(e.node): e.node for e in roots if e.node is not None}.values():
        if deps.get(id(n), 0) == 0:
            heapq.heappush(ready, (-n._sequence_nr(), id(n), n))
    with torch.set_grad_enabled(create_graph):
        while ready:
            _, _, n = heapq.heappop(ready)
            grads = buffers.pop(id(n), [None] * len(n._input_metadata))
            for nr, g in enumerate(grads):
                for i in capture.get((id(n), nr), ()):
                    captured[i] = g
            if needed is not None and not needed[id(n)]:
                continue
            if type(n).__name__ == "AccumulateGrad":
                if accumulate and grads[0] is not None:
                    v = n.variable
                    v.grad = grads[0].detach() if v.grad is None else v.grad + grads[0]
                continue
            outs = _call_node(n, grads)
            for (fn, nr), g in zip(n.next_functions, outs):
                if fn is None:
                    continue
                if g is not None:
                    deliver(fn, nr, g)
                deps[id(fn)] -= 1
                if deps[id(fn)] == 0:
                    heapq.heappush(ready, (-fn._sequence_nr(), id(fn), fn))
    return captured


def _as_tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    grad_outputs = _as_tuple(grad_outputs)
    grad_outputs = [torch.ones_like(o) if g is None else g for o, g in zip(outputs, grad_outputs)]
    roots = [get_gradient_edge(o) for o in outputs]
    targets = [get_gradient_edge(i) for i in inputs]
    res = run(roots, grad_outputs, targets=targets, create_graph=create_graph)
    if materialize_grads:
        res = [torch.zeros_like(i) if r is None else r for r, i in zip(res, inputs)]
    return tuple(res)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    tensors = _as_tuple(tensors)
    if grad_tensors is None:
        grad_tensors = (None,) * len(tensors)
    grad_tensors = [torch.ones_like(t) if g is None else g for t, g in zip(tensors, _as_tuple(grad_tensors))]
    run([get_gradient_edge(t) for t in tensors], grad_tensors, accumulate=True, create_graph=create_graph)

# ---------------------------------------------------------------- allocation log
import torch, weakref
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

class AllocLog(TorchDispatchMode):
    """New storages of op outputs = allocations; storage death = free."""
    @classmethod
    def ignore_compile_internals(cls):
        return True
    def __init__(self):
        super().__init__()
        self.live = {}; self.events = []; self.cur = 0; self.peak = 0; self.phase = ""
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage(); key = st._cdata
                if key in self.live: continue
                n = st.nbytes()
                self.cur += n; self.peak = max(self.peak, self.cur)
                self.events.append((self.phase, "alloc", str(func), tuple(t.shape), n, self.cur))
                self.live[key] = (weakref.ref(st, self._died(key, n, str(func))), n)
        return out
    def _died(self, key, n, name):
        def cb(_):
            if self.live.pop(key, None) is not None:
                self.cur -= n
                self.events.append((self.phase, "free", name, (), n, self.cur))
        return cb
    def reset(self, phase):
        self.phase = phase
    def summary(self, phase):
        ev = [e for e in self.events if e[0] == phase]
        allocs = [e for e in ev if e[1] == "alloc"]
        return dict(n_alloc=len(allocs), n_free=len(ev) - len(allocs), bytes_alloc=sum(e[4] for e in allocs))

# ---------------------------------------------------------------- models
import math, torch, torch.nn as nn, torch.nn.functional as F
class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.ln1 = nn.LayerNorm(d); s.attn = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s, vocab=1024, T=128, n_layer=4, d=256, h=4):
        super().__init__()
        s.wte = nn.Embedding(vocab, d); s.wpe = nn.Embedding(T, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(n_layer)])
        s.ln_f = nn.LayerNorm(d); s.head = nn.Linear(d, vocab, bias=False)
        s.head.weight = s.wte.weight
    def forward(s, idx, targets):
        B, T = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(T, device=idx.device))
        for b in s.blocks: x = b(x)
        logits = s.head(s.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(64, 256); s.l2 = nn.Linear(256, 64)
    def forward(s, x, target):
        return (s.l2(torch.relu(s.l1(x))) - target).square().mean()


def sdpa_efficient(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as an sm90 GPU runs fp32 attention (mem-efficient kernel); see FINDINGS.md (SDPA)."""
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


# ---------------------------------------------------------------- demo
def main():
    import sys, time
    from torch._subclasses.fake_tensor import FakeTensorMode
    which = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    if "--efficient-sdpa" in sys.argv:
        F.scaled_dot_product_attention = sdpa_efficient
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    with fm:
        torch.set_default_device("cuda")
        if which == "mlp":
            model = MLP(); inputs = (torch.randn(32, 64), torch.randn(32, 64))
        else:
            model = GPT(vocab=1024, T=128, n_layer=4, d=256, h=4)
            inputs = (torch.randint(0, 1024, (8, 128)), torch.randint(0, 1024, (8, 128)))
        torch.set_default_device(None)

    def step(m, log):
        log.reset("fwd"); loss = m(*inputs)
        log.reset("bwd"); backward(loss); del loss          # C++ engine refuses cuda tensors w/o driver
        for p in model.parameters(): p.grad = None
        log.reset("")

    def report(name, log):
        first = log.events[0]
        base = first[5] - (first[4] if first[1] == "alloc" else -first[4])
        for ph in ("fwd", "bwd"):
            ev = [e for e in log.events if e[0] == ph]
            print(f"{name:8s} {ph}: {sum(e[1] == 'alloc' for e in ev)} allocs, {sum(e[1] == 'free' for e in ev)} frees, "
                  f"peak {max(e[5] for e in ev) - base} B above step start, live at end {ev[-1][5] - base} B")
        if "--events" in sys.argv:
            for e in log.events:
                print("   ", e[0], e[1], e[3] if e[1] == "alloc" else "", e[4])

    with virtual_gpu(sdpa_backend=None), patched(torch.autograd, "grad", grad), fm:
        if "--eager" in sys.argv:
            log = AllocLog()
            with log:
                step(model, log); log.events.clear(); step(model, log)
            report("eager", log)
        cm = torch.compile(model)
        log = AllocLog()
        t = time.time()
        with log:
            step(cm, log)
            print(f"compile fwd+bwd (+1 step): {time.time() - t:.1f} s")
            log.events.clear(); step(cm, log)
        report("compiled", log)
    for mod in WRAPPER_MODULES:
        src = open(mod.__file__).read()
        print(f"==== {mod.__file__}\n" + src[src.index("    def call(self, args):"):src.index("runner = Runner")])

if __name__ == "__main__":
    main()
