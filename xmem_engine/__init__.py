"""xmem_engine: estimate a PyTorch training step's GPU memory on the CPU.

Data flows one way, each stage a plain data structure the next one reads:

    user code --tracer--> Trace (trace.py) --allocator simulation--> statistics,
    snapshot and timeline (allocator.py) --> estimate --> views (xmem_jupyter)

This package imports no Jupyter code.
"""

__version__ = "0.1.0"
