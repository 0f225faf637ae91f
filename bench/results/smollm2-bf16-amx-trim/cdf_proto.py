"""Prototype: shared noise by inverse CDF (u keyed by (seed, output position), the rejection rule's u_0 at offset
= position), against the Gumbel race; SmolLM2 bf16, the default engine, batch B, T, 64 tokens; texts vs AR-rejection."""
import sys, time, gc, torch, packed_ss
import packed_ss.decode.shared_noise as S
from packed_ss.decode.sampling import philox_uniform, inverse_cdf
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
def cdf_race(seed, position, prob, idx):
    if idx is not None:
        idx, order = idx.sort(-1); prob = prob.gather(-1, order)
    u = philox_uniform(seed[:, None].expand_as(position).reshape(-1), position.reshape(-1), 1)[:, 0].view(position.shape)
    j = inverse_cdf(prob, u)
    return j if idx is None else idx.gather(-1, j[..., None])[..., 0]
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
batch, temp = int(sys.argv[1]), float(sys.argv[2]); top_p = 0.95 if temp < 1 else None
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(40)][8:8 + (16 if batch == 1 else 16)]
kw = dict(temperature=temp, top_p=top_p, seed=1)
gum = packed_ss.Engine(model); cdf = packed_ss.Engine(model); ar = packed_ss.Engine(model, schedule="ar", sampler="rejection")
units = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
for x in (gum, cdf, ar): x.generate_batch(units[0], 8, **kw)
for o in gc.get_objects():
    if isinstance(o, S.SharedNoise) and o.program is cdf.program(packed_ss.SamplingParams(temperature=temp)).program: o.race = cdf_race
tot, toks, nfe, same = {}, {}, {}, 0
for rep in range(2):
    for u in units:
        outs = {}
        for name, x in (("gumbel", gum), ("cdf", cdf), ("ar", ar)):
            t = time.perf_counter(); r = x.generate_batch(u, 64, eos_token_id=[], **kw); tot[name] = tot.get(name, 0) + time.perf_counter() - t
            outs[name] = [list(g.tokens) for g in r]; toks[name] = toks.get(name, 0) + sum(len(g.tokens) for g in r); nfe[name] = nfe.get(name, 0) + sum(g.nfe for g in r)
        same += sum(a == b for a, b in zip(outs["cdf"], outs["ar"]))
print(sys.argv[1:], "s", {k: round(v, 2) for k, v in tot.items()}, "tok/call", {k: round(toks[k] / nfe[k], 2) for k in tot}, "cdf texts == ar", same, "of", 2 * len(prompts))
