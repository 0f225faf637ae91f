"""T = 1 (or 0.7 / top-p 0.95), batch 1, the shipped model: the default engine, a default whose sampled requests price
their bets alone (the batch-1 costs: its policy's COST_BATCH column replaced so that `marginal` is the batch-1 column;
the native choice runs), `ar` and `packed` W = 3 with diffusion drafts, taking turns prompt by prompt over HumanEval
prompts 8-23, three rounds, 128 new tokens.

    cd /tmp && python price_alone.py 1
"""
import sys, time, collections, torch, packed_ss
from packed_ss.decode.policy import COST_BATCH
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.request import SamplingParams
torch.set_num_threads(2)
model = packed_ss.load_model()
T = float(sys.argv[1]); top_p = 0.95 if T < 1 else None
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = {"default": packed_ss.Engine(model), "priced alone": packed_ss.Engine(model),
           "ar": packed_ss.Engine(model, schedule="ar"),
           "packed W=3 +diffusion": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")}
prog = engines["priced alone"].program(SamplingParams(temperature=T, top_p=top_p))
pol = prog.policy
ar0 = pol.costs[0][0]
prog.policy = pol.measured([(a, a + (COST_BATCH - 1) * ar0) for a, _ in pol.costs], per_request=True)
print("costs", [(str(s), [round(x, 2) for x in c]) for s, c in zip(pol.shapes, pol.costs)])
for e in engines.values(): e.generate(ids[0], 8, temperature=T, top_p=top_p, seed=0)
tot = {k: [0, 0.0, 0] for k in engines}
for rnd in range(3):
    for i, p in enumerate(ids):
        for k in (list(engines) if (i + rnd) % 2 == 0 else list(reversed(engines))):
            t = time.perf_counter(); r = engines[k].generate(p, 128, temperature=T, top_p=top_p, seed=100 * rnd + i)
            tot[k][1] += time.perf_counter() - t; tot[k][0] += len(r.tokens); tot[k][2] += r.nfe
ar = tot["ar"][0] / tot["ar"][1]
for k, (n, s, c) in tot.items(): print(f"{k}: {n/s:.0f} tok/s, {n/s/ar:.3f}x AR, {n/c:.2f} tokens/call")
