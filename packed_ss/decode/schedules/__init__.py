"""Left-to-right decoding schedules (by name: decode/registry.py)."""
from .adaptive import Adaptive
from .ar import AR
from .base import DRAFT_SOURCES, Schedule
from .linear import Linear
from .lookup import Lookup
from .packed import Packed
from .quadratic import Quadratic

__all__ = ["AR", "Adaptive", "DRAFT_SOURCES", "Linear", "Lookup", "Packed", "Quadratic", "Schedule"]
