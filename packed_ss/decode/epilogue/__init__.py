"""The step epilogue: one interface (base.Epilogue), two implementations with bit-identical results.

`TorchEpilogue` (reference.py) is plain torch; `NativeEpilogue` (native.py) runs csrc/ in one call per
step. Which one a schedule gets is a choice of object (`make_epilogue`), not a second code path.
"""
from .base import Epilogue, Rows
from .build import check_build, main
from .extension import native_available, native_module, native_unavailable_reason
from .native import NativeEpilogue
from .reference import TorchEpilogue

EPILOGUES = {"torch": TorchEpilogue, "native": NativeEpilogue}


def make_epilogue(kind: str, device, width: int, sampled: bool) -> Epilogue:
    return EPILOGUES[kind](device, width, sampled)


__all__ = ["EPILOGUES", "Epilogue", "NativeEpilogue", "Rows", "TorchEpilogue", "check_build", "main",
           "make_epilogue", "native_available", "native_module", "native_unavailable_reason"]
