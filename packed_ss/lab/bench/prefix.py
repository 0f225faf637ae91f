"""Prefix cache and paged K/V benchmark: time to first token with a cached prefix, and the memory a batch holds.

    python -m packed_ss bench-prefix --model smollm2-135m --out DIR [options]
    python -m packed_ss bench-prefix --quick --out DIR                       (the shipped model, about a minute)

1. Time to first token. A `--prefix`-token head (Python standard-library source, tokenized) is decoded once by an
   engine with the prefix cache, so its pages are published; then, round by round, a request of that head and
   a fresh `--suffix`-token tail is streamed by that engine (a hit: only the tail and the head's partial last
   page are prefilled) and by one with the prefix cache off (the whole prompt prefilled), in alternating order.
   Reported: the median time to the first streamed token of each and the ratio hit / miss per round (median
   and a bootstrap 95% interval over rounds), and the tokens of both (the same in float64; in lower precision
   up to the rounding of a call of other rows).
2. Memory. `--batch` requests of ragged prompts (8 to `--prefix` tokens) and caps stream together; once the
   tokens of each host read are delivered, the bytes of K/V pages the pool holds against the bytes the live
   requests' tokens need (prompt + output delivered): the excess per request, in cache positions, against its
   bound, one page, the tokens of the iteration in flight (the host reads a step's tokens after it has
   launched the next) and the rows one call may write (the program's reserve).
3. Serving. `--clients` clients share a `--system`-token system prompt (the same head), each sending
   `--turns` requests of it and a fresh `--suffix`-token user turn, one after another (`--reply` tokens each,
   greedy), to the OpenAI-compatible server on loopback, streamed with the `openai` client from a process of its
   own. Two servers over the same model, the engine's default schedule, prefix cache on and off, each sent the
   system prompt once before timing (as a server that has seen it), alternate over `--server-rounds` rounds.
   Reported: generated tokens per second of each and the ratio on / off per round.
4. Agreement. `--agree` HumanEval prompts behind the `--system`-token head, each decoded alone (`--max-new-tokens`,
   the default schedule) greedy and sampled (T = 0.7, top-p 0.95, seeded), by an engine whose prefix cache holds
   the head and by one with it off: how many outputs are token-identical (all of them in float64; in float32 and
   bfloat16 a hit's call has fewer rows, so a near-tie may flip), and where the first differs.
`--parts` picks the parts (default all). Writes DIR/prefix.json and DIR/prefix.md.
"""
from __future__ import annotations

import inspect
import json
import multiprocessing
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ...decode.sampling import SamplingParams
from ...engine import Engine
from ...model.loading import DTYPE_NAMES
from ...model.tokenizer import load_tokenizer
from .options import apply_preset, bench_parser, cpu_name, load_bench_model
from .serve import client_process, serve_in_thread
from .stats import bootstrap_counts

FULL = dict(prefix=1024, suffix=8, rounds=12, batch=8, max_new_tokens=64, system=512, clients=16, turns=2, reply=32,
            server_rounds=4, agree=16)
QUICK = dict(prefix=448, suffix=8, rounds=4, batch=4, max_new_tokens=24, system=256, clients=4, turns=2, reply=8,
             server_rounds=2, agree=4)


def head_tokens(tokenizer, n: int) -> list[int]:
    """`n` tokens of Python standard-library source (a text every installation has)."""
    text = inspect.getsource(inspect)
    ids = tokenizer.encode(text).ids
    if len(ids) < n:
        raise ValueError(f"--prefix must be at most {len(ids)} tokens here, got {n}")
    return ids[:n]


def first_token_s(engine: Engine, prompt: list[int]) -> tuple[float, list[int]]:
    """Seconds from the call to the first streamed tokens, and the request's tokens (greedy, 4 of them)."""
    began = time.perf_counter()
    stream = engine.stream(prompt, max_new_tokens=4, eos_token_id=[])
    first = next(stream)
    elapsed = time.perf_counter() - began
    return elapsed, first + [t for tokens in stream for t in tokens]


def time_to_first_token(model, tokenizer, args) -> dict:
    head = head_tokens(tokenizer, args.prefix)
    vocab = model.cfg.vocab_size
    rng = np.random.default_rng(0)
    hit_engine, miss_engine = Engine(model, schedule="ar"), Engine(model, schedule="ar", prefix_cache=False)
    first_token_s(hit_engine, head + [int(t) for t in rng.integers(100, vocab - 100, args.suffix)])   # publish
    first_token_s(miss_engine, head[:16])                                                           # warm up
    hit, miss, same = [], [], 0
    for r in range(args.rounds):
        prompt = head + [int(t) for t in rng.integers(100, vocab - 100, args.suffix)]
        order = [(hit_engine, hit), (miss_engine, miss)][:: 1 if r % 2 else -1]
        outputs = []
        for engine, times in order:
            seconds, tokens = first_token_s(engine, prompt)
            times.append(seconds)
            outputs.append(tokens)
        same += outputs[0] == outputs[1]
    ratio = np.array(hit) / np.array(miss)
    counts = bootstrap_counts(args.rounds, 20000, 0)
    boot = (counts @ ratio) / counts.sum(1)
    usage = hit_engine.kv_usage()
    return {"prefix": args.prefix, "suffix": args.suffix, "rounds": args.rounds, "hit_s": hit, "miss_s": miss,
            "hit_median_s": float(np.median(hit)), "miss_median_s": float(np.median(miss)),
            "ratio_median": float(np.median(ratio)), "ratio_mean": float(ratio.mean()),
            "ratio_lo": float(np.percentile(boot, 2.5)), "ratio_hi": float(np.percentile(boot, 97.5)),
            "same_tokens": same, "hit_rate": usage.hit_rate}


