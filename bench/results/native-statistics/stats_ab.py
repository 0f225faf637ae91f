"""Paired A/B of the adaptive policy's bookkeeping after a step (Policy.observe, score_lookup, prefers_lookup) as torch
ops ("torch", as before) and in csrc/policy.h ("native"), inside whole engines: the shipped model, HumanEval prompts
8-23 of bench-adaptive's, 128 new tokens, batch 1, 2 rounds, the engines taking turns prompt by prompt with the same
seeds. Each default engine measures its shape costs (Engine._shape_costs) with its own version. Prints tok/s,
tokens a call, native / torch and default / AR with bootstrap 95% intervals over the prompts, and whether the two
versions wrote the same tokens.

    cd /tmp && python stats_ab.py T [TOP_P] [same-costs]

With `same-costs` both default engines run on the shape costs the first measured, so that they choose alike and
the A/B times the bookkeeping alone.
"""
import contextlib
import random
import sys
import time

import torch

import packed_ss
import packed_ss.engine
from packed_ss.decode.epilogue import NativeEpilogue
from packed_ss.decode.epilogue.base import Epilogue
from packed_ss.lab.bench.adaptive import tokenized_prompts

METHODS = ("observe", "score_lookup", "prefers_lookup")
NATIVE = {m: getattr(NativeEpilogue, m) for m in METHODS}


@contextlib.contextmanager
def version(name):
    for m in METHODS:
        setattr(NativeEpilogue, m, NATIVE[m] if name == "native" else getattr(Epilogue, m))
    yield


torch.set_num_threads(2)
T = float(sys.argv[1])
same_costs = "same-costs" in sys.argv
numbers = [a for a in sys.argv[2:] if a != "same-costs"]
top_p = float(numbers[0]) if numbers else None
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = {}
for name in ("torch", "native"):
    if not same_costs:
        packed_ss.engine._shape_costs.clear()
    with version(name):
        engines[name] = packed_ss.Engine(model)
        engines[name].generate(ids[0], 8, temperature=T, top_p=top_p, seed=0)
engines["ar"] = packed_ss.Engine(model, schedule="ar")
engines["ar"].generate(ids[0], 8, temperature=T, top_p=top_p, seed=0)
seconds = {n: [] for n in engines}
tokens = {n: [] for n in engines}
calls = {n: 0 for n in engines}
for rnd in range(2):
    for i, prompt in enumerate(ids):
        order = list(engines) if (i + rnd) % 2 else list(reversed(engines))
        for name in order:
            with version("torch" if name == "torch" else "native"):
                t = time.perf_counter()
                out = engines[name].generate(prompt, 128, temperature=T, top_p=top_p, seed=100 * rnd + i)
                seconds[name].append(time.perf_counter() - t)
            tokens[name].append(out.tokens)
            calls[name] += out.nfe


def ratio(a, b, rng=random.Random(0)):
    units = range(len(seconds[a]))
    rate = lambda n, us: sum(len(tokens[n][u]) for u in us) / sum(seconds[n][u] for u in us)
    draws = sorted(rate(a, us) / rate(b, us) for us in ([rng.choice(units) for _ in units] for _ in range(2000)))
    return f"{rate(a, units) / rate(b, units):.3f} [{draws[50]:.3f}, {draws[1949]:.3f}]"


for n in engines:
    total = sum(len(t) for t in tokens[n])
    print(f"{n}: {total / sum(seconds[n]):.1f} tok/s, {total / calls[n]:.2f} tokens a call")
print("native / torch:", ratio("native", "torch"))
print("default (torch) / ar:", ratio("torch", "ar"), " default (native) / ar:", ratio("native", "ar"))
print("same tokens, native and torch:", sum(a == b for a, b in zip(tokens["native"], tokens["torch"])), "of",
      len(tokens["ar"]))
