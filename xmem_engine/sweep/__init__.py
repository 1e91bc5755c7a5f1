"""Many estimates at once: ``xmem sweep``'s engine. ``grid.py`` (the cross product of scripts,
``--set`` values, GPUs and allocator settings, checked before anything runs), ``engine.py``
(work units, one trace each, re-simulated per GPU; a process pool, Ray, or in process) and
``output.py`` (rows as CSV, JSON Lines or Parquet, resumed after an interruption)."""

from xmem_engine.sweep.engine import Row, SweepInterrupted, Unit, plan, run_unit, run_units, sweep
from xmem_engine.sweep.grid import Grid, SweepInputError, make_grid, parse_set
from xmem_engine.sweep.output import Output, OutputError

__all__ = ["Grid", "Output", "OutputError", "Row", "SweepInputError", "SweepInterrupted", "Unit", "make_grid",
           "parse_set", "plan", "run_unit", "run_units", "sweep"]
