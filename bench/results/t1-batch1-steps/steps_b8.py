"""steps.py at batch 8: where the default's time goes at T (default 1), 8 requests at once (generate_batch), on the
shipped model (fp32): each iteration's shape (-1: the lean AR step) and its time, the default and AR taking turns
batch by batch (16 HumanEval prompts as two batches of 8, 128 new tokens, twice). T = 0.7 adds top-p 0.95.

    python steps_b8.py 1.0      # 2026-12-06, Intel Xeon (AMX), 2 threads: 0.946x and 0.993x in two runs
"""
import sys, time, collections
import torch
import packed_ss
from packed_ss.runtime.batch import Batch
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
path = packed_ss.default_model_path()
tok = packed_ss.load_tokenizer(path)
model = packed_ss.load_model(path, dtype=torch.float32)
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(16)]
T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
extra = dict(top_p=0.95) if T == 0.7 else {}
rec = []
iterate = Batch.iterate
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); rec.append((shape, time.perf_counter() - t)); return r
Batch.iterate = timed
engines = {"default": packed_ss.Engine(model), "ar": packed_ss.Engine(model, schedule="ar")}
for e in engines.values():
    e.generate_batch(prompts[:8], 8, seed=1, temperature=T, **extra)
tot = collections.defaultdict(float); calls = collections.Counter(); toks = collections.Counter()
for rnd in range(2):
    for i in range(2):
        ps = prompts[8 * i: 8 * i + 8]
        for name, e in (list(engines.items()) if (i + rnd) % 2 == 0 else list(reversed(engines.items()))):
            rec.clear(); t = time.perf_counter()
            r = e.generate_batch(ps, 128, seed=i + 10 * rnd, eos_token_id=[], temperature=T, **extra)
            tot[name] += time.perf_counter() - t; toks[name] += sum(len(x.tokens) for x in r)
            for s, dt in rec:
                calls[(name, s)] += 1; tot[(name, s)] += dt
for name in engines:
    print(name, f"{toks[name] / tot[name]:.1f} tok/s", f"{tot[name]:.2f} s")
for k in sorted((k for k in calls), key=str):
    print(k, calls[k], f"{1e3 * tot[k] / calls[k]:.2f} ms", f"{tot[k]:.2f} s")
print("default / ar", (toks["default"] / tot["default"]) / (toks["ar"] / tot["ar"]))
