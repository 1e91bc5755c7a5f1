"""Sweep speed: one grid through ``xmem sweep`` (process pool, and Ray on a local cluster)
beside a plain loop of ``xmem estimate`` calls, and beside the grid's traces alone.

The grid: 2 scripts (``tests/advise_scripts/cnn.py``, a VGG-style CNN, and ``transformer.py``,
a GPT-style decoder; both plain torch) x 6 catalog GPUs x 8 values of ``batch_size`` = 96
points. A sweep traces each script once with the batch size as a symbol (at its smallest
value), makes the other 7 from that trace, and re-simulates each for the 6 GPUs: 2 traces (4
with the two-trace family, 16 before it; ``--exact``: 96); the loop traces all 96 points.

Run: ``python benchmarks/sweep_speed.py [--loop-points N] [--skip-ray] [--heatmap FILE.png]``.
Prints each wall time and the ratios, the peak memory of the sweep's processes (summed over
the process tree, sampled every 0.1 s; and the largest single process, from
``getrusage(RUSAGE_CHILDREN)``), and whether the engines' rows agree with each other and with
the loop's estimates. ``--loop-points N`` times only N of the loop's 96 calls and scales up
(said so in the output). ``--heatmap`` also saves the pool's heat map (xmem_jupyter's
``heat_map``) as a PNG, drawn by chromium through Playwright.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCRIPTS = [str(REPO / "tests" / "advise_scripts" / "cnn.py"), str(REPO / "tests" / "advise_scripts" / "transformer.py")]
GPUS = ["RTX-4060-8GB", "T4", "L4", "A100-SXM4-40GB", "H100-SXM-80GB", "H200"]
BATCHES = [2, 4, 8, 16, 32, 64, 128, 256]
VAR = "batch_size"
XMEM = [sys.executable, "-m", "xmem_engine"]


def measured(cmd: list[str]) -> tuple[float, int, int, subprocess.CompletedProcess]:
    """Run ``cmd``: wall seconds, the peak of its process tree's summed RSS (sampled), and
    the largest RSS of one process in it (``ru_maxrss`` of the children, in a helper so
    that each measurement has its own)."""
    import psutil

    helper = ("import json, resource, subprocess, sys\n"
              "p = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True)\n"
              "sys.stderr.write(p.stderr[-4000:]); sys.stdout.write(p.stdout)\n"
              "print(json.dumps({'rc': p.returncode, "
              "'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", helper, json.dumps(cmd)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    *text, last = out.strip().splitlines() or ["{}"]
    info = json.loads(last)
    done = subprocess.CompletedProcess(cmd, info.get("rc"), "\n".join(text), err)
    return wall, peak, info.get("maxrss_kb", 0) * 1024, done


def sweep_cmd(out: str, *extra: str, gpus: list[str] = GPUS) -> list[str]:
    return [*XMEM, "sweep", *SCRIPTS, "--gpu", ",".join(gpus), "--set", f"{VAR}=" + ",".join(map(str, BATCHES)),
            "--out", out, "--quiet", *extra]


def ran(p: subprocess.CompletedProcess, out: str) -> None:
    """The sweep ran every point (exit 0) and wrote them: else show why and stop."""
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit(f"the sweep failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")


def traces_alone() -> tuple[float, float]:
    """The 16 traces, one after another in a fresh process, as ``xmem`` would start: (wall
    seconds of the whole process, imports included; the traces' own seconds)."""
    code = ("import json, sys\n"
            "from xmem_engine.estimate import resolve_gpu\n"
            "from xmem_engine.tracing import trace_script\n"
            "scripts, batches, gpu, var = json.loads(sys.argv[1])\n"
            "own = sum(trace_script(s, overrides={var: str(b)}, device=resolve_gpu(gpu).properties()).seconds\n"
            "          for s in scripts for b in batches)\n"
            "print(json.dumps(own))\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, json.dumps([SCRIPTS, BATCHES, GPUS[0], VAR])],
                       capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(p.stdout.strip().splitlines()[-1])


def plain_loop(limit: int | None) -> tuple[float, int, dict]:
    """``xmem estimate`` once per point, one after another: (seconds, calls made, peaks)."""
    points = [(s, g, b) for s in SCRIPTS for b in BATCHES for g in GPUS]
    if limit:
        step = max(1, len(points) // limit)
        points = points[::step][:limit]
    peaks = {}
    t0 = time.perf_counter()
    for s, g, b in points:
        p = subprocess.run([*XMEM, "estimate", s, "--gpu", g, "--set", f"{VAR}={b}", "--json"],
                           capture_output=True, text=True)
        if p.stdout.strip().startswith("{"):
            peaks[(s, g, str(b))] = json.loads(p.stdout).get("peak_device_bytes")
    return time.perf_counter() - t0, len(points), peaks


def rows_of(path: str) -> list:
    from xmem_engine.sweep import Row
    from xmem_engine.sweep.output import Output

    return Output(path, Row, [VAR]).rows


def results(rows: list) -> list:
    return sorted(json.dumps(r.result(), sort_keys=True, default=str) for r in rows)


def save_heatmap(rows: list, png: str) -> str:
    """The heat maps as HTML, screenshot to ``png`` by chromium (Playwright)."""
    from bokeh.io import save
    from bokeh.layouts import column
    from bokeh.resources import INLINE

    from xmem_jupyter.sweep_view import heat_map

    figs = [heat_map(rows, script=s) for s in dict.fromkeys(r.script for r in rows)]
    from playwright.sync_api import sync_playwright

    # The HTML page is only the screenshot's source: it goes with the temporary folder.
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        html = str(Path(tmp) / "heatmap.html")
        save(column(*figs), html, resources=INLINE, title="xmem sweep")
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 900, "height": 900})
        page.goto(Path(html).resolve().as_uri())
        page.wait_for_timeout(1500)
        page.locator(".bk-Column").first.screenshot(path=png)
        browser.close()
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop-points", type=int, metavar="N", help="time only N of the loop's calls, and scale up")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--heatmap", metavar="PNG", help="also save the heat map of the pool's rows as a PNG")
    args = ap.parse_args()
    n_points = len(SCRIPTS) * len(GPUS) * len(BATCHES)
    n_traces = len(SCRIPTS) * len(BATCHES)
    tmp = tempfile.mkdtemp(prefix="xmem-sweep-bench-")
    print(f"# xmem sweep speed, {datetime.date.today()}, {platform.node()}: {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the start")
    print(f"grid: {len(SCRIPTS)} scripts x {len(GPUS)} GPUs x {len(BATCHES)} {VAR} = {n_points} points, "
          f"{n_traces} traces")

    t_wall, t_own = traces_alone()
    print(f"{n_traces} traces alone, one fresh process:  {t_wall:6.1f} s (the traces' own seconds: {t_own:.1f}; "
          f"the rest: starting Python, importing torch)")

    one_out = os.path.join(tmp, "one.csv")
    wall1, _, _, p = measured(sweep_cmd(one_out, gpus=GPUS[:1]))
    ran(p, one_out)
    print(f"xmem sweep, local pool, 1 GPU ({n_traces} points):  {wall1:6.1f} s")
    local_out = os.path.join(tmp, "local.csv")
    wall, tree_peak, one_peak, p = measured(sweep_cmd(local_out))
    ran(p, local_out)
    local = rows_of(local_out)
    print(f"xmem sweep, local pool, {len(GPUS)} GPUs ({n_points} points): {wall:6.1f} s = {wall / t_wall:.2f} x the "
          f"traces alone, {wall / wall1:.2f} x the 1-GPU sweep; {os.cpu_count()} workers; peak RSS "
          f"{tree_peak / 2**30:.2f} GiB summed over its processes (sampled), {one_peak / 2**30:.2f} GiB the "
          "largest one")
    family = {(r.script, r.settings[VAR]) for r in local if any("was not traced" in n for n in r.notes)}
    print(f"  traced: {n_traces - len(family)} of the {n_traces} (script, {VAR}) points (each script's {VAR} "
          f"axis once with {VAR} a symbol, or at its ends where it cannot be one); the other {len(family)} "
          f"from those traces (xmem_engine/batch_family.py)")
    sim = sorted(r.simulate_seconds for r in local if r.status == "ok")
    print(f"  re-simulation of a trace for one more GPU: median {sim[len(sim) // 2] * 1000:.0f} ms, "
          f"max {sim[-1] * 1000:.0f} ms (a trace: {t_own / n_traces:.2f} s on average)")
    times = {"local": wall, "traces": t_wall}
    exact_out = os.path.join(tmp, "exact.csv")
    xwall, _, _, p = measured(sweep_cmd(exact_out, "--exact"))
    ran(p, exact_out)
    exact = rows_of(exact_out)
    print(f"xmem sweep --exact, local pool (a trace per GPU: {n_points} traces): {xwall:6.1f} s "
          f"= {xwall / wall:.2f} x the re-simulating sweep")

    if not args.skip_ray:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the head on 127.0.0.1
        import ray
        import ray._private.ray_constants as rc

        rc.ENABLE_RAY_CLUSTER = False
        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        start = time.perf_counter() - t0
        address = ray.get_runtime_context().gcs_address
        ray_out = os.path.join(tmp, "ray.csv")
        try:
            # (ray.init set RAY_AUTH_MODE=token in this environment: the CLI's driver inherits it)
            rwall, _, _, p = measured(sweep_cmd(ray_out, "--engine", "ray", "--address", address))
        finally:
            ray.shutdown()
        ran(p, ray_out)
        same = results(rows_of(ray_out)) == results(local)
        print(f"xmem sweep, Ray (a local cluster at {address}, {os.cpu_count()} CPUs): {rwall:6.1f} s "
              f"= {rwall / t_wall:.2f} x the traces alone (starting the cluster: {start:.1f} s, not counted); "
              f"rows equal the pool's: {'yes' if same else 'NO'}")
        times["ray"] = rwall

    lwall, calls, peaks = plain_loop(args.loop_points)
    full = lwall * n_points / calls
    scaled = f" ({calls} calls timed: {lwall:.1f} s, scaled to {n_points})" if calls < n_points else ""
    print(f"plain loop of `xmem estimate`, {n_points} calls:  {full:7.1f} s{scaled}")
    for name, rows in (("--exact sweep's", exact), (f"sweep's (traced for {GPUS[0]}, re-simulated)", local)):
        by_point = {(r.script, r.gpu, r.settings[VAR]): r.peak_device_bytes for r in rows if r.kind == "point"}
        differ = {k: by_point.get(k, 0) - v for k, v in peaks.items() if by_point.get(k) != v}
        worst = max(differ.items(), key=lambda kv: abs(kv[1]) / peaks[kv[0]], default=None)
        text = ""
        if worst:
            (script, gpu, value), diff = worst
            text = (f"; the largest difference: {Path(script).name} on {gpu} at {VAR}={value}, "
                    f"{diff / 2**20:+.0f} MiB ({100 * diff / peaks[worst[0]]:+.1f}%)")
        print(f"  the loop's peaks (each GPU traced for itself) vs the {name}: {len(peaks) - len(differ)}/{len(peaks)} "
              f"equal{text}")
    print("ratios: loop / local pool = {:.1f}x".format(full / times["local"])
          + (", loop / Ray = {:.1f}x".format(full / times["ray"]) if "ray" in times else "")
          + ", local pool / traces alone = {:.2f}".format(times["local"] / t_wall))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine slows every figure)")
    if args.heatmap:
        print(f"heat map: {save_heatmap(local, args.heatmap)}")


if __name__ == "__main__":
    main()
