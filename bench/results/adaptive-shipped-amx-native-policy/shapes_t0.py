"""The shipped model (fp32) at T = 0: which call shapes the default engine runs and their ms, against the fixed
`lookup` W = 8 (HumanEval prompts 8-23, 128 new tokens, BATCH requests at a time, two rounds), and the costs per
shape its policy bets with (ms at batch 1 and 8).

    cd /tmp && python shapes_t0.py 1
"""
import sys, time, collections, torch, packed_ss
from packed_ss.runtime.batch import Batch
from packed_ss.runtime.request import SamplingParams
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
path = packed_ss.default_model_path(); tok = packed_ss.load_tokenizer(path)
model = packed_ss.load_model(path, dtype=torch.float32)
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:]
batch = int(sys.argv[1])
rec = []
iterate = Batch.iterate
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); rec.append((shape, time.perf_counter() - t)); return r
Batch.iterate = timed
e = packed_ss.Engine(model)
fixed = packed_ss.Engine(model, schedule="lookup", width=8)
pol = e.program(SamplingParams()).policy
print("width", e.width, [(i, str(s), [round(c, 2) for c in pol.costs[i]]) for i, s in enumerate(pol.shapes)])
units = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
for x in (e, fixed): x.generate_batch(units[0], 8)
calls = collections.Counter(); tot = collections.defaultdict(float)
for name, x in (("default", e), ("lookup8", fixed), ("default", e), ("lookup8", fixed)):
    for u in units:
        rec.clear(); t = time.perf_counter(); r = x.generate_batch(u, 128, eos_token_id=[]); tot[name] += time.perf_counter() - t
        for s, dt in rec: calls[(name, s)] += 1; tot[(name, s)] += dt
for k in sorted(calls, key=str): print(k, calls[k], f"{1e3 * tot[k] / calls[k]:.2f} ms")
print({k: round(v, 2) for k, v in tot.items() if isinstance(k, str)})
