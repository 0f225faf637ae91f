"""SmolLM2 bf16, batch 8, temperature T (top-p 0.95 below 1): the default engine (the profile's sampler), schedule="ar"
under inverse-CDF shared noise and schedule="ar" under the rejection rule; HumanEval prompts 8-23 in two units of 8,
64 tokens, no EOS, three rounds, the order reversed every other round; the default's texts against AR-rejection's.

    cd /tmp && python cdf_ab.py 0.7
"""
import sys, time, torch, packed_ss
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(40)][8:24]
temp = float(sys.argv[1]); top_p = 0.95 if temp < 1 else None
kw = dict(temperature=temp, top_p=top_p, seed=1)
es = {"default": packed_ss.Engine(model), "ar-cdf": packed_ss.Engine(model, schedule="ar", sampler="inverse-cdf"),
      "ar-rej": packed_ss.Engine(model, schedule="ar", sampler="rejection")}
print({k: e.sampler for k, e in es.items()})
for x in es.values(): x.generate_batch(prompts[:8], 8, **kw)
tot, outs = {}, {}
for rep in range(3):
    for u in (prompts[:8], prompts[8:]):
        for name, x in (list(es.items()) if rep % 2 == 0 else list(es.items())[::-1]):
            t = time.perf_counter(); r = x.generate_batch(u, 64, eos_token_id=[], **kw)
            tot[name] = tot.get(name, 0) + time.perf_counter() - t
            outs.setdefault(name, []).extend(list(g.tokens) for g in r)
print(sys.argv[1:], {k: round(v, 2) for k, v in tot.items()}, "default texts == ar-rej:",
      sum(a == b for a, b in zip(outs["default"], outs["ar-rej"])), "of", len(outs["default"]))