def memory(model, tokenizer, args) -> dict:
    """Pool bytes held against the live tokens' bytes after every host read of a ragged streamed batch. The
    events of one read are a run in which no request repeats and the pages held stay the same: a sample is
    taken where a run ends (a run may join two reads, which only leaves a sample out)."""
    head = head_tokens(tokenizer, args.prefix)
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in rng.integers(8, args.prefix + 1, args.batch)]
    prompts = [head[:n] for n in lengths]
    caps = [int(c) for c in rng.integers(args.max_new_tokens // 4, args.max_new_tokens + 1, args.batch)]
    engine = Engine(model, schedule="packed", width=7, prefix_cache=False)
    program = engine.program(SamplingParams())
    usage = engine.kv_usage()
    received = [0] * args.batch
    samples, run, run_held = [], set(), None

    def sample():
        live = [j for j in range(args.batch) if received[j] < caps[j]]
        if live and run_held is not None:
            samples.append((run_held * usage.page_size - sum(lengths[j] + received[j] for j in live)) / len(live))

    for i, tokens in engine.stream_batch(prompts, max_new_tokens=caps, eos_token_id=[]):
        held = engine.kv_usage().held
        if i in run or held != run_held:
            sample()
            run, run_held = set(), held
        run.add(i)
        received[i] += len(tokens)
    sample()
    per_token = usage.page_bytes // usage.page_size
    return {"batch": args.batch, "prompt_lengths": lengths, "caps": caps, "page_size": usage.page_size,
            "bytes_per_token": per_token, "reserve": program.reserve, "block": program.block,
            "excess_slots_per_request_max": max(samples), "excess_slots_per_request_mean": float(np.mean(samples)),
            "bound_slots": usage.page_size + program.block + program.reserve,
            "contiguous_slots_per_request": float(np.mean([(n + c + program.reserve + 255) // 256 * 256
                                                            for n, c in zip(lengths, caps)]))}


def serving(model, tokenizer, args) -> dict:
    """Tokens per second of a server with the prefix cache on and off, clients sharing a system prompt."""
    from ...serve.app import make_app

    system = head_tokens(tokenizer, args.system)
    rng = np.random.default_rng(2)
    vocab = model.cfg.vocab_size
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    servers, urls = [], {}
    for cache in (True, False):
        app = make_app(Engine(model, prefix_cache=cache, max_batch=args.clients), tokenizer, "default",
                       max_waiting=args.clients)
        server, thread, port = serve_in_thread(app)
        servers.append((server, thread))
        urls[cache] = f"http://127.0.0.1:{port}/v1"
        clients.submit(client_process, urls[cache], [system + [int(rng.integers(100, vocab - 100))]], 4, 1).result()
    tok_s = {True: [], False: []}
    for r in range(args.server_rounds):
        prompts = [system + [int(t) for t in rng.integers(100, vocab - 100, args.suffix)]
                   for _ in range(args.clients * args.turns)]
        for cache in ((True, False) if r % 2 == 0 else (False, True)):
            run = clients.submit(client_process, urls[cache], prompts, args.reply, args.clients).result()
            tok_s[cache].append(run["tokens"] / run["wall_s"])
    clients.shutdown()
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=30)
    ratio = np.array(tok_s[True]) / np.array(tok_s[False])
    return {"system": args.system, "clients": args.clients, "turns": args.turns, "reply": args.reply,
            "rounds": args.server_rounds, "on_tok_s": tok_s[True], "off_tok_s": tok_s[False],
            "on_median": float(np.median(tok_s[True])), "off_median": float(np.median(tok_s[False])),
            "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def agreement(model, tokenizer, args) -> dict:
    """Outputs of requests behind a cached head against the same requests with the prefix cache off."""
    from ..humaneval import humaneval_prompts

    head = head_tokens(tokenizer, args.system)
    room = model.cfg.max_seq_len - args.system - args.max_new_tokens
    prompts = [head + tokenizer.encode(text).ids[:room] for _, text in humaneval_prompts(args.agree)]
    hit_engine, miss_engine = Engine(model), Engine(model, prefix_cache=False)
    hit_engine.generate(head + prompts[0][args.system:][:1], max_new_tokens=1)      # publish the head
    result = {}
    for name, sampling in (("greedy", {}), ("sampled", dict(temperature=0.7, top_p=0.95))):
        same, first_differs = 0, []
        for i, prompt in enumerate(prompts):
            kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling, **({"seed": i} if sampling else {}))
            hit, miss = hit_engine.generate(prompt, **kwargs), miss_engine.generate(prompt, **kwargs)
            same += hit.tokens == miss.tokens
            if hit.tokens != miss.tokens:
                first_differs.append(next((j for j, (a, b) in enumerate(zip(hit.tokens, miss.tokens)) if a != b),
                                          min(len(hit.tokens), len(miss.tokens))))
        result[name] = {"same": same, "of": len(prompts), "first_differs_at": first_differs}
    result["hit_rate"] = hit_engine.kv_usage().hit_rate
    return result


def ttft_lines(t: dict, options: dict) -> list[str]:
    return [f"Time to first token, a {t['prefix']}-token head cached vs not (+{t['suffix']} fresh tokens, "
            f"{t['rounds']} paired rounds, schedule ar):",
            "",
            "| | median s | ratio hit / miss [95%] | same tokens |",
            "|---|---:|---|---:|",
            f"| prefix cache hit | {t['hit_median_s']:.3f} | {t['ratio_mean']:.3f} [{t['ratio_lo']:.3f}, "
            f"{t['ratio_hi']:.3f}] | {t['same_tokens']} / {t['rounds']} |",
            f"| miss (prefix cache off) | {t['miss_median_s']:.3f} | | |"]


def memory_lines(m: dict, options: dict) -> list[str]:
    return [f"Memory: {m['batch']} ragged requests streamed together (Packed-SS W = 7, pages of {m['page_size']} "
            f"positions, {m['bytes_per_token']} bytes per cache position): pages held beyond the live tokens, per "
            f"request, max {m['excess_slots_per_request_max']:.1f} and mean {m['excess_slots_per_request_mean']:.1f} "
            f"positions (bound: a page + the iteration in flight + the rows one call may write = {m['bound_slots']}); a "
            f"contiguous cache sized as before paging would reserve {m['contiguous_slots_per_request']:.0f} "
            "positions per request."]


def serving_lines(v: dict, options: dict) -> list[str]:
    return [f"Serving: {v['clients']} clients share a {v['system']}-token system prompt, {v['clients'] * v['turns']} "
            f"requests a round (+{options['suffix']} fresh tokens, {v['reply']} generated, greedy), {v['rounds']} "
            "rounds:",
            "",
            "| prefix cache | tok/s (median) | on / off (median [min, max] over rounds) |",
            "|---|---:|---|",
            f"| on | {v['on_median']:.1f} | {v['ratio_median']:.2f}x [{v['ratio_min']:.2f}, {v['ratio_max']:.2f}] |",
            f"| off | {v['off_median']:.1f} | |"]


def agreement_lines(a: dict, options: dict) -> list[str]:
    said = {name: f"{a[name]['same']} / {a[name]['of']} (first difference at {a[name]['first_differs_at']})"
            for name in ("greedy", "sampled")}
    return [f"Agreement, prefix cache on vs off ({a['greedy']['of']} HumanEval prompts behind the "
            f"{options['system']}-token head, each alone, the default schedule): token-identical outputs, greedy "
            f"{said['greedy']}, sampled {said['sampled']}."]


PARTS = {"ttft": (time_to_first_token, ttft_lines), "memory": (memory, memory_lines),
         "serving": (serving, serving_lines), "agreement": (agreement, agreement_lines)}


def report(result: dict) -> str:
    machine = result["machine"]
    lines = [f"{machine['model']} ({machine['dtype']}), {machine['cpu']}, {machine['threads']} threads, "
             f"torch {machine['torch']}"]
    for part, (_, said) in PARTS.items():
        if part in result:
            lines += [""] + said(result[part], result["options"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-prefix", __doc__)
    p.add_argument("--out", type=Path, required=True, help="output directory (prefix.json, prefix.md)")
    p.add_argument("--model", default=None, help="model directory, GGUF file or name (default: the shipped model)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES, help="weights' dtype (default auto)")
    p.add_argument("--quick", action="store_true", help=f"about a minute: defaults become {QUICK}")
    for key in FULL:
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=f"default {FULL[key]}")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure (default all)")
    args = p.parse_args(argv)
    apply_preset(args, FULL, QUICK)
    torch.set_num_threads(args.threads)
    path, model = load_bench_model(args)
    tokenizer = load_tokenizer(path)
    for head, tail in ((args.prefix, args.suffix + 8), (args.system, args.suffix + args.reply)):
        if head + tail > model.cfg.max_seq_len:
            p.error(f"--prefix + --suffix + 8 and --system + --suffix + --reply must fit the model's "
                    f"{model.cfg.max_seq_len} positions")
    result = {"machine": {"model": path.name, "dtype": str(model.dtype).removeprefix("torch."), "cpu": cpu_name(),
                          "processor": platform.processor(), "threads": args.threads, "torch": torch.__version__},
              "options": {k: getattr(args, k) for k in FULL}}
    for part in args.parts:
        result[part] = PARTS[part][0](model, tokenizer, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix.json").write_text(json.dumps(result, indent=1))
    (args.out / "prefix.md").write_text(report(result))
    print(report(result))
    return 0
