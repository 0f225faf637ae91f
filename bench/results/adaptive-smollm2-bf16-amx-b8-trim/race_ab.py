"""SmolLM2 bf16, batch 8, temperature T (top-p P): the default engine, schedule="ar" under shared noise (the
profile's sampler) and schedule="ar" under the rejection rule, HumanEval prompts 8-15, 64 tokens, no EOS, three
rounds taking turns: the cost of the shared-noise race against AR's plain draw.

    cd /tmp && python race_ab.py 1.0 8 1.0
"""
import sys, time, torch, packed_ss
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:16]
temp = float(sys.argv[1]); batch = int(sys.argv[2]); top_p = float(sys.argv[3]) if len(sys.argv) > 3 else 0.95
kw = dict(temperature=temp, top_p=top_p, seed=1)
es = {"default": packed_ss.Engine(model), "ar-noise": packed_ss.Engine(model, schedule="ar"),
      "ar-rej": packed_ss.Engine(model, schedule="ar", sampler="rejection")}
for x in es.values(): x.generate_batch(prompts[:batch], 8, **kw)
tot = {}
for rep in range(3):
    for name, x in es.items():
        t = time.perf_counter(); r = x.generate_batch(prompts[:batch], 64, eos_token_id=[], **kw)
        tot[name] = tot.get(name, 0) + time.perf_counter() - t
print(sys.argv[1:], {k: round(v, 2) for k, v in tot.items()})
