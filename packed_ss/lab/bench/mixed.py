"""Mixed traffic: greedy and sampled requests arriving together, in one batch or in a batch per program.

    python -m packed_ss bench-mixed --out DIR [options]
    python -m packed_ss bench-mixed --quick --out DIR           (about a minute)

A server's clients ask for different settings. HumanEval prompts are cut into units of `--batch` requests,
the first `--greedy-share` of each greedy and the rest sampled (T = 0.7, top-p 0.95, a seed per prompt), all
added at once through the runtime a server's decode thread drives, and stepped until every one is done, on
each engine of `--engines` two ways:
- `one batch`: every request in the sampled program's batch (greedy rows verify greedily there), one model
  call per step;
- `a batch per program`: each request in its own program's batch (greedy or sampled), the two batches taking
  turns, two model calls per step.
`Engine.add` does the first except under the adaptive schedule with the rejection sampler (Engine.joining). Each unit
runs both ways in a rotating order (paired unit by unit); the requests' tokens are the same both ways (float64;
in lower precision up to the rounding of calls of other rows). Reported per engine: throughput of each way,
model calls, the mean decoder time of a greedy and of a sampled request, and the throughput ratio one batch /
a batch per program with a paired bootstrap 95% interval over units (stats.py). Writes DIR/mixed.json and
DIR/mixed.md.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ...decode.sampling import SamplingParams
from ...engine import Engine
from ...model.tokenizer import load_tokenizer
from ..humaneval import tokenized_prompts
from ..progress import progress
from .options import add_model_args, apply_preset, bench_parser, cpu_name, load_bench_model
from .stats import bootstrap_counts, paired, per_prompt

SAMPLED = dict(temperature=0.7, top_p=0.95)
WAYS = ("one batch", "a batch per program")
ENGINES = {"default": {}, "default~gumbel": dict(sampler="gumbel"), "ar": dict(schedule="ar"),
           "packed W=3": dict(schedule="packed", width=3), "packed W=3~gumbel": dict(schedule="packed", width=3,
                                                                                    sampler="gumbel"),
           "lookup W=8": dict(schedule="lookup", width=8)}
FULL = dict(limit=32, max_new_tokens=128, batch=8)
QUICK = dict(limit=8, max_new_tokens=32, batch=4)


@dataclass
class Record:
    engine: str
    way: str
    unit: int
    tokens: int
    nfe: int           # model calls of the unit (every batch's)
    wall_s: float
    greedy_s: float    # the greedy requests' decoder time (GenerateResult.wall_s), summed
    sampled_s: float   # ... and the sampled ones'

    @property
    def prompt(self) -> int:      # stats.per_prompt's unit of pairing
        return self.unit


def decode_unit(engine: Engine, prompts: list[list[int]], first: int, greedy: int, max_new: int, seed: int,
                one_batch: bool) -> tuple[list, int]:
    """The unit's requests (the first `greedy` greedy, the others sampled) added at once, to the sampled program
    (`one_batch`) or each to its own, and stepped until done: their GenerateResults, and the model calls made."""
    requests = [engine.request(ids, max_new, seed=seed + first + i, **({} if i < greedy else SAMPLED))
                for i, ids in enumerate(prompts)]
    shared = engine.program(SamplingParams(**SAMPLED))
    calls = []
    hook = engine.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        groups = [engine.runtime.add(shared if one_batch else engine.program(r.params), [r], 1, stream=False)
                  for r in requests]
        while engine.step():
            pass
    finally:
        hook.remove()
    return [group.results[0] for group in groups], len(calls)


def measure(engine: Engine, name: str, prompts: list[list[int]], greedy: int, args, bar) -> tuple[list, bool]:
    """Every unit both ways (rotating), after an untimed warm-up that builds both programs; whether every
    request's tokens were the same both ways."""
    for one_batch in (True, False):
        decode_unit(engine, prompts[:2], 0, 1, 4, args.seed, one_batch)
    records, same = [], True
    for unit, first in enumerate(range(0, len(prompts), args.batch)):
        chunk, outputs = prompts[first:first + args.batch], []
        for k in range(2):
            way = WAYS[(unit + k) % 2]
            t0 = time.perf_counter()
            results, calls = decode_unit(engine, chunk, first, greedy, args.max_new_tokens, args.seed,
                                         way == WAYS[0])
            wall = time.perf_counter() - t0
            records.append(Record(name, way, unit, sum(len(r.tokens) for r in results), calls, wall,
                                  sum(r.wall_s for r in results[:greedy]), sum(r.wall_s for r in results[greedy:])))
            outputs.append([r.tokens for r in results])
            bar.update(len(chunk))
        same &= outputs[0] == outputs[1]
    return records, same


