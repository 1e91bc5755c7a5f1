"""Scripts written for torchrun, traced one rank at a time (tracing/shims/distributed.py)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from xmem_engine.trace import Category
from xmem_engine.tracing import trace
from xmem_engine.tracing.shims.distributed import World, available

pytestmark = pytest.mark.skipif(not available(), reason="this torch build has no torch.distributed")

MODES = ["fake", "real"]
MiB = 1 << 20

TORCHRUN = """
import os
import torch, torch.distributed as dist
dist.init_process_group("nccl")                      # torchrun's rendezvous: env://
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
seen = (dist.get_world_size(), dist.get_rank(), local_rank, int(os.environ["LOCAL_WORLD_SIZE"]),
        torch.cuda.current_device(), torch.cuda.device_count(), dist.get_backend())
x = torch.ones(4, device="cuda")
dist.all_reduce(x)                                   # every rank holds the same: a sum is N of them
total = float(x.sum())
device = str(x.device)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("mode", MODES)
def test_the_script_sees_the_rank_it_is_traced_as(mode):
    ns: dict = {}
    tr = trace(TORCHRUN, ns, mode=mode, world=World(16, rank=11))
    size, rank, local_rank, local_size, current, count, backend = ns["seen"]
    assert (size, rank, local_rank, local_size, current, count) == (16, 11, 3, 8, 3, 8)
    assert backend == "xmem"
    assert ns["device"] == "cuda:3"
    if mode == "real":
        assert ns["total"] == 4 * 16
    assert tr.meta["world"] == {"size": 16, "rank": 11, "gpus_per_node": 8}


def test_nothing_of_the_world_stays_behind():
    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    src = TORCHRUN.replace("dist.destroy_process_group()", "")  # left initialized by the code
    trace(src, {}, mode="fake", world=World(4))
    assert {k: os.environ.get(k) for k in before} == before
    assert not dist.is_initialized()
    assert "XMEM" not in dist.Backend._plugins and "xmem" not in dist.Backend.backend_capability


def test_without_a_world_the_environment_is_left_alone():
    """nanoGPT picks DDP by ``int(os.environ.get('RANK', -1)) != -1``: a plain estimate must not."""
    ns: dict = {}
    trace("import os\nddp = int(os.environ.get('RANK', -1)) != -1", ns, mode="fake")
    assert ns["ddp"] is ("RANK" in os.environ)


def test_explicit_world_arguments_must_agree():
    src = "import torch.distributed as dist\ndist.init_process_group('gloo', rank=0, world_size=2)"
    with pytest.raises(ValueError, match="world of 8"):
        trace(src, {}, mode="fake", world=World(8))


def test_world_checks_its_numbers():
    with pytest.raises(ValueError, match="between 0 and 3"):
        World(4, rank=4)
    with pytest.raises(ValueError, match="at least 1"):
        World(0)


DDP = """
import os
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).cuda()   # 8 x 4 MiB + 4 KiB
model = DDP(model, device_ids=[local_rank], bucket_cap_mb=CAP, gradient_as_bucket_view=VIEW)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
"""


def _ddp(mode: str, cap: int, view: bool):
    src = DDP.replace("CAP", str(cap)).replace("VIEW", str(view))
    return trace(src, {}, mode=mode, world=World(8))


def _buckets(tr, built: bool) -> list[int]:
    """The reducer's buckets (communication buffers from a factory): those made with the
    model's wrapping (``built``), or those of the rebuild after the first backward."""
    return [e.bytes for e in tr.events if e.kind == "alloc" and e.category == Category.COMMUNICATION
            and e.op.startswith("aten.empty") and (e.iteration < 0) == built]


