"""Shipped model, batch 1 and 8, T = 0.7 / top-p 0.95: default, ar and packed W=3 (+diffusion), with the native nucleus
cut and without it (sampling.nucleus_cut -> None: the partial sorts), taking turns."""
import sys, time, torch, packed_ss
from packed_ss.decode import sampling as S
from packed_ss.lab.bench.adaptive import tokenized_prompts
torch.set_num_threads(2)
native = S.nucleus_cut
model = packed_ss.load_model(); ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
B = int(sys.argv[1]); T = float(sys.argv[2]); tp = float(sys.argv[3]) if len(sys.argv) > 3 else None
E = {"default": packed_ss.Engine(model), "ar": packed_ss.Engine(model, schedule="ar"),
     "pk3": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")}
for e in E.values(): e.generate_batch(ids[:B], 8, temperature=T, top_p=tp, seed=0, batch_size=B)
tot = {}
for rnd in range(2):
    for i in range(0, len(ids), B):
        for mode in (("native", "torch") if (i // B + rnd) % 2 == 0 else ("torch", "native")):
            S.nucleus_cut = native if mode == "native" else (lambda prob, top_p: None)
            for k, e in E.items():
                t = time.perf_counter(); r = e.generate_batch(ids[i:i + B], 128, temperature=T, top_p=tp, seed=rnd * 100 + i, eos_token_id=[], batch_size=B)
                x = tot.setdefault((k, mode), [0, 0.0, 0]); x[1] += time.perf_counter() - t; x[0] += sum(len(q.tokens) for q in r); x[2] += sum(q.nfe for q in r)
for (k, mode), (n, s, c) in sorted(tot.items(), key=lambda kv: kv[0][1]):
    print(f"{mode:7s} {k:8s} {n/s:7.0f} tok/s  {n/s/(tot[('ar', mode)][0]/tot[('ar', mode)][1]):.3f}x AR  {n/c:.2f} tok/call")
