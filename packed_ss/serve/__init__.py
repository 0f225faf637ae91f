"""Serving: an OpenAI-compatible HTTP server on one Engine (`python -m packed_ss serve`; the `serve` extra), or
on engine replicas under Ray Serve (`--replicas N`, `ray/`; the `ray` extra).

`protocol.py` checks request bodies, `text.py` turns verified tokens into final text with stop strings,
`worker.py` is the one decode loop, `decoder.py` a request's side on the engine (Job in, Pieces out),
`metrics.py` the Prometheus counters, `app.py` the routes, `spec.py` what an engine is built from, `cli.py`
the command.
"""
