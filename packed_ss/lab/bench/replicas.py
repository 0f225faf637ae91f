"""Replicas benchmark: the OpenAI API on Ray Serve (packed_ss/serve/ray/) with 1 and 2 engine replicas, and the
prefix-aware router against round robin, on one workload: 4 system prompts x 16 users.

    python -m packed_ss bench-replicas --out DIR [options]         (the ray extra)
    python -m packed_ss bench-replicas --quick --out DIR           (a few minutes)

A Ray instance started here with --cpus CPUs, one CPU per replica, the shipped model with the server's default
engine, greedy. Each request is a chat (rendered as the server renders it) of one of 4 system prompts (a
HumanEval problem as the context, 100-150 tokens) and one user's short question, in a seeded shuffled order;
at most --concurrency run at once, streamed by bench-serve's load generator in a process of its own. Per
round, each configuration runs on a fresh deployment (empty caches and router state; 8 short requests warm
each replica up): one replica; two replicas with the prefix-aware router (routing.py); two with round robin.
Reported per configuration: throughput (generated tokens / wall; median [min, max] over --rounds), TTFT p50 /
p90 over every request, the affinity (per system prompt, the share of its requests on the replica that took
most of them, the mean over prompts: 1 keeps each prompt on one replica, 0.5 spreads it evenly over two) and
the busier replica's share of the requests, the cores each role used (cpu_seconds); and, offline, the most a
prefix cache could save here (prefill_share). The engines keep a prefix cache (the default); `--no-prefix-cache` builds them without.
Writes DIR/replicas.json and DIR/replicas.md.
"""
from __future__ import annotations

import json
import multiprocessing
import random
import socket
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import ray
import torch
from ray import serve
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from ...model.loading import default_model_path
from ...model.tokenizer import chat_renderer, load_tokenizer
from ...serve.protocol import plain_chat
from ...serve.ray import APP_NAME, build_app
from ...serve.spec import EngineSpec
from ..humaneval import humaneval_prompts
from .options import bench_parser, cpu_name
from .serve import client_process, percentiles

FULL = dict(users=16, max_new_tokens=64, concurrency=16, rounds=5)
QUICK = dict(users=8, max_new_tokens=16, concurrency=8, rounds=1)
SYSTEMS = 4
WARM_UP = [f"def warm_up_{i}(x):" for i in range(8)]     # shorter than a routed block: spread by load alone
ROUND_ROBIN = "packed_ss.lab.bench.replicas.RoundRobinRouter"
ROLES = (("EngineReplica", "engines"), ("Ingress", "ingress"), ("ProxyActor", "proxy"),
         ("multiprocessing", "load generator"))
CORES = [role for _, role in ROLES] + ["rest"]
CONFIGS = {"1 replica": dict(num_replicas=1), "2 replicas, prefix-aware": dict(num_replicas=2),
           "2 replicas, round robin": dict(num_replicas=2, request_router=ROUND_ROBIN)}


class RoundRobinRouter(RequestRouter):
    """The prompt-blind baseline: each request to the next replica in turn (then the others, in turn)."""

    def initialize_state(self):
        self.turn = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        ordered = sorted(candidate_replicas, key=lambda replica: replica.replica_id.unique_id)
        self.turn = (self.turn + 1) % len(ordered)
        return [[replica] for replica in ordered[self.turn:] + ordered[:self.turn]]


def workload(users: int) -> tuple[list[str], list[int]]:
    """The prompts in a shuffled order (seeded: the same every run) and each prompt's system prompt."""
    render = chat_renderer(default_model_path()) or plain_chat
    contexts = [prompt for _, prompt in humaneval_prompts(SYSTEMS)]
    chats = [(render([{"role": "system", "content": "You answer questions about this code.\n\n" + context},
                      {"role": "user", "content": f"I am user {user}. What does it return for {user}?"}]), s)
             for user in range(users) for s, context in enumerate(contexts)]
    random.Random(0).shuffle(chats)
    return [text for text, _ in chats], [s for _, s in chats]


def spread(replicas: list[str], systems: list[int]) -> dict:
    """The affinity of the system prompts to replicas, and the busier replica's share of the requests."""
    affinity = []
    for s in set(systems):
        on = Counter(r for r, t in zip(replicas, systems) if t == s)
        affinity.append(max(on.values()) / sum(on.values()))
    return {"affinity": float(np.mean(affinity)), "busiest_share": max(Counter(replicas).values()) / len(replicas)}


