"""Any-order schedules (paper appendix C), by name."""
from .ar import AR
from .base import AnyOrderSchedule
from .linear import Linear
from .threshold import Threshold
from .packed import Packed
from .quadratic import Quadratic

SCHEDULES: dict[str, type[AnyOrderSchedule]] = {s.name: s for s in (AR, Linear, Quadratic, Packed, Threshold)}

__all__ = ["SCHEDULES", "AnyOrderSchedule"]
