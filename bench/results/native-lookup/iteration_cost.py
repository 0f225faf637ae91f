"""The shipped model, batch 1, HumanEval prompts 8-23, 128 tokens, no EOS: ms per iteration (Batch.iterate: the model
call and the whole step, no prefill) of the default engine and of `lookup` W = 8, greedy and at T = 1, the settings
taking turns prompt by prompt, two rounds. The lookup draft and its point mass run after every one of these steps
(the default's lean AR steps excepted).

    cd /tmp && python iteration_cost.py
"""
import collections
import time

import torch

import packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.batch import Batch

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = {"default": packed_ss.Engine(model), "lookup W=8": packed_ss.Engine(model, schedule="lookup", width=8)}
settings = {"greedy": {}, "T = 1": dict(temperature=1.0)}
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
    print(f"{engine_name:11s} {name:7s} {1e3 * seconds / calls:.3f} ms an iteration, {calls} iterations")
