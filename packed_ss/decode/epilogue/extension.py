"""The compiled extension `packed_ss._epilogue` (csrc/), loaded once, and whether it can run on a device."""
from __future__ import annotations

import importlib

import torch

_module = None
_error: str | None = None
_loaded = False

BUILD_HINT = ("it is built by `pip install -e .` (or `pip install .`) when cmake and a C++ compiler are "
              "present, with its CUDA part when nvcc is found; see setup.py")


def native_module():
    """The compiled module, or None when it was not built or fails to load (reason: native_unavailable_reason)."""
    global _module, _error, _loaded
    if not _loaded:
        _loaded = True
        try:
            _module = importlib.import_module("packed_ss._epilogue")
        except ImportError as err:
            _module, _error = None, f"packed_ss._epilogue is not importable ({err})"
    return _module


def native_unavailable_reason(device) -> str | None:
    """None if the native epilogue can run on `device`, else a one-line reason."""
    device = torch.device(device)
    mod = native_module()
    if mod is None:
        return f"the native epilogue is not available: {_error}; {BUILD_HINT}"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not mod.HAS_CUDA:
            return f"the native epilogue was built without CUDA (no nvcc at build time); {BUILD_HINT}"
        count, message = mod.cuda_device_count()
        if count < 1:
            return f"the CUDA epilogue found no usable CUDA device ({message or 'none'})"
        return None
    return f"the native epilogue supports cpu and cuda devices, not {device.type}"


def native_available(device) -> bool:
    return native_unavailable_reason(device) is None
