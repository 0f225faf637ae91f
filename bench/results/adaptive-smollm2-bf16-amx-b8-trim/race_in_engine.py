"""SmolLM2 bf16, batch 8, T = 1: the shared-noise race's ms per call inside schedule="ar", and on the same input
alone afterwards.

    cd /tmp && python race_in_engine.py
"""
import time, torch, packed_ss
import packed_ss.decode.shared_noise as SN
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(24)][8:16]
e = packed_ss.Engine(model, schedule="ar")
cap = []; times = []
orig = SN.noise_race
def rec(seed, position, prob, idx):
    t = time.perf_counter(); r = orig(seed, position, prob, idx); times.append(time.perf_counter() - t)
    if len(cap) < 20: cap.append((seed.clone(), position.clone(), prob.clone(), idx))
    return r
import packed_ss.decode.shared_noise as S
for obj in list(e.__dict__.values()): pass
SN_race = None
# patch the race the SharedNoise objects hold
import gc
for o in gc.get_objects():
    if isinstance(o, S.SharedNoise): o.race = rec
e.generate_batch(prompts, 64, eos_token_id=[], temperature=1.0, seed=1)
for o in gc.get_objects():
    if isinstance(o, S.SharedNoise): o.race = rec
times.clear()
e.generate_batch(prompts, 64, eos_token_id=[], temperature=1.0, seed=1)
print("in engine", len(times), f"{sum(times)/len(times)*1e3:.3f} ms", cap[-1][2].shape, cap[-1][2].dtype)
s, p, pr, i = cap[-1]
t = time.perf_counter()
for _ in range(50): orig(s, p, pr, i)
print("standalone", f"{(time.perf_counter()-t)/50*1e3:.3f} ms", "nonzero frac", (pr > 0).float().mean().item(), "max p", pr.amax(-1).flatten()[:8].tolist())
