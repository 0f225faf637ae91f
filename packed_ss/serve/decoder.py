"""The engine's side of a response: a checked Job in, its Pieces out, over one Engine and its decode thread.

`Decoder.open(job)` checks the request with the engine (`engine.request`, a ValueError mapped to the field it
names) and submits it to the decode thread (worker.py); the Pieces are the text that became final as tokens
were verified (text.py), with those tokens, and the last one says why the response ended and carries the
engine's figures for it. The routes (app.py) write Pieces as HTTP responses: in this process over a local
Decoder, or in a Ray Serve ingress over Pieces streamed from replicas that each hold a Decoder (serve/ray/).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, NamedTuple

from .metrics import Metrics
from .protocol import APIError, Job, from_engine
from .text import StopText
from .worker import DecodeWorker, QueueFull


@dataclass
class Piece:
    """Final text and the verified tokens it came from; on a response's last piece, `finish_reason` ("stop" or
    "length") and `figures`, the engine's counts for the request (the extra field `packed_ss`)."""
    text: str
    tokens: list[int]
    finish_reason: str | None = None
    figures: dict | None = None


class Opened(NamedTuple):
    """A request that was taken: the replica that decodes it (None in this process) and its Pieces."""
    replica: str | None
    pieces: AsyncIterator[Piece]


def figures(tokens: list[int], result) -> dict:
    """The request's speculative figures: the engine's counts at its end (for a request a stop string ended, at
    its abort: they may include an iteration past the stop string)."""
    out = {"token_ids": list(tokens), "model_calls": None, "tokens_per_call": None,
           "mean_acceptance_length": None, "accepted_per_position": None, "cached_tokens": None}
    if result is not None:
        out.update(model_calls=result.nfe, tokens_per_call=len(result.tokens) / result.nfe,
                   mean_acceptance_length=1 + result.mean_accepted if result.n_verify else None,
                   accepted_per_position=result.accepted_at, cached_tokens=result.cached_tokens)
    return out


class Decoder:
    def __init__(self, engine, decode, max_waiting: int):
        """`decode(token ids) -> text`: the tokenizer's."""
        self.engine, self.decode = engine, decode
        self.eos = set(engine.model.cfg.eos_token_ids)
        self.metrics = Metrics(engine.width)
        self.worker = DecodeWorker(engine, self.metrics, max_waiting)

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()

    async def health(self) -> None:
        """Raises unless the decode thread is running."""
        if not self.worker.alive:
            raise RuntimeError("the decode thread is not running")

    def metrics_text(self) -> str:
        return self.metrics.render(*self.worker.counts, self.engine.kv_usage())

    def snapshot(self) -> dict:
        return self.metrics.snapshot(*self.worker.counts, self.engine.kv_usage())

    async def open(self, job: Job) -> Opened:
        """The request submitted, or an APIError: 400 naming the field the engine refused, 429 with the queue
        full."""
        try:
            request = self.engine.request(job.prompt_ids, max_new_tokens=job.max_tokens, **job.sampling)
        except ValueError as err:
            raise from_engine(err, job.chat) from None
        try:
            pending = self.worker.submit(request, len(job.prompt_ids))
        except QueueFull as err:
            raise APIError(429, str(err), kind="rate_limit_error") from None
        return Opened(None, self._pieces(job, pending))

    async def _pieces(self, job: Job, pending) -> AsyncIterator[Piece]:
        """Pieces as the worker delivers. A stop string ends the text: the request is aborted and its counts so
        far are the result. A consumer gone before the end cancels it; an engine error is raised."""
        text, tokens, ended = StopText(self.decode, job.stop), [], False

        def last(new: str, new_tokens: list[int], result) -> Piece:
            if text.stopped or (tokens and tokens[-1] in self.eos) or len(tokens) < job.max_tokens:
                return Piece(new, new_tokens, "stop", figures(tokens, result))
            return Piece(new, new_tokens, "length", figures(tokens, result))

        try:
            while not ended:
                kind, value = await pending.events.get()
                if kind == "tokens":
                    tokens += value
                    new = text.add(value)
                    if text.stopped:
                        self.worker.cancel(pending)
                        kind, result = await pending.events.get()
                        while kind == "tokens":             # delivered before the abort: past the stop string
                            kind, result = await pending.events.get()
                        ended = True
                        yield last(new, value, result if kind in ("aborted", "done") else None)
                    else:
                        yield Piece(new, value)
                elif kind == "done":
                    ended = True
                    yield last(text.finish(), [], value)
                elif kind == "error":
                    ended = True
                    raise value
                else:
                    ended = True
        finally:
            if not ended:
                self.worker.cancel(pending)
