"""Decoding schedules, by name."""
from .ar import AR
from .base import Schedule
from .linear import Linear
from .packed import Packed
from .quadratic import Quadratic

SCHEDULES: dict[str, type[Schedule]] = {s.name: s for s in (AR, Linear, Quadratic, Packed)}

__all__ = ["SCHEDULES", "Schedule"]
