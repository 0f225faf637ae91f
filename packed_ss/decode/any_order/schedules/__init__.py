"""Any-order schedules (paper appendix C; by name: decode/registry.py)."""
from .ar import AR
from .base import AnyOrderSchedule
from .linear import Linear
from .threshold import Threshold
from .packed import Packed
from .quadratic import Quadratic

__all__ = ["AR", "AnyOrderSchedule", "Linear", "Packed", "Quadratic", "Threshold"]
