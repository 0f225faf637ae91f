"""The shipped model, `packed` W = 3 with diffusion drafts, batch 1, HumanEval prompts 8-23, 128 tokens, no EOS:
ms per call greedy, at T = 1 and at T = 0.7 / top-p 0.95 (the nucleus cut on; two rounds, settings taking turns).

    cd /tmp && python call_cost.py
"""
import time

import torch

import packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engine = packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")
settings = {"greedy": {}, "T = 1": dict(temperature=1.0), "T = 0.7 / top-p 0.95": dict(temperature=0.7, top_p=0.95)}
for kw in settings.values():
    engine.generate(ids[0], 8, seed=0, **kw)
totals = {name: [0.0, 0, 0] for name in settings}
for rnd in range(2):
    for i, prompt in enumerate(ids):
        for name in list(settings) if (i + rnd) % 2 == 0 else list(reversed(settings)):
            t = time.perf_counter()
            r = engine.generate(prompt, 128, seed=100 * rnd + i, eos_token_id=[], **settings[name])
            totals[name][0] += time.perf_counter() - t
            totals[name][1] += r.nfe
            totals[name][2] += len(r.tokens)
for name, (seconds, calls, tokens) in totals.items():
    print(f"{name}: {1e3 * seconds / calls:.2f} ms a call, {tokens / calls:.2f} tokens a call")
