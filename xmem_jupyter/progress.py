"""A progress indicator for tracing, which runs for seconds to minutes.

Tracing cannot say how far along it is (the code decides how much it does), so the bar
pulses and the label counts seconds and the GPU memory events seen so far. A daemon thread
refreshes it; widget updates from a thread reach the front end through the kernel's IOPub
thread, so they show while the kernel's main thread runs the user's code.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import ipywidgets as widgets


class Progress(widgets.HBox):
    """Pulsing bar + "tracing ... 3.2 s, 12,345 events" label (and what the trace is doing, where
    the probe has a ``status()``: a compile)."""

    def __init__(self, **kwargs):
        self.bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info",
                                         layout=widgets.Layout(width="12em"))
        self.label = widgets.Label("")
        super().__init__([self.bar, self.label], **kwargs)
        self.add_class("xmem-progress")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.layout.display = "none"

    def start(self, message: str, probe: Callable[[], int | None] = lambda: None, period: float = 0.25) -> None:
        """Show the indicator and refresh it every ``period`` seconds until :meth:`stop`."""
        self.stop()
        self._stop = threading.Event()
        self.layout.display = ""
        t0 = time.perf_counter()
        stop = self._stop

        def tick() -> None:
            k = 0
            while not stop.wait(period):
                k += 1
                self.bar.value = (k % 20) / 19.0
                n = probe()
                events = f", {n:,} events" if n else ""
                doing = getattr(probe, "status", lambda: "")()
                self.label.value = f"{message} {time.perf_counter() - t0:.1f} s{events}" + (f"; {doing}" if doing else "")

        self.label.value = f"{message} 0.0 s"
        self._thread = threading.Thread(target=tick, name="xmem-progress", daemon=True)
        self._thread.start()

    def stop(self, message: str = "") -> None:
        """Stop refreshing; hide the bar (and show ``message`` if given)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._thread = None
        self.bar.value = 0.0
        self.label.value = message
        self.layout.display = "" if message else "none"


class TracerProbe:
    """Counts the events of the tracer that is running (given to ``trace(setup=...)``)."""

    def __init__(self) -> None:
        self.tracer = None

    def setup(self, tracer) -> None:
        self.tracer = tracer

    def __call__(self) -> int | None:
        t = self.tracer
        events = getattr(t, "events", None)
        return len(events) if events is not None else None

    def status(self) -> str:
        """What the trace does now when it is not the user's code: a ``torch.compile`` compiling,
        which adds no event for a minute or more on a large model."""
        if getattr(self.tracer, "compiling", False):
            return "compiling for the target GPU (Inductor, on the CPU; a re-run reads it from xmem's cache)"
        return ""
