"""The OpenAI request bodies the server takes, checked field by field into a `Job`, and its error bodies.

Completions (`prompt`: a string or a list of token ids) and chat completions (`messages`, rendered with the
tokenizer's chat template where the model directory has one, else the plain format of `plain_chat`). Every
bad field is an `APIError` naming it (an OpenAI-style 400 body); arguments the engine checks itself
(lengths against the context, token ids) come back from it as ValueErrors and are mapped to their field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_STOP = 4            # stop strings per request, as the OpenAI API allows
DEFAULT_MAX_TOKENS = 16  # the completions API's default


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}

    def __reduce__(self):      # pickled whole, so that a replica's refusal reaches the ingress as itself
        return APIError, (self.status, self.message, self.param, self.kind)


@dataclass
class Job:
    """One request as the engine takes it, and how to answer it."""
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    stop: list[str] = field(default_factory=list)
    sampling: dict = field(default_factory=dict)   # temperature, top_k, top_p, seed


def plain_chat(messages: list[dict]) -> str:
    """The chat format for a tokenizer without a template: one "Role: content" line per message, then
    "Assistant:" for the reply."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines + ["Assistant:"])


def _number(body: dict, name: str, low: float, high: float, default, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kind = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise APIError(400, f"{name} must be {what} in [{low}, {high}], got {value!r}", name)
    return value


def parse(body, chat: bool, encode, render_chat, model_names: set[str]) -> Job:
    """A Job from a request body (already JSON-decoded); `encode(text) -> ids`, `render_chat(messages) -> str`."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in model_names:
        raise APIError(404, f"model {model!r} is not served here (served: {sorted(model_names)})", "model",
                       "model_not_found")
    n = body.get("n", 1)
    if n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {n!r}", "n")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise APIError(400, "messages must be a non-empty list of {role, content} objects with string "
                                "content", "messages")
        prompt_ids = encode(render_chat(messages))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise APIError(400, "prompt must be a string or a non-empty list of token ids", "prompt")
    if not prompt_ids:
        raise APIError(400, "the prompt encodes to no tokens", "messages" if chat else "prompt")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "stop must be a non-empty string or a list of them", "stop")
    if len(stop) > MAX_STOP:
        raise APIError(400, f"stop takes at most {MAX_STOP} strings, got {len(stop)}", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be a boolean, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    limit_name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number(body, limit_name, 1, 2**31 - 1, DEFAULT_MAX_TOKENS, integer=True)
    sampling = {"temperature": float(_number(body, "temperature", 0.0, 2.0, 1.0)),
                "top_p": _number(body, "top_p", 1e-9, 1.0, None),
                "top_k": _number(body, "top_k", 1, 2**31 - 1, None, integer=True),
                "seed": _number(body, "seed", 0, 2**63 - 1, None, integer=True)}
    if sampling["top_p"] == 1.0:
        sampling["top_p"] = None
    return Job(chat, prompt_ids, max_tokens, stream, bool(options.get("include_usage", False)), stop, sampling)


ENGINE_FIELDS = {"max_new_tokens": "max_tokens", "prompt length": "prompt", "prompt_ids": "prompt",
                 "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed",
                 "its K/V cache": "max_tokens"}


def from_engine(err: ValueError, chat: bool) -> APIError:
    """The engine's ValueError for a request, as a 400 naming the request's field."""
    message = str(err)
    param = next((f for key, f in ENGINE_FIELDS.items() if key in message), None)
    if param == "prompt" and chat:
        param = "messages"
    return APIError(400, message, param)
