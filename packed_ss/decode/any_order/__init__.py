"""Any-order decoding for SetDLM-style models (paper appendix C): Alg. 3 and its baselines as fixed-shape,
device-resident steps, and the serial reference of Proposition C.1."""
from . import schedules
from .serial import serial_reference
from .state import ORDERS, AnyOrderState, Iteration

__all__ = ["ORDERS", "AnyOrderState", "Iteration", "schedules", "serial_reference"]
