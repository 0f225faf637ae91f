"""The step epilogue: one interface (base.Epilogue), two implementations with bit-identical results.

`TorchEpilogue` (reference.py) is plain torch; `NativeEpilogue` (native.py) runs csrc/ in one call per
step. Which one a schedule gets is a choice of object (`make_epilogue`), not a second code path.
"""
import warnings

from .base import Epilogue, Rows
from .build import check_build, main
from .extension import native_available, native_module, native_unavailable_reason
from .native import NativeEpilogue
from .reference import TorchEpilogue

EPILOGUES = {"torch": TorchEpilogue, "native": NativeEpilogue}


def make_epilogue(kind: str, device, width: int, sampled: bool) -> Epilogue:
    return EPILOGUES[kind](device, width, sampled)


def pick_epilogue(epilogue: str | None, device) -> str:
    """The epilogue an engine asked for `epilogue` uses on `device`: None picks native where it is built for the
    device, else torch with a warning saying why; "native" where it is not is a RuntimeError saying why."""
    if epilogue == "torch":
        return "torch"
    reason = native_unavailable_reason(device)
    if reason is None:
        return "native"
    if epilogue == "native":
        raise RuntimeError(reason)
    warnings.warn(f"packed-ss: using the torch epilogue: {reason}", RuntimeWarning, stacklevel=3)
    return "torch"


__all__ = ["EPILOGUES", "Epilogue", "NativeEpilogue", "Rows", "TorchEpilogue", "check_build", "main",
           "make_epilogue", "native_available", "native_module", "native_unavailable_reason", "pick_epilogue"]
