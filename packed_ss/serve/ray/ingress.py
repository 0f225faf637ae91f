"""The engine-less ingress: the OpenAI routes (app.py) under @serve.ingress, over engine replicas.

The ingress tokenizes and checks each request, then calls a replica through the deployment handle with
stream=True (Ray Serve routes it: routing.py) and writes the client's stream from the Pieces that come back, so
a replica that dies is not the process writing the stream: its requests end with an OpenAI-style error
(status 503 before the response began, an error event in a stream) and the others go on. `/metrics` renders
each replica's latest snapshot (sent after each of its responses) labelled with the replica; `/health` asks
one replica, named in `x-replica`.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.handle import DeploymentHandle

from ...model.tokenizer import load_tokenizer
from ..app import openai_app
from ..decoder import Opened, Piece
from ..metrics import render
from ..protocol import APIError, Job

HEALTH_TIMEOUT_S = 10


def lost(replica: str | None, err: RayActorError) -> APIError:
    where = f"the replica {replica}" if replica else "a replica"
    return APIError(503, f"{where} died before the request finished ({type(err).__name__}); retry it",
                    kind="server_error")


class Replicas:
    """The routes' backend: each request a streaming call to an engine replica."""

    def __init__(self, handle: DeploymentHandle):
        self.handle, self.streaming = handle, handle.options(stream=True)
        self.snapshots: dict[str, dict] = {}

    async def open(self, job: Job) -> Opened:
        stream = self.streaming.generate.remote(job)
        try:
            replica = await stream.__anext__()
        except RayTaskError as err:
            raise err.cause from None
        except RayActorError as err:
            raise lost(None, err) from None
        if isinstance(replica, APIError):
            raise replica
        return Opened(replica, self._relay(stream, replica))

    async def _relay(self, stream, replica: str):
        try:
            async for item in stream:
                if isinstance(item, Piece):
                    yield item
                elif item["taken"] > self.snapshots.get(replica, {"taken": 0})["taken"]:
                    self.snapshots[replica] = item
        except RayTaskError as err:
            raise err.cause from None
        except RayActorError as err:
            self.snapshots.pop(replica, None)
            raise lost(replica, err) from None
        finally:
            stream.cancel()                # a client gone: the replica aborts the request

    async def health(self) -> str:
        try:
            return await asyncio.wait_for(self.handle.health.remote(), HEALTH_TIMEOUT_S)
        except (TimeoutError, RayActorError, RayTaskError) as err:
            raise APIError(503, f"no engine replica answered in {HEALTH_TIMEOUT_S} s ({type(err).__name__})",
                           kind="server_error") from None

    def metrics_text(self) -> str:
        return render(dict(sorted(self.snapshots.items())))


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Ingress:
    def __init__(self, replicas: DeploymentHandle, model_dir: str, model_name: str, api_key: str | None):
        path = Path(model_dir)
        self.routes = openai_app(Replicas(replicas), load_tokenizer(path), model_name, path, api_key)

    def __serve_build_asgi_app__(self):
        return self.routes
