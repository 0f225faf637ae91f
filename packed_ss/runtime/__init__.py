"""The runtime both orders share: requests, programs' steps, the K/V pool, the scheduler, the decode loop with its
one-read poll, graphs (the words: packed_ss/__init__.py)."""
from .loop import Runtime
from .program import ModelInput, Step
from .request import GenerateResult, Request

__all__ = ["GenerateResult", "ModelInput", "Request", "Runtime", "Step"]
