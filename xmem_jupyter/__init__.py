"""xmem_jupyter: the notebook front of xmem (the ``%%xmem`` magic and its widget).

Everything that computes lives in :mod:`xmem_engine`; this package only presents it.
"""
