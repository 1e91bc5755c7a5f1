"""The ``xmem`` command: ``main.py`` (the parser, ``estimate``, ``trace``, ``simulate``, ``replay``,
``gpus``), ``advise.py``, ``sweep.py``, ``ops.py`` and ``cache.py`` (a subcommand each), ``common.py`` (exit
codes, errors and the input checks every subcommand shares)."""

from xmem_engine.cli.common import REPORT_HINT
from xmem_engine.cli.main import build_parser, main

__all__ = ["REPORT_HINT", "build_parser", "main"]
