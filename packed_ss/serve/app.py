"""The OpenAI-compatible HTTP API (FastAPI): completions and chat completions, streamed as server-sent events
or whole, the model list, health and Prometheus metrics.

The routes check a request into a Job (protocol.py) and write the Pieces a backend returns for it: a Decoder
(decoder.py: one Engine and its decode thread in this process, `make_app`) or engine replicas on Ray Serve
(serve/ray/), each response naming its replica in an `x-replica` header. A backend has `open(job)` (an Opened,
or an APIError), `health()` (the replica that answered, or None; raises when unhealthy) and `metrics_text()`.

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
from .decoder import Decoder, Opened
from .protocol import APIError, Job, parse, plain_chat


def make_app(engine, tokenizer, model_name: str, model_dir: Path | None = None, api_key: str | None = None,
             max_waiting: int = 256) -> FastAPI:
    """The server over one Engine in this process; `max_waiting`: requests in the engine's queue at most (more are
    refused, 429)."""
    decoder = Decoder(engine, tokenizer.decode, max_waiting)
    app = openai_app(decoder, tokenizer, model_name, model_dir, api_key, [decoder.start], [decoder.stop])
    app.state.worker, app.state.metrics = decoder.worker, decoder.metrics
    return app


def openai_app(backend, tokenizer, model_name: str, model_dir: Path | None = None, api_key: str | None = None,
               on_startup=(), on_shutdown=()) -> FastAPI:
    """The routes over `backend`; `tokenizer` encodes prompts and renders chats (with the template in
    `model_dir`, if it has one)."""
    render_chat = (chat_renderer(model_dir) if model_dir is not None else None) or plain_chat
    encode = lambda text: tokenizer.encode(text).ids                                  # noqa: E731

    def bearer(request: Request) -> None:
        """The API key check, a dependency of every route (once per request: an HTTP middleware would wrap every
        streamed chunk)."""
        if api_key is not None and request.url.path != "/health":
            if request.headers.get("authorization") != f"Bearer {api_key}":
                raise APIError(401, "a valid API key is needed (Authorization: Bearer KEY)",
                               kind="authentication_error")

    app = FastAPI(title="packed-ss", on_startup=list(on_startup), on_shutdown=list(on_shutdown),
                  dependencies=[Depends(bearer)])

    def error(err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(APIError)
    async def refused(request: Request, err: APIError) -> JSONResponse:
        return error(err)

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"}, headers=named(await backend.health()))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "packed-ss"}]}

    @app.get("/metrics")
    async def scrape():
        return PlainTextResponse(backend.metrics_text(), media_type="text/plain; version=0.0.4")

    async def handle(request: Request, chat: bool):
        try:
            body = await request.json()
        except ValueError:
            return error(APIError(400, "the request body is not valid JSON"))
        try:
            job = parse(body, chat, encode, render_chat, {model_name})
            opened = await backend.open(job)
        except APIError as err:
            return error(err)
        reply = Reply(job, chat, model_name)
        if job.stream:
            return StreamingResponse(reply.events(opened.pieces), media_type="text/event-stream",
                                     headers=named(opened.replica))
        return await reply.whole(opened)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


def named(replica: str | None) -> dict:
    """The response headers that name the replica that answered."""
    return {"x-replica": replica} if replica is not None else {}


def server_error(err: Exception) -> APIError:
    """A request that failed after it was taken, as the error it ends with."""
    return err if isinstance(err, APIError) else APIError(500, str(err), kind="server_error")


class Reply:
    """One response being written from its Pieces: the chunks, or the whole body."""

    def __init__(self, job: Job, chat: bool, model: str):
        self.job, self.chat, self.model = job, chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.completion_tokens = 0
        self.cached_tokens = 0

    def _usage(self) -> dict:
        n, prompt = self.completion_tokens, len(self.job.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def _choice(self, text: str, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def _chunk(self, choices: list, **extra) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def events(self, pieces):
        if self.chat:
            yield self._chunk([self._choice("", None, first=True)])
        try:
            async for piece in pieces:
                self.completion_tokens += len(piece.tokens)
                if piece.text:
                    yield self._chunk([self._choice(piece.text, None)])
                if piece.finish_reason:
                    self.cached_tokens = piece.figures["cached_tokens"] or 0
                    yield self._chunk([self._choice("", piece.finish_reason)], packed_ss=piece.figures)
                    if self.job.include_usage:
                        yield self._chunk([], usage=self._usage())
        except Exception as err:          # the request failed after it was taken: the stream says so and ends
            yield f"data: {json.dumps(server_error(err).body())}\n\n"
        yield "data: [DONE]\n\n"

    async def whole(self, opened: Opened) -> JSONResponse:
        text, last = [], None
        try:
            async for piece in opened.pieces:
                self.completion_tokens += len(piece.tokens)
                text.append(piece.text)
                last = piece
        except Exception as err:
            failure = server_error(err)
            return JSONResponse(failure.body(), status_code=failure.status, headers=named(opened.replica))
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if self.chat
                  else {"index": 0, "text": content, "logprobs": None})
        choice["finish_reason"] = last.finish_reason
        self.cached_tokens = last.figures["cached_tokens"] or 0
        return JSONResponse({"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                             "created": self.created, "model": self.model, "choices": [choice],
                             "usage": self._usage(), "packed_ss": last.figures}, headers=named(opened.replica))
