"""An engine replica: one Engine and its decode thread (a Decoder) in a Ray Serve replica.

`generate(job)` streams, through a DeploymentHandle call with stream=True: the replica's name once the request
is taken (or only the APIError that refuses it), the job's Pieces, then the replica's metrics snapshot.
Ray Serve calls `check_health` periodically and replaces a replica whose decode thread is gone; on a downscale
it stops routing to the replica and lets it finish what it holds (graceful_shutdown_timeout_s) before `__del__`.
"""
from __future__ import annotations

import torch
from ray import serve

from ...model.tokenizer import load_tokenizer
from ..decoder import Decoder
from ..protocol import APIError, Job


@serve.deployment
class EngineReplica:
    def __init__(self, options):
        """`options`: the app's, resolved (build.AppOptions): the engine's settings and the decode loop's limits."""
        torch.set_num_threads(max(1, int(options.num_cpus)))
        engine = options.build()
        self.decoder = Decoder(engine, load_tokenizer(options.model).decode, options.max_waiting)
        self.decoder.start()
        self.name = serve.get_replica_context().replica_id.to_full_id_str()

    async def generate(self, job: Job):
        try:
            opened = await self.decoder.open(job)
        except APIError as refusal:        # an answer (4xx), not a failure of the replica
            yield refusal
            return
        yield self.name
        async for piece in opened.pieces:
            yield piece
        yield self.decoder.snapshot()

    async def health(self) -> str:
        await self.decoder.health()
        return self.name

    async def check_health(self) -> None:
        await self.decoder.health()

    def __del__(self):
        self.decoder.stop()
