"""The shipped model (fp32) at batch 8, temperature T: the default engine's call shapes and ms against
schedule="ar" (rejection), with the attention over the pages in use (trim) and over the whole table (full),
HumanEval prompts 8-23, 128 new tokens, no EOS, engines and modes taking turns, three rounds."""
import sys, time, collections, torch, packed_ss
import packed_ss.model.attention as A
from packed_ss.runtime.batch import Batch
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
path = packed_ss.default_model_path(); tok = packed_ss.load_tokenizer(path)
model = packed_ss.load_model(path, dtype=torch.float32)
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:]
temp = float(sys.argv[1]); kw = dict(temperature=temp, top_p=0.95 if temp < 1 else None, seed=1)
rec = []
iterate = Batch.iterate
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); rec.append((shape, time.perf_counter() - t)); return r
Batch.iterate = timed
e = packed_ss.Engine(model); ar = packed_ss.Engine(model, schedule="ar", sampler="rejection")
trim, full = A.pages_seen, (lambda layout, cache_len, table, page_size: table.shape[1])
units = [prompts[i:i + 8] for i in range(0, len(prompts), 8)]
for x in (e, ar): x.generate_batch(units[0], 8, **kw)
calls = collections.Counter(); tot = collections.defaultdict(float)
for rnd in range(3):
    for mode, f in (("trim", trim), ("full", full)):
        A.pages_seen = f
        for name, x in (("default", e), ("ar", ar)):
            for u in units:
                rec.clear(); t = time.perf_counter(); x.generate_batch(u, 128, eos_token_id=[], **kw)
                tot[(mode, name)] += time.perf_counter() - t
                for s, dt in rec: calls[(mode, name, s)] += 1; tot[(mode, name, s)] += dt
for k in sorted(calls, key=str): print(k, calls[k], f"{1e3 * tot[k] / calls[k]:.2f} ms")
print({k: round(v, 2) for k, v in tot.items() if len(k) == 2})
