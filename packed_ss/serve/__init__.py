"""Serving: an OpenAI-compatible HTTP server on one Engine (`python -m packed_ss serve`; the `serve` extra).

`protocol.py` checks request bodies, `text.py` turns verified tokens into final text with stop strings,
`worker.py` is the one decode loop, `metrics.py` the Prometheus counters, `app.py` the routes, `cli.py`
the command.
"""
