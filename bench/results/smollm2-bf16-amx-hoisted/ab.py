"""Two checkouts of packed-ss in turn, one process each: ms per token of `schedule`s on 4 HumanEval prompts (48 new
tokens on SmolLM2-135M-Instruct in bf16, 128 on the shipped model in fp32) and a digest of the tokens, so that a
change that should not alter outputs is seen not to. Each DIR holds a `packed_ss` (a link to a checkout's package,
the built extension beside it).

    cd /tmp && for d in OLD NEW OLD NEW; do python ab.py $d smollm2 ar lookup; done
"""
import hashlib
import json
import sys
import time

import torch

sys.path.insert(0, sys.argv[1])
import packed_ss  # noqa: E402
from packed_ss.lab.humaneval import humaneval_prompts  # noqa: E402

print(packed_ss.__file__, file=sys.stderr)
torch.set_num_threads(2)
if sys.argv[2] == "smollm2":
    model, tok, n = (packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16),
                     packed_ss.load_tokenizer("smollm2-135m"), 48)
else:
    path = packed_ss.default_model_path()
    model, tok, n = packed_ss.load_model(path, dtype=torch.float32), packed_ss.load_tokenizer(path), 128
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(4)]
out = {}
for schedule in sys.argv[3:]:
    engine = packed_ss.Engine(model, schedule=schedule)
    engine.generate(prompts[0], 8)
    t, count, texts = time.perf_counter(), 0, []
    for p in prompts:
        r = engine.generate(p, n, eos_token_id=[])
        count += len(r.tokens)
        texts.append(r.tokens)
    out[schedule] = ((time.perf_counter() - t) / count * 1e3, hashlib.md5(str(texts).encode()).hexdigest()[:8])
print(json.dumps(out))
