"""How a figure a person reads is written, one rule wherever it shows (the log, the console, the
terminal's progress line, Prefect's tables and pages): 4 significant digits, and a time in seconds
no finer than the millisecond. So a loss reads 0.06249 everywhere, a goodput part 0.064 s (not
0.0644 s), and a time under half a millisecond "<0.001" (never 0, which reads as "not measured").
A share is a whole percentage ("<1%" when it is not 0). Files (run.json) keep the exact figures."""

from __future__ import annotations

import math

#: Significant digits of every figure a person reads.
SIGNIFICANT = 4
#: The finest time shown, in seconds.
FINEST_S = 0.001


def number(value: float) -> str:
    """``value`` to ``SIGNIFICANT`` digits: "0.06249", "28.19", "1.235e+05"."""
    return f"{value:.{SIGNIFICANT}g}"


def rounded(value: float) -> float:
    """``value`` rounded as ``number`` writes it, for a table cell that must stay a number."""
    return float(number(value)) if math.isfinite(value) else value


def seconds(value: float) -> str:
    """``value`` seconds without the unit: "28.19", "0.064", "0" and, measured but under half a
    millisecond, "<0.001"."""
    if 0 < value < FINEST_S / 2:
        return f"<{FINEST_S:g}"
    return f"{rounded(round(value, 3)):g}"


def share(fraction: float) -> str:
    """``fraction`` (0 to 1) as a whole percentage: "23%", "<1%" when under half a percent but not 0."""
    return "<1%" if 0 < fraction < 0.005 else f"{fraction:.0%}"