def prefill_share(prompts: list[str], max_new_tokens: int, batch: int) -> dict:
    """Offline, on one thread: the time of the prompts' prefill alone (one new token each) over the time of the
    whole requests, and the share of the prompt tokens that come before the user's turn: together, the most a
    prefix cache that held every system prompt could save of the engines' work on this workload."""
    torch.set_num_threads(1)
    engine, tokenizer = EngineSpec().build(), load_tokenizer(default_model_path())
    ids = [tokenizer.encode(p).ids for p in prompts]
    engine.generate_batch(ids[:batch], max_new_tokens=4, batch_size=batch)        # the adaptive costs, measured
    times = []
    for new_tokens in (1, max_new_tokens):
        began = time.perf_counter()
        engine.generate_batch(ids, max_new_tokens=new_tokens, batch_size=batch)
        times.append(time.perf_counter() - began)
    head = [len(tokenizer.encode(p[:p.index("I am user")]).ids) for p in prompts]
    return {"prefill_time_share": times[0] / times[1], "shared_prompt_share": sum(head) / sum(map(len, ids))}


def cpu_seconds() -> Counter:
    """CPU seconds used so far by every process here, by role: the engine replicas, the ingress, Ray's HTTP
    proxy, the load generator (a spawned process) and the rest (Ray's own processes, this one, anything else)."""
    used = Counter()
    for process in psutil.process_iter(["cmdline", "cpu_times"]):
        line, times = " ".join(process.info["cmdline"] or ()), process.info["cpu_times"]
        role = next((role for key, role in ROLES if key in line), "rest")
        used[role] += times.user + times.system if times else 0.0
    return used


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-replicas", __doc__)
    p.add_argument("--out", type=Path, required=True, help="output directory (replicas.json, replicas.md)")
    p.add_argument("--quick", action="store_true", help=f"defaults become {QUICK}")
    p.add_argument("--users", type=int, default=None, help=f"users per system prompt (default {FULL['users']})")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"default {FULL['max_new_tokens']}")
    p.add_argument("--concurrency", type=int, default=None, help=f"requests in flight at most (default {FULL['concurrency']})")
    p.add_argument("--rounds", type=int, default=None, help=f"rounds over the configurations (default {FULL['rounds']})")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the Ray instance (default 2)")
    p.add_argument("--no-prefix-cache", action="store_true", help="engines without a prefix cache (default: with)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    prompts, systems = workload(args.users)
    share = prefill_share(prompts, args.max_new_tokens, args.concurrency)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}/v1"
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    runs = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, config in CONFIGS.items():
            serve.run(build_app(**config, num_cpus=1, served_model_name="default", prefix_cache=not args.no_prefix_cache),
                      name=APP_NAME, route_prefix="/")
            clients.submit(client_process, url, WARM_UP, 4, len(WARM_UP)).result()   # each replica measures its costs
            before = cpu_seconds()
            run = clients.submit(client_process, url, prompts, args.max_new_tokens, args.concurrency).result()
            after = cpu_seconds()
            cores = {role: (after[role] - before[role]) / run["wall_s"] for role in CORES}
            runs[name].append(run | spread(run["replicas"], systems) | {"cores": cores})
            serve.delete(APP_NAME)
    clients.shutdown()
    serve.shutdown()
    ray.shutdown()
    rows = []
    for name, done in runs.items():
        tok_s = [run["tokens"] / run["wall_s"] for run in done]
        rows.append({"configuration": name, "tok_s": {"median": float(np.median(tok_s)), "min": min(tok_s),
                                                      "max": max(tok_s)},
                     "ttft": percentiles([t for run in done for t in run["ttft_s"]]),
                     "affinity": float(np.median([run["affinity"] for run in done])),
                     "busiest_share": float(np.median([run["busiest_share"] for run in done])),
                     "cores": {role: float(np.median([run["cores"][role] for run in done])) for role in CORES}})
    base = rows[0]["tok_s"]["median"]
    lines = ["| configuration | tok/s (median [min, max]) | vs 1 replica | TTFT p50 / p90 ms | affinity | busier replica's "
             f"share | cores: {' / '.join(CORES)} |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        t, cores = r["tok_s"], " / ".join(f"{r['cores'][role]:.2f}" for role in CORES)
        lines.append(f"| {r['configuration']} | {t['median']:.0f} [{t['min']:.0f}, {t['max']:.0f}] | "
                     f"{t['median'] / base:.2f}x | {r['ttft']['p50_ms']:.0f} / {r['ttft']['p90_ms']:.0f} | "
                     f"{r['affinity']:.2f} | {r['busiest_share']:.2f} | {cores} |")
    lines.append(f"\nOffline, prefill alone takes {share['prefill_time_share']:.0%} of the requests' time and "
                 f"{share['shared_prompt_share']:.0%} of the prompt tokens come before the user's turn.")
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(sys.argv), "machine": cpu_name(), "cpus": args.cpus,
            "requests": len(prompts), "systems": SYSTEMS, "users": args.users, "max_new_tokens": args.max_new_tokens,
            "concurrency": args.concurrency, "rounds": args.rounds, "prefix_cache": not args.no_prefix_cache, **share}
    (args.out / "replicas.json").write_text(json.dumps({"meta": meta, "summary": rows, "raw": runs}, indent=1))
    (args.out / "replicas.md").write_text(table + "\n")
    print(table)
    return 0
