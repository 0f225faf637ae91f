"""What a request costs the default engine besides its decode calls: the shipped model, batch 1, HumanEval prompts
8-23, three rounds, the default and `ar` taking turns; ms a request for N new tokens (N = 1: the prefill and its
draw alone).

    cd /tmp && python per_request_cost.py 0.7 1     # T, N
"""
import time, torch, packed_ss, sys
from packed_ss.lab.bench.adaptive import tokenized_prompts
torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
T = float(sys.argv[1]); top_p = 0.95 if 0 < T < 1 else None; n = int(sys.argv[2])
engines = {"default": packed_ss.Engine(model), "ar": packed_ss.Engine(model, schedule="ar")}
for e in engines.values(): e.generate(ids[0], 8, temperature=T, top_p=top_p, seed=0)
tot = {k: 0.0 for k in engines}; calls = {k: 0 for k in engines}
for rnd in range(3):
    for i, p in enumerate(ids):
        for k in (engines if (i + rnd) % 2 else list(reversed(engines))):
            t = time.perf_counter(); out = engines[k].generate(p, n, temperature=T, top_p=top_p, seed=i); tot[k] += time.perf_counter() - t; calls[k] += out.nfe
for k in engines: print(k, f"{1e3*tot[k]/48:.2f} ms a request, {calls[k]/48:.1f} calls")