def summary(records: list[Record], greedy: int, batch: int, args) -> dict:
    units = max(r.unit for r in records) + 1
    of = {w: per_prompt([r for r in records if r.way == w], units) for w in WAYS}
    counts = bootstrap_counts(units, args.resamples, args.seed)
    return {"tok_s": {w: float(of[w]["tokens"].sum() / of[w]["wall_s"].sum()) for w in WAYS},
            "calls": {w: int(of[w]["nfe"].sum()) for w in WAYS},
            "mean_s": {w: {kind: sum(getattr(r, f"{kind}_s") for r in records if r.way == w) / (n * units)
                           for kind, n in (("greedy", greedy), ("sampled", batch - greedy))} for w in WAYS},
            "ratio": paired(of[WAYS[0]], of[WAYS[1]], counts)["throughput_ratio"]}


def run(args) -> dict:
    path, model = load_bench_model(args)
    prompts = [ids for _, ids in tokenized_prompts(load_tokenizer(path), args.limit)]
    greedy = min(max(round(args.greedy_share * args.batch), 1), args.batch - 1)
    bar = progress(total=2 * len(prompts) * len(args.engines), desc="requests")
    engines, records = {}, []
    for name in args.engines:
        engine = Engine(model, **ENGINES[name])
        measured, same = measure(engine, name, prompts, greedy, args, bar)
        engines[name] = {"schedule": engine.schedule_name, "sampler": engine.sampler, "same_tokens": same,
                         "greedy_joins_sampled": engine.greedy_joins_sampled} | summary(measured, greedy, args.batch,
                                                                                       args)
        records += measured
    bar.close()
    return {"machine": {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__},
            "options": {k: v for k, v in vars(args).items() if k != "out"} | {"model": str(path)},
            "dtype": str(model.dtype).removeprefix("torch."), "greedy_per_unit": greedy, "engines": engines,
            "records": [asdict(r) for r in records]}


def report(result: dict) -> str:
    m, o, greedy = result["machine"], result["options"], result["greedy_per_unit"]
    lines = [f"Mixed traffic, {greedy} greedy and {o['batch'] - greedy} T = 0.7 / top-p 0.95 requests per unit; "
             f"{o['model']}, {result['dtype']}; {m['cpu']}, {m['threads']} threads, torch {m['torch']}; "
             f"{o['limit']} HumanEval prompts in units of {o['batch']}, {o['max_new_tokens']} new tokens.", "",
             "| engine | way | tok/s | model calls | a greedy request (s, mean) | a sampled one (s) | "
             "one / per program [95%] | same tokens | Engine.add joins |", "|---|---|---|---|---|---|---|---|---|"]
    for name, e in result["engines"].items():
        r = e["ratio"]
        for way in WAYS:
            ratio = f"{r['point']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]" if way == WAYS[0] else ""
            lines.append(f"| {name} | {way} | {e['tok_s'][way]:.1f} | {e['calls'][way]} | "
                         f"{e['mean_s'][way]['greedy']:.2f} | {e['mean_s'][way]['sampled']:.2f} | {ratio} | "
                         f"{e['same_tokens'] if way == WAYS[0] else ''} | "
                         f"{e['greedy_joins_sampled'] if way == WAYS[0] else ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-mixed", __doc__)
    add_model_args(p, "mixed.json, mixed.md", FULL, QUICK)
    p.add_argument("--batch", type=int, default=None, help=f"requests added at once (default {FULL['batch']})")
    p.add_argument("--greedy-share", type=float, default=0.5,
                   help="the share of each unit's requests that are greedy, at least one and at most all but one "
                        "(default 0.5)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES), metavar="NAME",
                   help="engines to run, of " + ", ".join(ENGINES) + " (default all; ~gumbel: the shared-noise "
                        "sampler)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (default 0)")
    args = p.parse_args(argv)
    apply_preset(args, FULL, QUICK)
    if not 2 <= args.batch <= 256:
        p.error(f"--batch must be in [2, 256] (a unit mixes greedy and sampled requests), got {args.batch}")
    if args.limit % args.batch:
        p.error(f"--limit must be a multiple of --batch (whole units), got {args.limit} and {args.batch}")
    if not 0 < args.greedy_share < 1:
        p.error(f"--greedy-share must be in (0, 1), got {args.greedy_share}")
    torch.set_num_threads(args.threads)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mixed.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "mixed.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
