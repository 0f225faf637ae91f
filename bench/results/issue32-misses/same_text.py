"""SmolLM2 bf16 greedy batch 1, 64 tokens, the bench's 24 scored prompts: default vs lookup W=8 vs ar, split by
whether the default's text equals lookup W=8's (bf16 sums differ by call shape, so greedy texts may part)."""
import sys, json, time, torch, packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
ids = [ids for _, ids in tokenized_prompts(tok, 32)][8:32]
engines = {"default": packed_ss.Engine(model), "lookup8": packed_ss.Engine(model, schedule="lookup", width=8),
           "ar": packed_ss.Engine(model, schedule="ar")}
for e in engines.values(): e.generate_batch(ids[:1], 8)
rows = []
for u, p in enumerate(ids):
    row = {}
    for name, e in engines.items():
        t = time.perf_counter(); r = e.generate_batch([p], 64)[0]; el = time.perf_counter() - t
        row[name] = dict(tokens=r.tokens, nfe=r.nfe, wall=el)
    rows.append(row)
    print(u, {k: (len(v["tokens"]), v["nfe"], round(v["wall"], 2)) for k, v in row.items()},
          "same" if row["default"]["tokens"] == row["lookup8"]["tokens"] else "parted", flush=True)
json.dump(rows, open("same_text.json", "w"))
print("(texts equal to `ar`'s: default", sum(r["default"]["tokens"] == r["ar"]["tokens"] for r in rows),
      "of", len(rows), "- lookup W=8", sum(r["lookup8"]["tokens"] == r["ar"]["tokens"] for r in rows), ")")
def rate(sel, name): return sum(len(r[name]["tokens"]) for r in sel) / sum(r[name]["wall"] for r in sel)
for label, sel in (("all", rows), ("same", [r for r in rows if r["default"]["tokens"] == r["lookup8"]["tokens"]]),
                   ("parted", [r for r in rows if r["default"]["tokens"] != r["lookup8"]["tokens"]])):
    if sel:
        print(label, len(sel), "default/lookup8", round(rate(sel, "default") / rate(sel, "lookup8"), 3),
              "tok/call", round(sum(len(r["default"]["tokens"]) for r in sel) / sum(r["default"]["nfe"] for r in sel), 2),
              round(sum(len(r["lookup8"]["tokens"]) for r in sel) / sum(r["lookup8"]["nfe"] for r in sel), 2))
