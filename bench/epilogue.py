"""Non-model decoder time per iteration, per schedule: the torch epilogue against the compiled one (CPU),
eager against CUDA-graph decoding (GPU).

Everything the engine does around the model is timed: building each call's input, the logits
processing (argmax / truncated_probs), acceptance, the residual or bonus draw, emit, retain, the state
update and the loop's own host work (on the GPU eager loop: one stop-flag synchronisation per call; with
graphs: replays and the one-late poll). The model is a stand-in that returns a precomputed logits tensor
of the call's shape, [rows, vocab], at no cost: the verifier and drafter rows are one shared base row
plus independent noise, so drafts are accepted part of the time (the mean accepted count is reported).

Per iteration = decoder time outside model calls / the batch's decode iterations (Linear-SS: a verify and
a draft call; AR: one call), `--batch-sizes` requests decoding together (the prompts' prefills included,
one per request). With CUDA graphs the model calls cannot be timed apart; the stand-in launches no
work, so its share is the Python call alone (measured ~0 in eager mode, column model_us).

    python bench/epilogue.py --out bench/epilogue_cpu.json                 # CPU, torch vs native
    python bench/epilogue.py --batch-sizes 1 8 32 --vocab 32000            # how it grows with the batch
    python bench/epilogue.py --device cuda --out epilogue_gpu.json          # GPU, + eager vs graph
    python bench/epilogue.py --quick                                        # a few seconds
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import packed_ss
from packed_ss.decode.epilogue import native_available, native_unavailable_reason

SCHEDULES = ("ar", "linear", "quadratic", "packed")
SAMPLING = {"greedy": dict(), "T1": dict(temperature=1.0), "top-k50-p0.9": dict(temperature=0.8, top_k=50, top_p=0.9)}
PROMPT = list(range(1, 17))


class StandInModel:
    """The engine's model interface; each call returns the first `rows` rows of a fixed logits table."""

    def __init__(self, vocab: int, rows: int, device, noise: float = 1.0, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        base = torch.randn(vocab, generator=gen) * 4
        self.logits = (base + noise * torch.randn(rows, vocab, generator=gen)).to(device)
        self.cfg = SimpleNamespace(vocab_size=vocab, mask_token_id=vocab - 1, eos_token_ids=(), max_seq_len=1 << 22,
                                   any_order=False)
        self.device, self.dtype = torch.device(device), torch.float32
        self.draft_profile = None   # no drafter profile: the engine's defaults

    def kv_pools(self, pages: int, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, pages, page_size, 1, 1)
        return torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device)

    def __call__(self, tokens, positions, layout, cache, cache_len, attend=None):
        rows = self.logits[: tokens.shape[-1]]
        return rows if tokens.dim() == 1 else rows.expand(tokens.shape[0], -1, -1)


def run(model, schedule, width, sampling, epilogue, graph, iters, device, batch=1):
    """(non-model seconds per iteration, model seconds per iteration, mean accepted, tokens per iteration) of
    `batch` requests decoded together."""
    engine = packed_ss.Engine(model, schedule=schedule, width=width, epilogue=epilogue, cuda_graph=graph)
    kwargs = dict(SAMPLING[sampling], eos_token_id=[], seed=1)

    def decode(max_new: int):
        began = time.perf_counter()
        results = engine.generate_batch([PROMPT] * batch, max_new_tokens=max_new, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return results, time.perf_counter() - began, max(1, engine.runtime.iterations)
    decode(4 * (width + 1))                # warm-up (and capture)
    # decode until `iters` iterations: pick max_new from a short probe of tokens per iteration
    probe, _, n = decode(8 * (width + 1))
    results, wall_s, n = decode(max(1, int(len(probe[0].tokens) / n * iters)))
    model_s = 0.0 if graph else engine.runtime.model_s
    accepted = sum(r.mean_accepted for r in results) / batch
    return (wall_s - model_s) / n, model_s / n, accepted, sum(len(r.tokens) for r in results) / n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 131072])
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--iters", type=int, default=None, help="iterations per measurement (default 60 CPU, 300 GPU)")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    parser.add_argument("--sampling", nargs="+", default=list(SAMPLING), choices=list(SAMPLING))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1], help="requests decoded together")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="vocab 32000, 15 iterations, greedy and T1")
    parser.add_argument("--out", default=None, help="JSON file for the records")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.quick:
        args.vocab, args.iters, args.sampling = [32000], args.iters or 15, ["greedy", "T1"]
    iters = args.iters or (300 if device.type == "cuda" else 60)
    torch.set_num_threads(args.threads)

    epilogues = ["torch"]
    if native_available(device):
        epilogues.append("native")
    else:
        print(f"# native epilogue skipped: {native_unavailable_reason(device)}")
    graphs = [False, True] if device.type == "cuda" else [False]
    env = dict(device=str(device), torch=torch.__version__, python=platform.python_version(),
               cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
               gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None, width=args.width,
               iters=iters)
    print("#", json.dumps(env))
    header = (f"{'schedule':<10} {'vocab':>6} {'batch':>5} {'sampling':<13} {'epilogue':<7} {'mode':<5} "
              f"{'us/iter':>9} {'model_us':>8} {'accepted':>8} {'tok/iter':>8}")
    print(header)
    print("-" * len(header))
    records = []
    for vocab in args.vocab:
        rows = (args.width + 1) * (args.width + 2)          # the largest call: quadratic, B(B+1)
        model = StandInModel(vocab, max(rows, len(PROMPT) + args.width + 1), device)
        configs = [(s, b, p, e, g) for s in args.schedules for b in args.batch_sizes for p in args.sampling
                   for e in epilogues for g in graphs]
        for schedule, batch, sampling, epilogue, graph in configs:
            per_iter, model_per_iter, accepted, tokens = run(model, schedule, args.width, sampling, epilogue, graph,
                                                             iters, device, batch)
            rec = dict(schedule=schedule, vocab=vocab, batch=batch, sampling=sampling, epilogue=epilogue,
                       mode="graph" if graph else "eager", us_per_iter=per_iter * 1e6,
                       model_us_per_iter=model_per_iter * 1e6, mean_accepted=accepted, tokens_per_iter=tokens)
            records.append(rec)
            print(f"{schedule:<10} {vocab:>6} {batch:>5} {sampling:<13} {epilogue:<7} {rec['mode']:<5} "
                  f"{rec['us_per_iter']:>9.1f} {rec['model_us_per_iter']:>8.1f} {accepted:>8.2f} "
                  f"{tokens:>8.2f}", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(dict(env=env, records=records), indent=1))
    # speed-up summary: torch eager over each other configuration
    key = ("schedule", "vocab", "batch", "sampling", "epilogue", "mode")
    by_key = {tuple(r[k] for k in key): r["us_per_iter"] for r in records}
    print()
    print("speed-up over the torch epilogue, eager:")
    for (schedule, vocab, batch, sampling, epilogue, mode), us in by_key.items():
        base = by_key.get((schedule, vocab, batch, sampling, "torch", "eager"))
        if base and (epilogue, mode) != ("torch", "eager"):
            print(f"  {schedule:<10} {vocab:>6} {batch:>5} {sampling:<13} {epilogue:<7} {mode:<5} x{base / us:5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
