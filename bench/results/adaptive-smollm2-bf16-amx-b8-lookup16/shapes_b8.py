"""SmolLM2-135M-Instruct (bf16): which call shapes the default engine runs at batch BATCH and temperature T (top-p
0.95 when sampled), their ms, and the whole time against `schedule="ar"` (HumanEval prompts 8-23, 64 new tokens,
two rounds, the engines taking turns), with the costs per shape its policy bets with (ms at batch 1 and 8). Run it
once per checkout (PYTHONPATH at a directory holding a `packed_ss` link, the built extension beside it).

    cd /tmp && python shapes_b8.py 8 0.7
"""
import sys, time, collections, torch, packed_ss
from packed_ss.runtime.batch import Batch
from packed_ss.runtime.request import SamplingParams
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:]
batch = int(sys.argv[1]); temp = float(sys.argv[2])
rec = []
iterate = Batch.iterate
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); rec.append((shape, time.perf_counter() - t)); return r
Batch.iterate = timed
e = packed_ss.Engine(model)
ar = packed_ss.Engine(model, schedule="ar")
params = SamplingParams(temperature=temp, top_p=0.95 if temp else None) if temp else SamplingParams()
pol = e.program(params).policy
print(packed_ss.__file__, "width", e.width, [(i, str(s), [round(c, 1) for c in pol.costs[i]]) for i, s in enumerate(pol.shapes)])
units = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
kw = dict(temperature=temp, top_p=0.95, seed=1) if temp else {}
for x in (e, ar): x.generate_batch(units[0], 8, **kw)
calls = collections.Counter(); tot = collections.defaultdict(float)
for name, x in (("default", e), ("ar", ar), ("default", e), ("ar", ar)):
    for u in units:
        rec.clear(); t = time.perf_counter(); r = x.generate_batch(u, 64, eos_token_id=[], **kw); tot[name] += time.perf_counter() - t
        for s, dt in rec: calls[(name, s)] += 1; tot[(name, s)] += dt
for k in sorted(calls, key=str): print(k, calls[k], f"{1e3 * tot[k] / calls[k]:.2f} ms")
print({k: round(v, 2) for k, v in tot.items() if isinstance(k, str)})
