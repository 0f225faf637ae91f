"""The shipped model, `packed` W = 3 with diffusion drafts and `ar` (or the engines named: "packed", "ar", "default",
"lookup" for `lookup` W = 8), batch 1, HumanEval prompts 8-23, 128 tokens, no EOS: ms per iteration (Batch.iterate:
the model call and the whole step, no prefill) greedy, at T = 1 and at T = 0.7 / top-p 0.95, the settings taking
turns prompt by prompt, two rounds.

    cd /tmp && python iteration_cost.py [default lookup]
"""
import sys
import collections
import time

import torch

import packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.batch import Batch

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
made = {"packed": ("packed W=3", dict(schedule="packed", width=3, drafts="diffusion")),
        "ar": ("ar", dict(schedule="ar")), "default": ("default", {}),
        "lookup": ("lookup W=8", dict(schedule="lookup", width=8))}
engines = {made[name][0]: packed_ss.Engine(model, **made[name][1]) for name in sys.argv[1:] or ["packed", "ar"]}
settings = {"greedy": {}, "T = 1": dict(temperature=1.0), "T = 0.7 / top-p 0.95": dict(temperature=0.7, top_p=0.95)}
iterate, spent = Batch.iterate, []


def timed(self, first, shape=0):
    t = time.perf_counter()
    iterate(self, first, shape)
    spent.append(time.perf_counter() - t)


Batch.iterate = timed
for engine in engines.values():
    for kw in settings.values():
        engine.generate(ids[0], 8, seed=0, **kw)
totals = collections.defaultdict(lambda: [0.0, 0])
for rnd in range(2):
    for i, prompt in enumerate(ids):
        for name in list(settings) if (i + rnd) % 2 == 0 else list(reversed(settings)):
            for engine_name, engine in engines.items():
                spent.clear()
                engine.generate(prompt, 128, seed=100 * rnd + i, eos_token_id=[], **settings[name])
                totals[engine_name, name][0] += sum(spent)
                totals[engine_name, name][1] += len(spent)
for (engine_name, name), (seconds, calls) in totals.items():
    greedy = totals[engine_name, "greedy"]
    print(f"{engine_name:10s} {name:20s} {1e3 * seconds / calls:.3f} ms an iteration, "
          f"{seconds / calls / (greedy[0] / greedy[1]):.3f}x greedy's")
