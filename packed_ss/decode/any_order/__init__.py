"""Any-order decoding for SetDLM-style models (paper appendix C): Alg. 3 and its baselines as fixed-shape,
device-resident steps."""
from .decoder import AnyOrderDecoder
from .schedules import SCHEDULES as _SCHEDULES
from .serial import serial_reference
from .state import ORDERS, AnyOrderState, Iteration

ANY_ORDER_SCHEDULES = tuple(_SCHEDULES)

__all__ = ["ANY_ORDER_SCHEDULES", "ORDERS", "AnyOrderDecoder", "AnyOrderState", "Iteration", "serial_reference"]
