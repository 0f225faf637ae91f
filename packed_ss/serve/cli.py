"""`python -m packed_ss serve [MODEL] [options]`: the OpenAI-compatible server (app.py) with uvicorn, or with
`--replicas N` the same API over N engine replicas on a local Ray Serve instance (serve/ray/)."""
from __future__ import annotations

import argparse

from ..engine import SAMPLERS
from ..model.loading import DTYPE_NAMES, dtype_said
from ..model.sources import resolve_model
from .spec import EngineSpec


def _width(text: str):
    return text if text == "auto" else int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m packed_ss serve",
        description="Serve a model behind an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /metrics), every request decoded by packed self-speculative decoding "
                    "in one continuously batched engine. Needs the serve extra: pip install -e '.[serve]'.")
    p.add_argument("model", nargs="?", default=None,
                   help="model directory, GGUF file or name ('tiny', 'any-order', 'smollm2-135m'; default: 'tiny', "
                        "the shipped model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--schedule", default=None, help="decoding schedule (default: the engine's, adaptive)")
    p.add_argument("--width", type=_width, default="auto", help="draft width: auto (default) or an integer")
    p.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="how sampled drafts are verified (all exact; default: the model's profile's, else rejection)")
    p.add_argument("--max-batch", type=int, default=64,
                   help="requests running at once at most (default 64); later ones wait in the engine's queue, in "
                        "order")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="requests in that queue at most; more get HTTP 429 (default 256)")
    p.add_argument("--draft-adapter", default=None, help="drafting adapter directory (default: the model's own)")
    p.add_argument("--no-draft-adapter", action="store_true", help="serve without the model's drafting adapter")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="weights' dtype; auto (default): the checkpoint's on CUDA, on a CPU the faster of float32 "
                        "and bfloat16 here, measured once and remembered (float32 is the exact path)")
    p.add_argument("--cuda-graph", action="store_true", help="capture each decode iteration in a CUDA graph")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt whole (default: a prompt that starts with the tokens of an earlier "
                        "one's full K/V pages shares them and prefills only the rest; the same tokens either way)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: its directory)")
    p.add_argument("--replicas", type=int, default=None,
                   help="serve N engine replicas on a local Ray Serve instance behind one ingress, routed by prompt "
                        "prefix and load (the ray extra: pip install -e '.[ray]'; default: one engine in this process)")
    p.add_argument("--replica-cpus", type=float, default=1, help="with --replicas: CPUs per replica (default 1)")
    p.add_argument("--replica-gpus", type=float, default=0, help="with --replicas: GPUs per replica (default 0)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("max_batch", "max_waiting", "port"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
            return 2
    adapter = None if args.no_draft_adapter else (args.draft_adapter or "auto")
    spec = EngineSpec(model=args.model, device=args.device, dtype=args.dtype, schedule=args.schedule, width=args.width,
                      sampler=args.sampler, cuda_graph=args.cuda_graph, prefix_cache=not args.no_prefix_cache,
                      max_batch=args.max_batch, draft_adapter=adapter)
    if args.replicas is not None:
        return replicated(spec, args)
    try:
        import uvicorn
    except ImportError:
        print("error: serving needs the serve extra: pip install -e '.[serve]'")
        return 2
    from ..model.tokenizer import load_tokenizer
    from .app import make_app

    path = resolve_model(args.model)
    engine = spec.build()
    app = make_app(engine, load_tokenizer(path), args.served_model_name or path.name, path, args.api_key,
                   args.max_waiting)
    print(f"packed-ss: serving {path} ({engine.schedule_name}, W = {engine.width}, dtype {dtype_said(engine.model)}) "
          f"on http://{args.host}:{args.port}")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def replicated(spec: EngineSpec, args) -> int:
    """--replicas N: the app on a local Ray instance, until interrupted."""
    try:
        from .ray import serve_locally
    except ImportError as err:
        print(f"error: --replicas needs Ray Serve ({err}), the ray extra: pip install -e '.[ray]'")
        return 2
    try:
        return serve_locally(spec, args.host, args.port, num_replicas=args.replicas, num_cpus=args.replica_cpus,
                             num_gpus=args.replica_gpus, max_waiting=args.max_waiting,
                             api_key=args.api_key, served_model_name=args.served_model_name)
    except ValueError as err:
        print(f"error: {err}")
        return 2
