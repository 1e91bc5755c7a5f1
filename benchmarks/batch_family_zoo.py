"""Is a step's trace one family in the batch size? Checked on the zoo, event for event.

    .venv-bench/bin/python benchmarks/batch_family_zoo.py [--only NAME ...] [--values 4,8,12,24,40]

``xmem_engine/batch_family.py`` writes the trace at any batch size from two real ones (every
request an affine function of the batch); the widget's slider, ``--max-batch`` and the
advisor use it. Here each script is traced for real (fake mode) at five batch sizes; the family
is fitted on the first two and must equal the real trace at the other three (a sequence length:
12 or 16 times the values), request for request and record for record (``same_trace``: what an estimate reads). Per script it prints
whether the batch is affine there, and where not, why: the two traces differ in their ops
(``NotAffine``, with the first place), or the family misses a real trace (the first event
that differs). The scripts are the ground-truth workloads (``benchmarks/workloads``, their
``batch_size``) and zoo scripts (``benchmarks/zoo``) whose batch is a variable or a literal
this benchmark rewrites (a detection model's image count, an LSTM's sentence count).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xmem_engine.trace import TraceEvent  # noqa: E402
from xmem_engine.batch_family import BatchFamily, NotAffine, _collapse, same_trace  # noqa: E402

GPU = "A100-SXM4-80GB"
_EVENT_FIELDS = [f.name for f in fields(TraceEvent)]
# name -> (script, the batch variable, or the literal texts to rewrite with the batch size as {B})
SCRIPTS: dict[str, tuple[str, str | list[tuple[str, str]]]] = {
    "resnet50": ("workloads/resnet50.py", "batch_size"),
    "mobilenetv2": ("workloads/mobilenetv2.py", "batch_size"),
    "vit": ("workloads/vit.py", "batch_size"),
    "bert": ("workloads/bert.py", "batch_size"),
    "gpt2": ("workloads/gpt2.py", "batch_size"),
    "grad_accumulation (resnet50)": ("zoo/grad_accumulation.py", "micro_batch"),
    "hf_t5_seq2seq": ("zoo/hf_t5_seq2seq.py", "batch_size"),
    "lstm_tagger": ("zoo/lstm_tagger.py", [("(64,)", "({B},)"), ("torch.zeros(64,", "torch.zeros({B},")]),
    "gru_classifier": ("zoo/gru_classifier.py", [("(200, 128)", "(200, {B})"), ("(128,)", "({B},)")]),
    "clip_contrastive": ("zoo/clip_contrastive.py", [("randn(64,", "randn({B},"), ("(64, 77)", "({B}, 77)")]),
    # the second dimension users slide: a sequence length (causal attention, S x S where materialised)
    "gpt2 seq_len": ("workloads/gpt2.py", "seq_len"),
    "bert seq_len": ("workloads/bert.py", "seq_len"),
    "tv_fasterrcnn": ("zoo/tv_fasterrcnn.py", [("for _ in range(4)", "for _ in range({B})")]),
}
#: scripts whose variable takes these times --values (a sequence length, not a batch; BERT's at most 512)
SCALED = {"gpt2 seq_len": 16, "bert seq_len": 12}


def traced(path: Path, how, b: int, symbolic: bool = False):
    """The script's trace at ``b``; ``symbolic``: its trace with the batch as a symbol whose
    value is ``b``, as a ``SymbolicFamily`` (``NotSymbolic`` says why not)."""
    from xmem_engine.batch_family import symbolic_family
    from xmem_engine.estimate import resolve_gpu
    from xmem_engine.tracing import trace_script

    source = path.read_text()
    var = how
    if not isinstance(how, str):  # a literal: made a variable of its own, on a line above the script's first
        var = "xmem_batch"
        for old, new in how:
            if old not in source:
                raise SystemExit(f"{path.name}: no {old!r} to rewrite")
            source = source.replace(old, new.format(B=var))
        source = f"{var} = {b}\n{source}"
    kw = dict(source=source, device=resolve_gpu(GPU).properties())
    if symbolic:
        return symbolic_family(path, var, b, **kw)
    return trace_script(path, mode="fake", overrides={var: str(b)}, **kw)


def first_difference(a, b) -> str:
    """The first event (reductions' buffers left out) or record where two traces differ."""
    (ra, ma), (rb, mb) = _collapse(a), _collapse(b)
    if len(ra) != len(rb):
        return f"{len(ra):,} vs {len(rb):,} events"
    op, nbytes, shape = (_EVENT_FIELDS.index(f) for f in ("op", "bytes", "shape"))
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y:
            return f"event {i} ({x[op]}): {x[nbytes]} bytes {x[shape]} vs {y[nbytes]} bytes {y[shape]}"
    return "records differ: " + ", ".join(k for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k))