@pytest.mark.parametrize("mode", MODES)
def test_ddp_buckets_follow_bucket_cap_mb(mode):
    """distributed.py / reducer.cpp: the first iteration runs with one bucket (the order of
    the gradients is not known yet); then the buckets are rebuilt in the order backward made
    them, each closing once it holds ``bucket_cap_mb``. Either way they hold every gradient once."""
    layer = (1024 * 1024 + 1024) * 4
    params = 8 * layer
    for cap in (10, 25):
        tr = _ddp(mode, cap, view=False)
        assert _buckets(tr, built=True) == [params]
        buckets = _buckets(tr, built=False)
        assert sum(buckets) == params
        full = -(-cap * MiB // layer)  # layers it takes to reach the cap
        assert buckets[:-1] == [full * layer] * (len(buckets) - 1)
        assert len(buckets) == -(-8 // full)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_as_bucket_view_saves_a_copy_of_the_gradients(mode):
    """With views, the buckets are the gradients; without, both are kept. (With views each
    gradient still appears for a moment, as autograd makes it, before it is copied into its
    bucket and dropped: the saving is a little less than all of them.)"""
    from xmem_engine.simulation.simulate import simulate

    layer = (1024 * 1024 + 1024) * 4
    copies = simulate(_ddp(mode, 25, view=False).events)
    views = simulate(_ddp(mode, 25, view=True).events)
    saved = copies.peak_allocated_bytes - views.peak_allocated_bytes
    assert 6 * layer <= saved <= 8 * layer
    assert views.breakdown.get("gradient", 0) >= 8 * layer


def test_ddp_in_fake_mode_allocates_as_in_real_mode():
    """The same requests, and the same peak (a 68-byte index tensor of the rebuild is freed a
    step earlier in real mode)."""
    from xmem_engine.simulation.simulate import simulate

    fake, real = _ddp("fake", 25, False), _ddp("real", 25, False)
    key = lambda tr: sorted((e.bytes, str(e.category)) for e in tr.events if e.kind == "alloc")  # noqa: E731
    assert key(fake) == key(real)
    assert simulate(fake.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


FSDP2 = """
import os
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a, self.b = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


model = nn.Sequential(*[Block(512) for _ in range(6)]).cuda()
for block in model:
    fully_shard(block, reshard_after_forward=RESHARD)
fully_shard(model, reshard_after_forward=RESHARD)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(8, 128, 512, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""
BLOCK = 512 * 2048 * 2 + 2048 + 512  # parameters of one block
PSI = 6 * BLOCK


def _fsdp2(mode: str, world: int, reshard: bool = True):
    return trace(FSDP2.replace("RESHARD", str(reshard)), {}, mode=mode, world=World(world))


def _live(tr):
    """(event, bytes live by category) after each event."""
    live: dict[int, object] = {}
    for e in tr.events:
        if e.kind == "alloc":
            live[e.id] = e
        elif e.kind == "free":
            live.pop(e.id, None)
        by: dict[str, int] = {}
        for a in live.values():
            by[str(a.category)] = by.get(str(a.category), 0) + a.bytes
        yield e, by


def _states_after_last_step(tr) -> int:
    """Parameters, gradients and optimizer states live when the last optimizer step ends."""
    states, in_step = {}, False
    for e, by in _live(tr):
        if e.kind == "phase":
            if in_step and e.phase != "optimizer":
                states = by
            in_step = e.phase == "optimizer"
    return sum(states.get(c, 0) for c in ("parameter", "gradient", "optimizer_state"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_model_states_are_a_shard_each(mode, world):
    """ZeRO stage 3 (FSDP): parameters, gradients and AdamW's two moments, 16 bytes a fp32
    parameter in all, 1/N of them on each rank (every dimension here divides evenly)."""
    assert _states_after_last_step(_fsdp2(mode, world)) == 16 * PSI // world


@pytest.mark.parametrize("mode", MODES)
def test_fsdp2_unshards_one_block_at_a_time(mode):
    """With reshard_after_forward, a rank holds its shard of every parameter plus the block(s)
    being all-gathered: at most the one computing and the one prefetched (backward); without
    it, every block stays unsharded from its forward to its backward."""
    world = 4
    shard = 4 * PSI // world
    most = max(by.get("parameter", 0) for _, by in _training(_fsdp2(mode, world, reshard=True)))
    assert shard + 4 * BLOCK <= most <= shard + 2 * 4 * BLOCK
    most = max(by.get("parameter", 0) for _, by in _training(_fsdp2(mode, world, reshard=False)))
    assert most >= shard + 4 * PSI - 4 * BLOCK
    # before fully_shard, .cuda() put the whole model on every rank: parameters from then on
    assert max(by.get("parameter", 0) for _, by in _live(_fsdp2(mode, world))) >= 4 * PSI


def _training(tr):
    """``_live`` from the first forward on (after fully_shard has sharded the model)."""
    started = False
    for e, by in _live(tr):
        started = started or e.phase == "forward"
        if started:
            yield e, by


def test_fsdp2_collectives_run_on_their_own_streams():
    """FSDP2's all-gathers and reduce-scatters allocate on streams of their own, whose blocks
    the caching allocator keeps apart from the default stream's."""
    tr = _fsdp2("fake", 4)
    streams = {e.stream for e in tr.events if e.kind == "alloc" and e.category == Category.COMMUNICATION}
    assert len(streams - {0}) >= 1
    gathered = [e.bytes for e in tr.events if e.kind == "alloc" and e.category == Category.COMMUNICATION
                and e.phase == "forward"]
    assert max(gathered) == 4 * BLOCK  # one block's parameters, all ranks' shards


@pytest.mark.parametrize("option", ["static_graph=True", "find_unused_parameters=True"])
def test_ddp_options_trace_alike_in_both_modes(option):
    """DDP's other reducer paths (a static graph's buckets, the unused-parameter search) run
    under the tracer, fake mode allocating what real mode does."""
    from xmem_engine.simulation.simulate import simulate

    src = DDP.replace("CAP", "10").replace("VIEW", "True").replace("gradient_as_bucket_view=True",
                                                                     f"gradient_as_bucket_view=True, {option}")
    fake, real = (trace(src, {}, mode=m, world=World(4)) for m in MODES)
    assert sum(e.bytes for e in fake.events if e.kind == "alloc" and e.category == Category.COMMUNICATION) > 0
    assert simulate(fake.events).peak_allocated_bytes == simulate(real.events).peak_allocated_bytes


FSDP1 = FSDP2.replace("from torch.distributed.fsdp import fully_shard", """from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy""").replace("""model = nn.Sequential(*[Block(512) for _ in range(6)]).cuda()
for block in model:
    fully_shard(block, reshard_after_forward=RESHARD)
fully_shard(model, reshard_after_forward=RESHARD)""", """model = nn.Sequential(*[Block(512) for _ in range(6)])
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device(int(os.environ["LOCAL_RANK"])),
             sharding_strategy=ShardingStrategy.STRATEGY)""")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("strategy, sharded", [("FULL_SHARD", True), ("NO_SHARD", False)])
def test_fsdp1_model_states_follow_the_sharding_strategy(mode, strategy, sharded):
    """FullyShardedDataParallel's flat parameters: 16 bytes a parameter over N fully sharded,
    all 16 on every rank with NO_SHARD (DDP's states)."""
    tr = trace(FSDP1.replace("STRATEGY", strategy), {}, mode=mode, world=World(4))
    assert _states_after_last_step(tr) == (16 * PSI // 4 if sharded else 16 * PSI)


def test_an_index_alone_names_the_rank_s_gpu():
    """``torch.device(local_rank)`` and ``model.to(local_rank)`` (DDP's tutorial, FSDP1's
    ``device_id``): an index is the current accelerator's, the virtual GPU here."""
    src = """
import os, torch, torch.nn as nn
r = int(os.environ["LOCAL_RANK"])
d = torch.device(r)
m = nn.Linear(4, 4).to(r)
t = torch.ones(2).to(r)
seen = (str(d), str(m.weight.device), str(t.device))
"""
    ns: dict = {}
    trace(src, ns, mode="fake", world=World(4, rank=2))
    assert ns["seen"] == ("cuda:2", "cuda:2", "cuda:2")


def test_subgroups_and_a_2d_mesh():
    """``new_group`` and ``init_device_mesh`` over two dimensions (HSDP's replicate x shard)
    make groups of the right sizes, whose sums count their own ranks."""
    src = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("nccl")
g = dist.new_group(ranks=[0, 1, 2, 3])
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("replicate", "shard"))
x = torch.ones(8, device="cuda")
dist.all_reduce(x, group=g)
seen = (dist.get_world_size(g), mesh["shard"].size(), mesh["replicate"].size(), float(x[0]))
"""
    ns: dict = {}
    trace(src, ns, mode="real", world=World(8))
    assert ns["seen"] == (4, 4, 2, 4.0)


TP = """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(16, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("mode", MODES)
def test_tensor_parallel_shards_the_linear_layers(mode):
    """``parallelize_module`` with column- then row-wise linears: each rank holds 1/N of the
    weights (and of their gradients and AdamW's moments; the row-wise bias is replicated)."""
    src = TP
    world = 4
    sharded = (1024 * 4096 + 4096 + 4096 * 1024) // world  # column-wise weight and bias, row-wise weight
    replicated = 1024  # the row-wise layer's bias
    assert _states_after_last_step(trace(src, {}, mode=mode, world=World(world))) == 16 * (sharded + replicated)



@pytest.mark.parametrize("mode", MODES)
def test_a_functional_all_reduce_makes_its_output_once(mode):
    """The row-wise layer's partial sums are all-reduced (DTensor's redistribute, a functional
    collective): one output of the activation's size, as on the GPU; nothing for the wait."""
    tr = trace(TP, {}, mode=mode, world=World(4))
    forward = [e for e in tr.events if e.kind == "alloc" and e.phase == "forward" and e.iteration == 0]
    outputs = [e.bytes for e in forward if e.bytes == 16 * 1024 * 4 and "c10d" not in e.op]
    assert len(outputs) >= 2  # the row-wise output, and its all-reduced copy
    assert not [e for e in tr.events if e.kind == "alloc" and "wait_tensor" in e.op]


SPAWN = """
import os
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def demo(rank, world_size, seen):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    seen.append(rank)
    box = [{"run": "abc", "rank": rank}]
    dist.broadcast_object_list(box, src=0)       # Lightning's and accelerate's broadcasts
    seen.append(box[0]["run"])
    model = DDP(nn.Linear(1024, 1024).to(rank), device_ids=[rank])
    model(torch.randn(64, 1024, device=rank)).sum().backward()
    dist.destroy_process_group()

seen = []
ctx = mp.spawn(demo, args=(NPROCS, seen), nprocs=NPROCS, join=JOIN)
if ctx is not None:
    while not ctx.join():
        pass
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("rank", [0, 1])
def test_mp_spawn_runs_the_traced_ranks_process_here(mode, join, rank):
    """PyTorch's DDP tutorial starts one process per GPU with mp.spawn; a child would run
    outside the tracer (no GPU there). The traced rank's process runs here, its collectives
    (an object broadcast too: pickled through a host storage) on the fake group."""
    ns: dict = {}
    tr = trace(SPAWN.replace("NPROCS", "2").replace("JOIN", str(join)), ns, mode=mode, world=World(2, rank=rank))
    assert ns["seen"] == [rank, "abc"]
    assert any("torch.multiprocessing started 2 processes" in n and f"process {rank} ran in this one" in n
               for n in tr.meta["notes"])
    assert any(e.kind == "alloc" and e.category == Category.COMMUNICATION for e in tr.events)  # DDP's bucket


def test_mp_spawn_of_more_processes_than_the_world_says_which_world_to_estimate():
    with pytest.raises(ValueError, match="starts 4 processes .* --world-size 4"):
        trace(SPAWN.replace("NPROCS", "4").replace("JOIN", "True"), {}, mode="fake", world=World(2))
    ns: dict = {}
    trace(SPAWN.replace("NPROCS", "1").replace("JOIN", "True"), ns, mode="fake")  # a plain run: one process
    assert ns["seen"] == [0, "abc"]


def test_an_error_in_the_spawned_function_is_shown_at_its_line():
    """The traceback runs through xmem's mp.spawn into the function, to the line that failed."""
    import traceback

    src = ("import torch, torch.multiprocessing as mp\ndef fn(rank):\n"
           "    torch.ones(2, device='cuda') @ torch.ones(3, device='cuda')\nmp.spawn(fn, nprocs=1)\n")
    with pytest.raises(RuntimeError) as ei:
        trace(src, {}, mode="fake")
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(ei.value.__traceback__)]
    assert [line for name, line in frames if name == "<cell>"] == [4, 3] and frames[-1] == ("<cell>", 3)


def test_elastic_launch_calls_its_function_here_as_the_traced_rank():
    """torchrun as a function (accelerate's notebook_launcher on several GPUs): the entry point
    runs here with torchrun's environment for the traced rank, its return value as the agent's."""
    src = """
import os
import torch, torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

def train(scale):
    dist.init_process_group("nccl")
    x = torch.ones(1024, device="cuda") * scale
    dist.all_reduce(x)
    rank = int(os.environ["RANK"])
    dist.destroy_process_group()
    return rank

config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="r", rdzv_backend="c10d",
                      rdzv_endpoint="localhost:29500")
results = elastic_launch(config, entrypoint=train)(3)
"""
    ns: dict = {}
    tr = trace(src, ns, mode="fake", world=World(2, rank=1))
    assert ns["results"] == {1: 1}
    assert any(n.startswith("elastic_launch started 2 processes") for n in tr.meta["notes"])
    with pytest.raises(ValueError, match="elastic_launch starts 2 processes .* --world-size 2"):
        trace(src, {}, mode="fake")


# a module with a host buffer (RoPE's inv_freq), as transformers' models have
ROPE = """
class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64), persistent=False)
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        return self.proj(x * self.inv_freq.to(x.device))
"""


WRAPS = {
    # FSDP2 (the Trainer's FSDP): fully_shard moves the model's states itself
    "fully_shard": """from torch.distributed.fsdp import fully_shard
model = nn.Sequential(Rope(), Rope())            # left on the host, as from_pretrained leaves it
for block in model:
    fully_shard(block)
fully_shard(model)""",
    # FSDP1: buffers cast and moved at the lazy init of the first forward
    "FSDP1": """from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
torch.cuda.set_device(0)
model = FSDP(nn.Sequential(Rope(), nn.BatchNorm1d(32), Rope()), device_id=torch.cuda.current_device())""",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_fsdp_moves_a_host_models_buffers_to_the_gpu(mode, wrap):
    """FSDP moves buffers of a model left on the host with ``buf.data = buf.to(device)``, which a
    real host buffer cannot take from a fake GPU tensor: FSDP2 left a CPU tensor over a meta
    storage ("found cpu and meta" in RoPE), FSDP1 was refused ("incompatible tensor type")."""
    src = f"""
import torch, torch.nn as nn, torch.distributed as dist
dist.init_process_group("nccl")
{ROPE}
{WRAPS[wrap]}
model(torch.randn(8, 32, device="cuda")).sum().backward()
where = {{str(b.device) for b in model.buffers()}}
dist.destroy_process_group()
"""
    ns: dict = {}
    trace(src, ns, mode=mode, world=World(2))
    assert ns["where"] == {"cuda:0"}


def test_object_collectives_take_torchs_keyword_names():
    """DCP's planner calls them by keyword (``scatter_object_output_list=...``)."""
    src = """
import torch.distributed as dist
dist.init_process_group("nccl")
out, gathered, everyone = [None], [None, None], [None, None]
dist.gather_object(obj={"plan": 1}, object_gather_list=gathered, dst=0)
dist.scatter_object_list(scatter_object_output_list=out, scatter_object_input_list=["a", "b"], src=0)
dist.all_gather_object(object_list=everyone, obj=3)
box = ["mine"]
dist.broadcast_object_list(object_list=box, src=0)
dist.destroy_process_group()
"""
    ns: dict = {}
    trace(src, ns, mode="fake", world=World(2, rank=1))
    assert ns["gathered"] == [{"plan": 1}] * 2 and ns["out"] == ["b"] and ns["everyone"] == [3, 3] and ns["box"] == ["mine"]


DCP_FSDP2 = """
import os, torch, torch.nn as nn, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]).cuda()
for m in model:
    fully_shard(m)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 256, device="cuda")).sum().backward()
opt.step()
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=PATH)
msd, osd = get_state_dict(model, opt)
dcp.load({"model": msd, "optim": osd}, checkpoint_id=PATH)
set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
loaded = True
dist.destroy_process_group()
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_dcp_saves_and_loads_each_ranks_shards(tmp_path, rank):
    """DCP's coordinator plans from every rank's plan; with one rank traced, each rank's
    checkpoint is its own shards ("Failed to validate global plan" before): the same in both modes."""
    from xmem_engine.simulation.simulate import simulate

    peaks = []
    for mode in MODES:
        ns: dict = {"PATH": str(tmp_path / mode)}
        tr = trace(DCP_FSDP2, ns, mode=mode, world=World(2, rank=rank))
        assert ns["loaded"]
        peaks.append(simulate(tr.events).peak_allocated_bytes)
    assert peaks[0] == peaks[1]
