"""SmolLM2 bf16, batch 8, T = 0.7 / top-p 0.95, HumanEval prompts 8-15, 64 tokens, no EOS: ms per call of the update
(Step.fold) and of its pieces (truncated_probs, the shared-noise draw, perturbed_scores), schedule="ar" under the
inverse-CDF shared noise against schedule="ar" under the rejection rule, two rounds.

    cd /tmp && python fold_pieces.py
"""
import sys, time, torch, packed_ss
import packed_ss.decode.shared_noise as S
import packed_ss.decode.epilogue.base as EB
from packed_ss.runtime import program as P
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(40)][8:16]
kw = dict(temperature=0.7, top_p=0.95, seed=1)
acc = {}
def timed(name, f):
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] = acc.get(name, 0) + time.perf_counter() - t; return r
    return g
S.truncated_probs = timed("tp_noise", S.truncated_probs)
EB.truncated_probs = timed("tp_rej", EB.truncated_probs)
S.DRAWS["inverse-cdf"] = (S.DRAWS["inverse-cdf"][0], timed("draw", S.DRAWS["inverse-cdf"][1]))
S.perturbed_scores = timed("scores", S.perturbed_scores)
P.Step.fold = timed("fold", P.Step.fold)
es = {"ar-cdf": packed_ss.Engine(model, schedule="ar", sampler="inverse-cdf"), "ar-rej": packed_ss.Engine(model, schedule="ar", sampler="rejection")}
for e in es.values(): e.generate_batch(prompts, 8, **kw)
for rep in range(2):
    for name, e in es.items():
        acc.clear(); t = time.perf_counter(); r = e.generate_batch(prompts, 64, eos_token_id=[], **kw); el = time.perf_counter() - t
        print(name, round(el, 2), {k: round(v * 1e3 / 64, 2) for k, v in acc.items()})
