"""Threads the traced code starts (a chat demo's ``Thread(target=model.generate)`` with a
streamer) run under the trace's modes, and one of xmem's stops in such a thread ends the trace
instead of leaving the code's own thread waiting for it (shims/threads.py)."""

from __future__ import annotations

import sys
import threading

import torch

from tests.tracing.test_shadow_values import alloc_stream
from xmem_engine.tracing import trace
from xmem_engine.tracing.fake import guesses

PRODUCER = """
import queue, threading
import torch
model = torch.nn.Linear(1024, 1024).cuda()   # 4 MiB of weights: too big to stand in for
q = queue.Queue()

def produce():
    with torch.no_grad():
        for _ in range(3):
            y = model(torch.randn(64, 1024, device="cuda"))
            q.put(1 if y.sum() > 0 else -1)  # a value read in the thread
    q.put(None)

worker = threading.Thread(target=produce)
worker.start()
values = []
while (v := q.get(timeout=60)) is not None:
    values.append(v)
worker.join()
"""


def test_a_thread_the_code_starts_is_traced_like_its_own():
    ns: dict = {}
    fake = trace(PRODUCER, ns, mode="auto")
    assert fake.mode == "fake" and "fallback" not in fake.meta and len(ns["values"]) == 3
    (g,) = fake.meta["guesses"]
    assert (g["what"], g["where"], g["count"]) == ("bool(tensor)", "<cell>:11", 3)
    real = trace(PRODUCER, {}, mode="real")
    assert alloc_stream(fake) == alloc_stream(real) and len(alloc_stream(real)) > 0
    # nothing of the trace stays on a thread started after it
    seen = []
    t = threading.Thread(target=lambda: seen.append((torch._C._len_torch_function_stack(),
                                                    torch._C._len_torch_dispatch_stack())))
    t.start()
    t.join()
    assert seen == [(0, 0)]


STOPPED_IN_A_THREAD = """
import queue, threading
import torch
q = queue.Queue()

def produce():
    big = torch.rand(300_000, device="cuda") + 1   # too big to stand in for: its max is guessed
    halvings = 0
    while big.max() > 1e-3:                        # a loop on a guessed value: fake mode stops
        big = big * 0.5
        halvings += 1
    q.put(halvings)

threading.Thread(target=produce).start()
halvings = q.get()                                 # no timeout: a thread that died would leave it waiting
"""


def test_a_stop_in_a_thread_ends_the_trace_and_auto_runs_it_real(monkeypatch):
    monkeypatch.setattr(guesses, "LOOP_LIMIT", 50)
    ns: dict = {}
    tr = trace(STOPPED_IN_A_THREAD, ns, mode="auto")
    assert tr.mode == "real" and "loop" in tr.meta["fallback"] and 10 <= ns["halvings"] <= 12


POOL = """
from concurrent.futures import ThreadPoolExecutor
import torch
model = torch.nn.Linear(1024, 1024).cuda()
import sys
sys.xmem_test_pool = ThreadPoolExecutor(max_workers=1)   # a pool that outlives the trace

def step(n):
    with torch.no_grad():
        return model(torch.randn(n, 1024, device="cuda")).shape[0]

sizes = [f.result() for f in [sys.xmem_test_pool.submit(step, n) for n in (8, 16)]]
"""


def test_a_pool_s_tasks_run_in_the_trace_and_its_workers_stay_clean_after():
    ns: dict = {}
    tr = trace(POOL, ns, mode="fake")
    assert ns["sizes"] == [8, 16] and [e.bytes for e in tr.events if e.kind == "alloc"][-4:] == [8 * 4096] * 2 + [16 * 4096] * 2
    pool = sys.__dict__.pop("xmem_test_pool")
    try:  # the worker started in the trace: a real tensor, no mode left on it
        stacks = pool.submit(lambda: (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(),
                                      type(torch.ones(2) * 2).__name__)).result()
    finally:
        pool.shutdown()
    assert stacks == (0, 0, "Tensor")
