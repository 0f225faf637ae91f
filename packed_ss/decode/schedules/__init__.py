"""Decoding schedules, by name."""
from .adaptive import Adaptive
from .ar import AR
from .base import DRAFT_SOURCES, Schedule
from .linear import Linear
from .lookup import Lookup
from .packed import Packed
from .quadratic import Quadratic

SCHEDULES: dict[str, type[Schedule]] = {s.name: s for s in (AR, Linear, Quadratic, Packed, Lookup, Adaptive)}

__all__ = ["DRAFT_SOURCES", "SCHEDULES", "Schedule"]
