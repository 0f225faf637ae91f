"""Where the default's time goes at T = 1, batch 1, on the shipped model (fp32): each iteration's shape (-1: the
lean AR step, QUIET) and its time, the default and AR alternating request by request (16 HumanEval prompts, 128
new tokens, twice). With `gumbel`, the default and AR under shared noise too, over the first PROMPTS prompts; with
`batch8`, the requests 8 at a time (generate_batch), alternating batch by batch.

    python steps.py THREADS TEMPERATURE                  # here: 2 1.0
    python steps.py THREADS TEMPERATURE PROMPTS gumbel   # here: 2 1.0 8 gumbel
    python steps.py THREADS TEMPERATURE PROMPTS batch8   # here: 2 1.0 16 batch8 (generate_batch, 8 at once)
"""
import sys, time, collections
import torch
import packed_ss
from packed_ss.runtime.batch import Batch
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
path = packed_ss.default_model_path()
tok = packed_ss.load_tokenizer(path)
model = packed_ss.load_model(path, dtype=torch.float32)
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(int(sys.argv[3]) if len(sys.argv) > 3 else 16)]
setting = dict(temperature=float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
rec = []
iterate = Batch.iterate
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); rec.append((shape, time.perf_counter() - t)); return r
Batch.iterate = timed
engines = {"default": packed_ss.Engine(model), "ar": packed_ss.Engine(model, schedule="ar")}
if "gumbel" in sys.argv[4:]:
    engines |= {"default~gumbel": packed_ss.Engine(model, sampler="gumbel"),
                "ar~gumbel": packed_ss.Engine(model, schedule="ar", sampler="gumbel")}
batch = 8 if "batch8" in sys.argv[4:] else 1
units = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
for e in engines.values():
    e.generate_batch(units[0], 8, seed=1, **setting)
tot = collections.defaultdict(float); calls = collections.Counter(); toks = collections.Counter()
for rnd in range(2):
    for i, unit in enumerate(units):
        for name, e in (list(engines.items()) if (i + rnd) % 2 == 0 else list(reversed(engines.items()))):
            rec.clear(); t = time.perf_counter()
            r = e.generate_batch(unit, 128, seed=i, eos_token_id=[], **setting)
            tot[name] += time.perf_counter() - t; toks[name] += sum(len(x.tokens) for x in r)
            for s, dt in rec:
                calls[(name, s)] += 1; tot[(name, s)] += dt
for name in engines:
    print(name, f"{toks[name] / tot[name]:.1f} tok/s")
for k in sorted((k for k in calls), key=str):
    print(k, calls[k], f"{1e3 * tot[k] / calls[k]:.2f} ms")
for name in engines:
    print(name, "/ ar", (toks[name] / tot[name]) / (toks["ar"] / tot["ar"]))
