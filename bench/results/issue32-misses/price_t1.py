"""The shipped 4M model, T = 1, batch 1: can a sampled request's price rule let the default speculate where the
fixed `packed` W = 3 with diffusion drafts wins? Engines taking turns prompt by prompt over HumanEval prompts 8-23,
two rounds, 128 new tokens, no EOS, a seed per (prompt, round): the default; the default with its sampled requests
pricing their bets alone (batch-1 costs in place of Policy.marginal's full batch); `ar`; the fixed packed W = 3.

    cd /tmp && python price_t1.py priced    # alone, at the costs the engine measured (T = 1 / top-p 0.95)
    cd /tmp && python price_t1.py plain     # alone, at costs measured at T = 1 without top-p (this request's own)

The alone engine's costs are rewritten so that the batch-8 column minus 7/8 of its AR entry, what the native
policy (csrc/policy.h) prices a sampled request at, is the batch-1 column: c8[s] = c1[s] + 7 c1[ar].
"""
import sys
import time

import torch

import packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.request import SamplingParams

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
params = SamplingParams(temperature=1.0)
engines = {"default": packed_ss.Engine(model), "alone": packed_ss.Engine(model),
           "ar": packed_ss.Engine(model, schedule="ar"),
           "packed W=3": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")}
program = engines["alone"].program(params)
policy = program.policy
print("measured (T = 1 / top-p 0.95), ms at batch 1 and 8:", [str(s) for s in policy.shapes],
      [tuple(round(x, 2) for x in c) for c in policy.costs])
alone = [c[0] for c in policy.costs] if sys.argv[1] == "priced" else \
    [c[0] for c in engines["alone"].runtime.shape_costs(program, (1,), params)]
print("alone at:", [round(x, 2) for x in alone])
policy.costs = [(a, a + 7 * alone[0]) for a in alone]
policy._device.clear()
for engine in engines.values():
    engine.generate(ids[0], 8, temperature=1.0, seed=0)
totals = {k: [0, 0.0, 0] for k in engines}
for rnd in range(2):
    for i, prompt in enumerate(ids):
        for k in list(engines) if (i + rnd) % 2 == 0 else list(reversed(engines)):
            t = time.perf_counter()
            r = engines[k].generate(prompt, 128, temperature=1.0, seed=100 * rnd + i, eos_token_id=[])
            totals[k][1] += time.perf_counter() - t
            totals[k][0] += len(r.tokens)
            totals[k][2] += r.nfe
ar = totals["ar"][0] / totals["ar"][1]
for k, (tokens, seconds, calls) in totals.items():
    print(f"{k}: {tokens / seconds:.0f} tok/s, {tokens / seconds / ar:.3f}x AR, {tokens / calls:.2f} tokens/call")
