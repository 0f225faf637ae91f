"""SmolLM2 bf16, batch 1, greedy: the default engine built and run with the attention over the pages in use (trim)
against one built and run over the whole table (full), and AR under each; HumanEval prompts 0-15, 128 tokens, turns."""
import sys, time, torch, packed_ss
import packed_ss.model.attention as A
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(int(sys.argv[2]))][int(sys.argv[1]):]
trim, full = A.pages_seen, (lambda layout, cache_len, table, page_size: table.shape[1])
eng = {}
for mode, f in (("trim", trim), ("full", full)):
    A.pages_seen = f
    eng[mode] = (f, packed_ss.Engine(model), packed_ss.Engine(model, schedule="ar"))
    pol = eng[mode][1].program(packed_ss.SamplingParams()).policy
    print(mode, "costs", [(str(s), [round(c, 1) for c in pol.costs[i]]) for i, s in enumerate(pol.shapes)])
tot, toks, nfe = {}, {}, {}
for p in prompts:
    for mode, (f, e, ar) in eng.items():
        A.pages_seen = f
        for name, x in (("default", e), ("ar", ar)):
            t = time.perf_counter(); r = x.generate(p, max_new_tokens=128); k = (mode, name)
            tot[k] = tot.get(k, 0) + time.perf_counter() - t; toks[k] = toks.get(k, 0) + len(r.tokens); nfe[k] = nfe.get(k, 0) + r.nfe
print({k: (round(v, 1), round(toks[k] / v, 1), round(toks[k] / nfe[k], 2)) for k, v in tot.items()})
