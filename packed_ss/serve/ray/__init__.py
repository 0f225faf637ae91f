"""Replicas on Ray Serve behind the same OpenAI API: `python -m packed_ss serve --replicas N` on a local Ray
instance, or on a cluster `serve run packed_ss.serve.ray:app model=DIR num_replicas=N` (the ray extra).

`replica.py` holds one Engine per replica, `ingress.py` the engine-less ingress that writes each client's
stream from the Pieces a replica streams back, `routing.py` the prefix-aware request router, `build.py` the
options, checked and resolved once, and the application.
"""
from .build import APP_NAME, AppOptions, app, build_app, serve_locally

__all__ = ["APP_NAME", "AppOptions", "app", "build_app", "serve_locally"]
