"""SmolLM2 bf16, batch B, temperature T: the default engine and schedule="ar" with the attention over the pages in
use (pages_seen) and over the whole table, three rounds taking turns; the texts must not change.

    cd /tmp && python trim_ab.py 0.7 8
"""
import sys, time, torch, packed_ss
import packed_ss.model.attention as A
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:16]
temp = float(sys.argv[1]); batch = int(sys.argv[2])
kw = dict(temperature=temp, top_p=0.95, seed=1) if temp else {}
e = packed_ss.Engine(model); ar = packed_ss.Engine(model, schedule="ar")
trim = A.pages_seen
full = lambda layout, cache_len, table, page_size: table.shape[1]
for x in (e, ar): x.generate_batch(prompts[:batch], 8, **kw)
tot = {}
outs = {}
for rep in range(3):
    for mode, f in (("trim", trim), ("full", full)):
        A.pages_seen = f
        for name, x in (("default", e), ("ar", ar)):
            t = time.perf_counter(); r = x.generate_batch(prompts[:batch], 64, eos_token_id=[], **kw)
            tot[(mode, name)] = tot.get((mode, name), 0) + time.perf_counter() - t
            o = [list(g.tokens) if hasattr(g, "tokens") else g for g in r]
            outs.setdefault((mode, name), o)
            assert outs[(mode, name)] == o
print({k: round(v, 2) for k, v in tot.items()})
print("same text trim/full:", outs[("trim", "ar")] == outs[("full", "ar")], outs[("trim", "default")] == outs[("full", "default")])
