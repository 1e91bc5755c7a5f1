"""The fine-tuning demo notebook (``demo_notebooks/07_will_my_qlora_fit_on_a_t4.ipynb``) runs
headless in the fine-tuning environment, and what its text claims is what it computes. The
checks are ``tests/jupyter/test_notebooks.py``'s, which runs the other notebooks in the test environment."""

from __future__ import annotations

import pytest

for _lib in ("nbformat", "nbclient", "ipykernel", "bitsandbytes", "peft", "transformers"):
    pytest.importorskip(_lib)

from tests.jupyter.test_notebooks import ROOT, _run, check_notebook, requirements  # noqa: E402

NOTEBOOKS = [p for p in sorted((ROOT / "demo_notebooks").glob("*.ipynb")) if requirements(p)]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_fine_tuning_notebook_runs_and_says_what_it_computes(path, tmp_path):
    check_notebook(path, _run(path, tmp_path))