def first_other_op(a, b) -> str:
    """Where two traces' ops part (their reductions' buffers left out, as the family has them)."""
    (ra, _), (rb, _) = _collapse(a), _collapse(b)
    kind, op, source = (_EVENT_FIELDS.index(f) for f in ("kind", "op", "source"))
    for i, (x, y) in enumerate(zip(ra, rb)):
        if (x[kind], x[op]) != (y[kind], y[op]):
            where = lambda r: str(r[source]).replace(f"{ROOT}/", "")  # noqa: E731
            return f"; first at event {i}: {x[kind]} {x[op]} ({where(x)}) vs {y[kind]} {y[op]} ({where(y)})"
    return ""


def check(name: str, values: list[int], traces: dict) -> tuple[str, str, float]:
    script, how = SCRIPTS[name]
    path = ROOT / "benchmarks" / script
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the scripts' own prints
        traces.update({b: traced(path, how, b) for b in values})
    seconds = time.perf_counter() - t0
    b0, b1, *rest = values
    try:
        fam = BatchFamily.fit(b0, traces[b0], b1, traces[b1])
    except NotAffine as e:
        return "no", f"{b0} and {b1} are not one family: {e}{first_other_op(traces[b0], traces[b1])}", seconds
    for b in rest:
        derived = fam.trace_at(b)
        if derived is None:
            return "no", f"a size would be negative at {b}", seconds
        if not same_trace(derived, traces[b]):
            return "no", f"the family of {b0} and {b1} is not the real trace at {b}: " \
                         f"{first_difference(derived, traces[b])}", seconds
    n = len(traces[b0].events)
    return "yes", f"{n:,} events, the family equals the real trace at {', '.join(map(str, rest))}", seconds


def symbolic_check(name: str, values: list[int], traces: dict) -> tuple[str, str, float]:
    """One trace with the batch a symbol, at the second value, against the real traces at all
    (``batch_family.SymbolicFamily``); where a guard does not hold at a value, that value is
    named, not compared."""
    from xmem_engine.batch_family import NotSymbolic, SymbolicFamily

    script, how = SCRIPTS[name]
    path = ROOT / "benchmarks" / script
    b0 = values[1]
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            fam: SymbolicFamily = traced(path, how, b0, symbolic=True)
    except NotSymbolic as e:
        return "no", str(e).replace(f"{ROOT}/", ""), time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    equal, outside = [], []
    for b in values:
        derived = fam.trace_at(b)
        if derived is None:
            outside.append(f"{b} ({str(fam.broken_at(b)).replace(f'{ROOT}/', '')})")
            continue
        if not same_trace(derived, traces[b]):
            return "no", f"the symbolic trace at {b0} is not the real trace at {b}: " \
                         f"{first_difference(derived, traces[b])}", seconds
        equal.append(str(b))
    guards = len(fam.batch.guards)
    why = f"{guards} guard{'s' * (guards != 1)}; equal at {', '.join(equal)}"
    return ("yes" if not outside else "in part"), why + (f"; outside its guards: {'; '.join(outside)}"
                                                         if outside else ""), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="script names (default: all)")
    ap.add_argument("--values", default="4,8,12,24,40", help="the batch sizes: the family is fitted on the first two")
    ap.add_argument("--no-symbolic", action="store_true", help="the two-trace family only")
    args = ap.parse_args()
    values = [int(v) for v in args.values.split(",")]
    print(f"| script | one family in the batch | why / what was checked | seconds for {len(values)} traces "
          f"| symbolic | why / what was checked | seconds, one symbolic trace | symbolic / one trace |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.only or SCRIPTS:
        scaled = [v * SCALED.get(name, 1) for v in values]
        traces: dict = {}
        try:
            verdict, why, seconds = check(name, scaled, traces)
        except ModuleNotFoundError as e:
            verdict, why, seconds = "skipped", f"needs {e.name} (make bench-setup)", 0.0
        except Exception as e:  # a script that fails to trace is a row, not the end of the table
            verdict, why, seconds = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", 0.0
        sym = ("-", "-", 0.0)
        if len(traces) == len(scaled) and not args.no_symbolic:
            sym = symbolic_check(name, scaled, traces)
        ratio = f"{sym[2] / (seconds / len(scaled)):.2f}" if sym[2] and seconds else "-"
        print(f"| {name} | {verdict} | {why} | {seconds:.1f} | {sym[0]} | {sym[1]} | {sym[2]:.1f} | {ratio} |",
              flush=True)
        gc.collect()


if __name__ == "__main__":
    main()
