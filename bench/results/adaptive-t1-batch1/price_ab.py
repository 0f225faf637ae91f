"""The shipped 4M model at batch 1: the default engine, the default with its sampled requests pricing their bets at
batch-1 costs (`Policy.marginal` replaced by the batch-1 column: what an engine that never batches could do),
`ar` and `packed` W = 3 with diffusion drafts, taking turns prompt by prompt over HumanEval prompts 8-23, three
rounds, 128 new tokens, a seed per (prompt, round).

    cd /tmp && python price_ab.py 1         # T = 1; 0.7 for T = 0.7 / top-p 0.95; 2 minutes each
"""
import sys
import time

import torch

import packed_ss
from packed_ss.decode.policy import Policy
from packed_ss.lab.humaneval import humaneval_prompts
from packed_ss.runtime.request import SamplingParams

torch.set_num_threads(2)
model = packed_ss.load_model(packed_ss.default_model_path(), dtype=torch.float32)
tok = packed_ss.load_tokenizer(packed_ss.default_model_path())
temperature = float(sys.argv[1])
top_p = 0.95 if temperature < 1 else None
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:]
engines = {"default": packed_ss.Engine(model), "priced alone": packed_ss.Engine(model),
           "ar": packed_ss.Engine(model, schedule="ar"),
           "packed W=3 +diffusion": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")}


class PricedAlone(Policy):
    marginal = staticmethod(lambda c: c.costs[:, 0])


engines["priced alone"].program(SamplingParams(temperature=temperature, top_p=top_p)).policy.__class__ = PricedAlone
for engine in engines.values():
    engine.generate(prompts[0], 8, temperature=temperature, top_p=top_p, seed=0)
totals = {k: [0, 0.0, 0] for k in engines}
for rnd in range(3):
    for i, prompt in enumerate(prompts):
        for k in list(engines) if (i + rnd) % 2 == 0 else list(reversed(engines)):
            t = time.perf_counter()
            result = engines[k].generate(prompt, 128, temperature=temperature, top_p=top_p, seed=100 * rnd + i)
            totals[k][1] += time.perf_counter() - t
            totals[k][0] += len(result.tokens)
            totals[k][2] += result.nfe
ar = totals["ar"][0] / totals["ar"][1]
for k, (tokens, seconds, calls) in totals.items():
    print(f"{k}: {tokens / seconds:.0f} tok/s, {tokens / seconds / ar:.3f}x AR, {tokens / calls:.2f} tokens/call")
