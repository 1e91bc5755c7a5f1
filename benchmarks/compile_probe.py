"""Demo (torch 2.14.1+cu130, triton 3.8, CPU only): torch.compile for a *virtual CUDA GPU*, outside the
tracer, with the engine's compile-time pieces (xmem_engine/tracing/compiler/inductor_gpu.py, python_autograd.py).

Dynamo + AOTAutograd (min-cut partitioner) + Inductor lower and schedule for cuda on fake cuda
tensors; the generated Python wrapper (empty_strided_cuda / del / reuse / extern_kernels.mm(out=))
then runs on fake tensors, Triton launches are no-ops, and a TorchDispatchMode logs every new
storage (allocation) and its death (free). Usage:
    PYTHONPATH=. python benchmarks/compile_probe.py mlp|gpt [--efficient-sdpa] [--events] [--eager]
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

from xmem_engine.tracing.patches import patched_attr as patched  # noqa: E402


@contextlib.contextmanager
def virtual_gpu(props=PROPS):
    """The torch.cuda queries a driverless process must answer for Dynamo, then the engine's own
    compile-time patches (xmem_engine/tracing/compiler/inductor_gpu.py): device interface, Triton driver,
    no-op Triton kernels, virtual wrapper globals, constant folding on the CPU, no pad_mm."""
    from xmem_engine.tracing.compiler.inductor_gpu import inductor_for_virtual_gpu

    cuda = torch.cuda
    with contextlib.ExitStack() as st:
        P = lambda o, n, v: st.enter_context(patched(o, n, v))
        # torch.cuda.is_available() stays False: see real_availability() in inductor_gpu.py
        P(cuda, "get_rng_state", lambda device="cuda": torch.zeros(16, dtype=torch.uint8))
        P(cuda, "set_rng_state", lambda new_state, device="cuda": None)
        P(cuda, "device_count", lambda: 1)
        P(cuda, "current_device", lambda: 0)
        P(cuda, "get_device_capability", lambda device=None: (props.major, props.minor))
        P(cuda, "get_device_name", lambda device=None: props.name)
        P(cuda, "synchronize", lambda device=None: None)
        P(cuda, "is_bf16_supported", lambda including_emulation=True: True)
        st.enter_context(inductor_for_virtual_gpu(props, WRAPPER_MODULES.append))
        yield


WRAPPER_MODULES = []  # Inductor's generated wrapper modules, in load order

# ---------------------------------------------------------------- the compile-time autograd engine
from xmem_engine.tracing.compiler.python_autograd import grad, run  # noqa: E402
from torch.autograd.graph import get_gradient_edge  # noqa: E402


def backward(tensors):
    """``loss.backward()`` through the Python engine: in this demo every tensor is a true cuda
    fake, which the C++ engine refuses without a driver (xmem's own traced tensors are not)."""
    run([get_gradient_edge(tensors)], [torch.ones_like(tensors)], None, accumulate=True)

# ---------------------------------------------------------------- allocation log
import weakref
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
import torch.nn as nn, torch.nn.functional as F
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

    with virtual_gpu(), patched(torch.autograd, "grad", grad), fm:
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
