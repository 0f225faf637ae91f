"""The OpenAI-compatible HTTP API (FastAPI): completions and chat completions, streamed as server-sent events
or whole, the model list, health and Prometheus metrics, over one Engine and its decode thread (worker.py).

The server is a transport: a response's tokens are what `Engine.generate` returns for the same prompt tokens
and arguments (the engine's own tokens travel in the extra field `packed_ss.token_ids`, with the request's
model calls, tokens per call and mean acceptance length). Only verified tokens are streamed, as text that
can no longer change (text.py).
"""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..model.tokenizer import chat_renderer
from .metrics import Metrics
from .protocol import APIError, Job, from_engine, parse, plain_chat
from .text import StopText
from .worker import DecodeWorker, QueueFull


def make_app(engine, tokenizer, model_name: str, model_dir: Path | None = None, api_key: str | None = None,
             max_batch: int = 64, max_waiting: int = 256) -> FastAPI:
    metrics = Metrics(engine.width)
    worker = DecodeWorker(engine, metrics, max_batch, max_waiting)
    render_chat = (chat_renderer(model_dir) if model_dir is not None else None) or plain_chat
    eos = set(engine.model.cfg.eos_token_ids)
    decode = lambda ids: tokenizer.decode(ids)                                        # noqa: E731
    encode = lambda text: tokenizer.encode(text).ids                                  # noqa: E731

    def bearer(request: Request) -> None:
        """The API key check, a dependency of every route (once per request: an HTTP middleware would wrap every
        streamed chunk)."""
        if api_key is not None and request.url.path != "/health":
            if request.headers.get("authorization") != f"Bearer {api_key}":
                raise APIError(401, "a valid API key is needed (Authorization: Bearer KEY)",
                               kind="authentication_error")

    app = FastAPI(title="packed-ss", on_startup=[worker.start], on_shutdown=[worker.stop],
                  dependencies=[Depends(bearer)])
    app.state.worker, app.state.metrics = worker, metrics

    def error(err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(APIError)
    async def refused(request: Request, err: APIError) -> JSONResponse:
        return error(err)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "packed-ss"}]}

    @app.get("/metrics")
    async def scrape():
        return PlainTextResponse(metrics.render(*worker.counts), media_type="text/plain; version=0.0.4")

    async def handle(request: Request, chat: bool):
        try:
            body = await request.json()
        except ValueError:
            return error(APIError(400, "the request body is not valid JSON"))
        try:
            job = parse(body, chat, encode, render_chat, {model_name})
            submission = engine.request(job.prompt_ids, max_new_tokens=job.max_tokens, **job.sampling)
        except APIError as err:
            return error(err)
        except ValueError as err:
            return error(from_engine(err, chat))
        try:
            pending = worker.submit(submission, len(job.prompt_ids))
        except QueueFull as err:
            return error(APIError(429, str(err), kind="rate_limit_error"))
        reply = Reply(job, chat, model_name, decode, eos)
        if job.stream:
            return StreamingResponse(reply.events(pending, worker), media_type="text/event-stream")
        return await reply.whole(pending, worker)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


class Reply:
    """One response being written: its text so far, the chunks and the final body."""

    def __init__(self, job: Job, chat: bool, model: str, decode, eos: set[int]):
        self.job, self.chat, self.model, self.eos = job, chat, model, eos
        self.text = StopText(decode, job.stop)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.tokens: list[int] = []

    def _finish_reason(self) -> str:
        if self.text.stopped or (self.tokens and self.tokens[-1] in self.eos):
            return "stop"
        return "length" if len(self.tokens) >= self.job.max_tokens else "stop"

    def _usage(self) -> dict:
        n = len(self.tokens)
        return {"prompt_tokens": len(self.job.prompt_ids), "completion_tokens": n,
                "total_tokens": len(self.job.prompt_ids) + n}

    def _figures(self, result) -> dict:
        """The request's speculative figures: the engine's counts at its end (for a request a stop string
        ended, at its abort: they may include an iteration past the stop string)."""
        figures = {"token_ids": list(self.tokens), "model_calls": None, "tokens_per_call": None,
                   "mean_acceptance_length": None, "accepted_per_position": None}
        if result is not None:
            figures.update(model_calls=result.nfe, tokens_per_call=len(result.tokens) / result.nfe,
                           mean_acceptance_length=1 + result.mean_accepted if result.n_verify else None,
                           accepted_per_position=result.accepted_at)
        return figures

    def _choice(self, text: str, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def _chunk(self, choices: list, **extra) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def _run(self, pending, worker):
        """(new text, final result or None, ended) as the worker delivers. A stop string ends the text: the
        request is aborted and its counts so far are the result. A consumer gone before the end cancels it."""
        ended = False
        try:
            while not ended:
                kind, value = await pending.events.get()
                if kind == "tokens":
                    self.tokens += value
                    new = self.text.add(value)
                    if self.text.stopped:
                        worker.cancel(pending)
                        kind, value = await pending.events.get()
                        while kind == "tokens":             # delivered before the abort: past the stop string
                            kind, value = await pending.events.get()
                        ended = True
                        yield new, value if kind in ("aborted", "done") else None, True
                    else:
                        yield new, None, False
                elif kind == "done":
                    ended = True
                    yield self.text.finish(), value, True
                elif kind == "error":
                    ended = True
                    raise value
                else:
                    ended = True
        finally:
            if not ended:
                worker.cancel(pending)

    async def events(self, pending, worker):
        if self.chat:
            yield self._chunk([self._choice("", None, first=True)])
        try:
            async for text, result, ended in self._run(pending, worker):
                if text:
                    yield self._chunk([self._choice(text, None)])
                if ended:
                    yield self._chunk([self._choice("", self._finish_reason())], packed_ss=self._figures(result))
                    if self.job.include_usage:
                        yield self._chunk([], usage=self._usage())
        except Exception as err:          # the request failed inside the engine: the stream says so and ends
            yield f"data: {json.dumps(APIError(500, str(err), kind='server_error').body())}\n\n"
        yield "data: [DONE]\n\n"

    async def whole(self, pending, worker) -> JSONResponse:
        text, result = [], None
        try:
            async for new, result, _ in self._run(pending, worker):
                text.append(new)
        except Exception as err:
            return JSONResponse(APIError(500, str(err), kind="server_error").body(), status_code=500)
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if self.chat
                  else {"index": 0, "text": content, "logprobs": None})
        choice["finish_reason"] = self._finish_reason()
        return JSONResponse({"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                             "created": self.created, "model": self.model, "choices": [choice],
                             "usage": self._usage(), "packed_ss": self._figures(result)})
