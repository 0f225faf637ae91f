"""T = 1, batch 1, the shipped model: the default and `packed` W = 3 (diffusion drafts) under the rejection sampler and
under shared noise coupled by the inverse CDF, against `ar` (HumanEval prompts 8-23, 128 new tokens, no EOS, two
rounds, the engines taking turns).

    cd /tmp && python samplers_t1.py 1
"""
import collections, sys, time, torch, packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts
torch.set_num_threads(2)
T = float(sys.argv[1]); top_p = float(sys.argv[2]) if len(sys.argv) > 2 else None
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = {"default rejection": packed_ss.Engine(model), "default inverse-cdf": packed_ss.Engine(model, sampler="inverse-cdf"),
           "ar": packed_ss.Engine(model, schedule="ar"),
           "packed W=3 rejection": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion"),
           "packed W=3 inverse-cdf": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion", sampler="inverse-cdf")}
for e in engines.values(): e.generate(ids[0], 8, temperature=T, top_p=top_p, seed=0)
tok = collections.Counter(); calls = collections.Counter(); secs = collections.Counter()
for rnd in range(2):
    for i, p in enumerate(ids):
        for k in (list(engines) if (i + rnd) % 2 else list(reversed(engines))):
            t = time.perf_counter()
            out = engines[k].generate(p, 128, temperature=T, top_p=top_p, seed=100 * rnd + i, eos_token_id=[])
            secs[k] += time.perf_counter() - t; tok[k] += len(out.tokens); calls[k] += out.nfe
ar = tok["ar"] / secs["ar"]
for k in engines: print(f"{k}: {tok[k]/secs[k]:.0f} tok/s, {tok[k]/secs[k]/ar:.3f}x AR, {tok[k]/calls[k]:.2f} tokens a call")
