"""``torch.multiprocessing.spawn`` / ``start_processes`` and ``elastic_launch`` run here, as the traced rank.

PyTorch's DDP tutorial ("Getting Started with Distributed Data Parallel"), Lightning's
``strategy="ddp_spawn"`` and the scripts written like them start one process per GPU with
``mp.spawn(fn, args=(...), nprocs=world_size)``, each calling ``fn(i, *args)``. A child process
runs outside the tracer: it has no virtual GPU ("ProcessGroupNCCL ... no GPUs found") and its
memory would not be recorded. Every process runs the same code on its own GPU, so the trace
runs one of them, the traced rank's index on its node, in this process: what the estimate
(``--world-size``, ``--rank``) is of.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable

from xmem_engine.tracing.frames import user_frame
from xmem_engine.tracing.patches import on_import


class SpawnedHere:
    """What ``start_processes(..., join=False)`` returns (a ``ProcessContext``): the process
    ran to its end inside the call, so ``join`` is done at once."""

    def __init__(self) -> None:
        self.processes: list = []
        self.error_files: list = []

    def pids(self) -> list[int]:
        return [os.getpid()]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return True


def _here(world: Any, notes: list[str], who: str, nprocs: int) -> None:
    """Check that ``nprocs`` processes a node are the world being traced, and say which runs."""
    if nprocs != world.local_size:
        raise ValueError(
            f"{who} starts {nprocs} processes (one per GPU), but xmem is tracing {world.local_size} "
            f"process{'es' if world.local_size != 1 else ''} per node: estimate with --world-size {nprocs} "
            f"(and --gpus-per-node for several nodes)")
    notes.append(f"{who} started {nprocs} process{'es' if nprocs != 1 else ''} at {user_frame(4)}: process "
                 f"{world.local_rank} ran in this one (each runs the same code on its own GPU)")


def launch_agent_here(world: Any, notes: list[str]) -> Callable[..., Any]:
    """``torch.distributed.launcher.api.launch_agent`` (``elastic_launch``, torchrun as a
    function: accelerate's ``notebook_launcher`` on several GPUs) calling the entry point here;
    the environment is already torchrun's for the traced rank."""

    def launch_agent(config: Any, entrypoint: Any, args: list, **kwargs: Any) -> dict[int, Any]:
        if not callable(entrypoint):
            raise ValueError(
                f"elastic_launch of a program ({entrypoint!r}) starts processes xmem cannot trace: estimate "
                f"the script it runs, with xmem estimate SCRIPT --world-size N")
        _here(world, notes, "elastic_launch", int(config.nproc_per_node))
        return {world.local_rank: entrypoint(*args)}

    return launch_agent


def in_process(world: Any, notes: list[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``start_processes`` and ``spawn`` that call ``fn(world.local_rank, *args)`` here."""

    def start_processes(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
                        daemon: bool = False, start_method: str = "spawn") -> SpawnedHere | None:
        _here(world, notes, "torch.multiprocessing", nprocs)
        fn(world.local_rank, *args)
        return None if join else SpawnedHere()

    def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
              daemon: bool = False, start_method: str = "spawn") -> SpawnedHere | None:
        return start_processes(fn, args, nprocs, join, daemon, "spawn")

    return start_processes, spawn


def processes_in_process(stack: contextlib.ExitStack, world: Any, notes: list[str],
                         replace: Callable[[contextlib.ExitStack, Any, str, Any], None]) -> None:
    """Replace both functions wherever the code may call them from (``replace`` is
    ``distributed._replace_everywhere``: ``from torch.multiprocessing import spawn`` too)."""
    import torch.multiprocessing

    mp_spawn = sys.modules["torch.multiprocessing.spawn"]  # the module (its package's ``spawn`` is the function)
    start_processes, spawn = in_process(world, notes)
    replace(stack, mp_spawn.start_processes, "start_processes", start_processes)
    replace(stack, mp_spawn.spawn, "spawn", spawn)
    # elastic_launch as the code imports it: importing torch's elastic agent for every trace
    # would add its start-up to every estimate
    stack.enter_context(on_import(["torch.distributed.launcher.api"], lambda launcher: replace(
        stack, launcher.launch_agent, "launch_agent", launch_agent_here(world, notes))))
