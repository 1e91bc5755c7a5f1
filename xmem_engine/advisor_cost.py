"""What a lever of the advisor costs, in terms a user can compare, and the rule that ranks them.

A cost in words ("+~30% compute", "2x the steps per update", "lower-precision activations")
cannot be compared with another: "cheapest" ranked activation checkpointing (one extra forward
of every block) above gradient accumulation x2 (no extra compute) without saying why (issue #35
item 3). Each lever's :class:`Cost` is structured instead, every cost is printed in the same
unit first (extra compute, % of a training step's FLOPs), and :data:`RANKING` says in one
sentence the order :meth:`Cost.key` sorts by.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: The rule :meth:`Cost.key` applies, in one sentence: the CLI, the widget, the HTML table and
#: the JSON (``advice.ranking``) all print it.
RANKING = ("Ranked cheapest first by, in turn: whether the change alters what is trained (another optimizer or "
           "effective batch: last), extra compute as a % of a training step's FLOPs (checkpointing runs each "
           "block's forward again in backward: about +33%), micro-steps per optimizer step (accumulation xk runs k "
           "passes at 1/k of the batch: no extra FLOPs), a lower precision, then a slower implementation of the "
           "same FLOPs; the cheapest change that fits is the first in this order that fits.")


@dataclass(frozen=True)
class Cost:
    """A lever's cost in the terms :data:`RANKING` ranks by (zero / empty: it costs nothing there)."""

    extra_compute_pct: int = 0  # extra FLOPs per optimizer step, % of the step's (forward + backward)
    micro_steps: int = 1  # forward/backward passes per optimizer step (accumulation xk: k, each 1/k the batch)
    precision: str = ""  # what runs in a lower precision, e.g. "bfloat16 activations"
    slower: str = ""  # same FLOPs, slower to run, e.g. "one kernel per parameter in the optimizer step"
    training: str = ""  # what it changes in the training itself (another optimizer, another effective batch)
    note: str = ""  # said but not ranked, e.g. "usually faster"

    def key(self) -> tuple[bool, int, int, bool, bool]:
        """The sort key of :data:`RANKING`: lower is cheaper."""
        return (bool(self.training), self.extra_compute_pct, self.micro_steps, bool(self.precision),
                bool(self.slower))

    @property
    def text(self) -> str:
        """The cost in words, its extra compute always first: "+0% compute; 2 micro-steps per optimizer step"."""
        parts = [f"+{'~' if self.extra_compute_pct else ''}{self.extra_compute_pct}% compute"]
        if self.micro_steps > 1:
            parts.append(f"{self.micro_steps} micro-steps per optimizer step")
        parts += [f"precision: {self.precision}"] if self.precision else []
        parts += [f"slower: {self.slower}"] if self.slower else []
        parts += [f"changes training: {self.training}"] if self.training else []
        return "; ".join(parts) + (f" ({self.note})" if self.note else "")

    def to_json(self) -> dict:
        return asdict(self)
