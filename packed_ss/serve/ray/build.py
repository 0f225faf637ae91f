"""The application: an ingress over engine replicas, from options checked and resolved once.

`build_app(**options)` checks AppOptions (a ValueError names a bad field and its range), builds one engine
here to resolve what the engine would choose by itself (dtype, width, sampler, adapter: spec.py) and hands the
resolved options to every replica, so every replica returns the same text for the same seeded request. `app`
is that builder in Ray's form for `serve run packed_ss.serve.ray:app model=DIR num_replicas=2` (arguments as
strings, coerced to the fields' types); `serve_locally` is `python -m packed_ss serve --replicas N`.
"""
from __future__ import annotations

import threading
from pathlib import Path

import ray
from pydantic import Field, model_validator
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from ..spec import EngineSpec
from .ingress import Ingress
from .replica import EngineReplica

APP_NAME = "packed-ss"
PREFIX_ROUTER = "packed_ss.serve.ray.routing.PrefixAwareRouter"


class AppOptions(EngineSpec):
    """The engine's settings (EngineSpec), and per replica: the decode loop's limits (max_ongoing_requests is
    their sum, so that Ray Serve never holds back a request the engine could batch), resources, how long a
    replica being stopped may finish its requests; how many replicas (a number or an autoscaling config);
    the router (an import path; its keyword arguments), the API key and the model's name in the API."""
    num_replicas: int | None = Field(None, ge=1)
    autoscaling_config: dict | None = None
    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    max_waiting: int = Field(256, ge=1)
    drain_timeout_s: float = Field(60, gt=0)
    request_router: str = PREFIX_ROUTER
    router_options: dict = {}
    api_key: str | None = None
    served_model_name: str | None = None

    @model_validator(mode="after")
    def _one_scale(self):
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("give num_replicas or autoscaling_config, not both")
        return self

    @property
    def most_replicas(self) -> int:
        return (self.autoscaling_config or {}).get("max_replicas", 1) if self.num_replicas is None else self.num_replicas


def resolve(**options) -> AppOptions:
    """The options checked, with the engine's own choices written in (one engine built here)."""
    checked = AppOptions(**options)
    return checked.resolved(checked.build())


def application(options: AppOptions) -> Application:
    per_replica = options.max_batch + options.max_waiting
    scale = ({"num_replicas": options.most_replicas} if options.autoscaling_config is None
             else {"autoscaling_config": options.autoscaling_config})
    replicas = EngineReplica.options(
        max_ongoing_requests=per_replica, graceful_shutdown_timeout_s=options.drain_timeout_s,
        ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
        request_router_config=RequestRouterConfig(request_router_class=options.request_router,
                                                  request_router_kwargs=options.router_options), **scale)
    ingress = Ingress.options(max_ongoing_requests=per_replica * options.most_replicas)
    return ingress.bind(replicas.bind(options), options.model, options.served_model_name or Path(options.model).name,
                        options.api_key)


def build_app(**options) -> Application:
    return application(resolve(**options))


def app(args: dict) -> Application:
    return build_app(**args)


def serve_locally(spec: EngineSpec, host: str, port: int, **options) -> int:
    """The app on a Ray instance started here, at http://host:port, until interrupted."""
    resolved = resolve(**spec.model_dump(), **options)
    ray.init()
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(resolved), name=APP_NAME, route_prefix="/")
    print(f"packed-ss: serving {resolved.model} ({resolved.schedule}, W = {resolved.width}, dtype {resolved.dtype}) "
          f"on http://{host}:{port}, {resolved.most_replicas} replica(s) on Ray Serve")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        serve.shutdown()
    return 0
