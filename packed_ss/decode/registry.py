"""Every schedule by name, in the decode orders it has: one line each, so a new schedule is its module and a line
here. `schedules(any_order)` is one order's table, name -> class (runtime.program.Program)."""
from __future__ import annotations

from . import any_order, schedules as ltr
from ..runtime.program import Program

SCHEDULES: dict[str, tuple[type[Program] | None, type[Program] | None]] = {   # name: (left to right, any order)
    "ar": (ltr.AR, any_order.schedules.AR),
    "linear": (ltr.Linear, any_order.schedules.Linear),
    "quadratic": (ltr.Quadratic, any_order.schedules.Quadratic),
    "packed": (ltr.Packed, any_order.schedules.Packed),
    "lookup": (ltr.Lookup, None),
    "adaptive": (ltr.Adaptive, None),
    "threshold": (None, any_order.schedules.Threshold),
}


def schedules(any_order: bool = False) -> dict[str, type[Program]]:
    """The schedules of one decode order, name -> class, in the registry's order."""
    return {name: pair[any_order] for name, pair in SCHEDULES.items() if pair[any_order] is not None}
