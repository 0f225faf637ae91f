"""Server benchmark: the OpenAI-compatible server on loopback against `stream_batch` offline, same requests.

    python -m packed_ss bench-serve --out DIR [options]        (or: python bench/serve.py ...)
    python -m packed_ss bench-serve --quick --out DIR          (about a minute)

The shipped model, Packed-SS at the engine's width, greedy, HumanEval prompts. At each concurrency c the same
requests run (a) through the server, at most c in flight, streamed with the `openai` client from a process of
its own (on the same cores: loopback), and (b) offline through `engine.stream_batch(batch_size=c)`
on an engine of its own; the two alternate over `--rounds` rounds (paired by round). Reported per
concurrency: aggregate throughput of each (generated tokens / wall) and their ratio per round (median and
range), time to first token and the gap between streamed chunks (p50 / p90 / p99 over every request of every
round), the offline gap between a request's token deliveries, and the added latency per chunk: the difference
of the two medians. Writes DIR/serve.json and DIR/serve.md.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ...engine import Engine
from ...model.loading import default_model_path, load_model
from ...model.tokenizer import load_tokenizer
from ..humaneval import humaneval_prompts
from .options import add_shared_args, apply_preset, bench_parser

FULL = dict(limit=16, max_new_tokens=64, concurrency=[1, 4, 16], rounds=3)
QUICK = dict(limit=4, max_new_tokens=24, concurrency=[1, 4], rounds=1)


def serve_in_thread(app):
    import threading

    import uvicorn
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


def client_process(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    """The load generator's side, run in a process of its own (no GIL shared with the server). Also returns the
    replica that answered each prompt (its x-replica header: None from a server of one engine)."""
    return asyncio.run(through_server(url, prompts, max_tokens, concurrency))


async def through_server(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    import openai
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
    gate = asyncio.Semaphore(concurrency)
    ttft, gaps, tokens, replicas = [], [], 0, [None] * len(prompts)

    async def one(i, prompt):
        nonlocal tokens
        async with gate:
            began = last = time.perf_counter()
            raw = await client.completions.with_raw_response.create(
                model="default", prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True)
            replicas[i] = raw.headers.get("x-replica")
            first = True
            async for chunk in raw.parse():
                now = time.perf_counter()
                if chunk.choices and chunk.choices[0].text:
                    (ttft.append(now - began) if first else gaps.append(now - last))
                    first, last = False, now
                if chunk.choices and chunk.choices[0].finish_reason:
                    tokens += len(chunk.model_extra["packed_ss"]["token_ids"])
    began = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - began
    await client.close()
    return {"wall_s": wall, "tokens": tokens, "ttft_s": ttft, "gap_s": gaps, "replicas": replicas}


def timed(decoding, gaps: list[float], key=lambda event: event[0]) -> list:
    """Runs a streaming decode, appending the gap between successive deliveries to each request to `gaps`;
    returns its GenerateResults."""
    last = {}
    while True:
        try:
            event = next(decoding)
        except StopIteration as end:
            return end.value if isinstance(end.value, list) else [end.value]
        now, i = time.perf_counter(), key(event)
        if i in last:
            gaps.append(now - last[i])
        last[i] = now


def offline(engine, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    """The same requests offline: one `stream` after another at concurrency 1, `stream_batch` when every
    request has a slot, `generate_batch(batch_size=c)` in between (no per-token times there)."""
    began, gaps, results = time.perf_counter(), [], []
    kwargs = dict(max_new_tokens=max_tokens, temperature=0.0)
    if concurrency == 1:
        for prompt in prompts:
            results += timed(engine.stream(prompt, **kwargs), gaps, key=lambda _: 0)
    elif concurrency >= len(prompts):
        results = timed(engine.stream_batch(prompts, **kwargs), gaps)
    else:
        results = engine.generate_batch(prompts, batch_size=concurrency, **kwargs)
    return {"wall_s": time.perf_counter() - began, "tokens": sum(len(r.tokens) for r in results), "gap_s": gaps}


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    return {f"p{q}_ms": float(np.percentile(values, q) * 1e3) for q in (50, 90, 99)}


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-serve", __doc__)
    add_shared_args(p, FULL, QUICK, "serve.json, serve.md", "model directory (default: the shipped model)")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help=f"default {FULL['concurrency']}")
    p.add_argument("--rounds", type=int, default=None, help=f"alternating rounds (default {FULL['rounds']})")
    args = p.parse_args(argv)
    apply_preset(args, FULL, QUICK)
    torch.set_num_threads(args.threads)
    from ...serve.app import make_app

    path = Path(args.model) if args.model else default_model_path()
    tok = load_tokenizer(path)
    texts = [prompt for _, prompt in humaneval_prompts(args.limit)]
    ids = [tok.encode(t).ids for t in texts]
    model = load_model(path, dtype=torch.float32)
    served = Engine(model, schedule="packed", max_batch=max(args.concurrency))
    local = Engine(model, schedule="packed", width="auto")
    app = make_app(served, tok, "default", path, max_waiting=len(texts))
    server, thread, port = serve_in_thread(app)
    url = f"http://127.0.0.1:{port}/v1"
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    through = lambda c: clients.submit(client_process, url, texts, args.max_new_tokens, c).result()  # noqa: E731
    clients.submit(client_process, url, texts[:2], 8, 2).result()       # warm both paths
    offline(local, ids[:2], 8, 2)
    rows, raw = [], {}
    for c in args.concurrency:
        runs = {"server": [], "offline": []}
        for r in range(args.rounds):
            order = ("server", "offline") if r % 2 == 0 else ("offline", "server")
            for kind in order:
                runs[kind].append(through(c) if kind == "server" else offline(local, ids, args.max_new_tokens, c))
        ratio = [(s["tokens"] / s["wall_s"]) / (o["tokens"] / o["wall_s"]) for s, o in zip(runs["server"], runs["offline"])]
        gap_server = [g for run in runs["server"] for g in run["gap_s"]]
        gap_offline = [g for run in runs["offline"] for g in run["gap_s"]]
        rows.append({"concurrency": c,
                     "server_tok_s": float(np.median([s["tokens"] / s["wall_s"] for s in runs["server"]])),
                     "offline_tok_s": float(np.median([o["tokens"] / o["wall_s"] for o in runs["offline"]])),
                     "ratio": {"median": float(np.median(ratio)), "min": float(min(ratio)), "max": float(max(ratio))},
                     "ttft": percentiles([t for run in runs["server"] for t in run["ttft_s"]]),
                     "gap_server": percentiles(gap_server), "gap_offline": percentiles(gap_offline),
                     "added_ms_per_chunk": (float(np.median(gap_server) - np.median(gap_offline)) * 1e3
                                            if gap_server and gap_offline else None)})
        raw[c] = runs
    clients.shutdown()
    server.should_exit = True
    thread.join(timeout=30)
    lines = ["| concurrency | server tok/s | offline tok/s | server / offline (median [min, max] over rounds) | "
             "TTFT p50 / p90 / p99 ms | chunk gap p50 / p90 / p99 ms | offline gap p50 ms | added ms per chunk |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda d: " / ".join(f"{d[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms")) if d else "-"  # noqa: E731
        added = f"{r['added_ms_per_chunk']:.2f}" if r["added_ms_per_chunk"] is not None else "-"
        offline_gap = f"{r['gap_offline']['p50_ms']:.1f}" if r["gap_offline"] else "-"
        lines.append(f"| {r['concurrency']} | {r['server_tok_s']:.1f} | {r['offline_tok_s']:.1f} | "
                     f"{r['ratio']['median']:.3f} [{r['ratio']['min']:.3f}, {r['ratio']['max']:.3f}] | "
                     f"{fmt(r['ttft'])} | {fmt(r['gap_server'])} | {offline_gap} | {added} |")
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
            "threads": args.threads, "width": served.width, "prompts": len(texts), "max_new_tokens": args.max_new_tokens}
    (args.out / "serve.json").write_text(json.dumps({"meta": meta, "summary": rows, "raw": raw}, indent=1))
    (args.out / "serve.md").write_text(table + "\n")
    print(table)
    return 0
