"""The runtime both orders share: requests, programs' steps, the decode loop with its one-read poll, graphs."""
from .loop import MODES, Runtime
from .program import ModelInput, Step
from .request import GenerateResult, Request

__all__ = ["GenerateResult", "MODES", "ModelInput", "Request", "Runtime", "Step"]
