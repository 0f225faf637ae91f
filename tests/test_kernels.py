"""Triton kernels against their plain-torch references: packed attention (every layout the engine
issues) with the in-place anchor commit, and greedy decoding end to end.

On the CPU the kernels run in the Triton interpreter (tests/conftest.py), in float32; on a GPU the
same tests also run in bfloat16 and float16.
"""
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from packed_ss.kernels.attention import packed_attention

from packed_ss import Engine, load_model
from packed_ss.decode.epilogue import TorchEpilogue
from packed_ss.decode.sampling import SamplingParams
from packed_ss.decode.schedules import SCHEDULES
from packed_ss.decode.state import DecodeState
from packed_ss.model.attention import Layout, packed_attention_ref, write_anchors

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if CUDA else [torch.float32]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
PROMPT = 13
CAPACITY = 512
# Triton 3.6's interpreter turns 1-element arrays into loop bounds with a NumPy deprecation warning per use.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def engine_layout(kind: str, width: int):
    """The Layout a schedule issues, taken from the schedule classes themselves."""
    model = SimpleNamespace(device=DEVICE, cfg=SimpleNamespace(mask_token_id=0))
    sched_name, call = {
        "ar": ("ar", 0), "prefill": ("ar", "prefill"), "prefill_draft": ("packed", "prefill"),
        "packed": ("packed", 0), "linear_verify": ("linear", 1), "linear_draft": ("linear", 0),
        "quadratic": ("quadratic", 0),
    }[kind]
    sched = SCHEDULES[sched_name](model, width, SamplingParams(), TorchEpilogue(DEVICE, width, SamplingParams()))
    step = sched.prefill(torch.zeros(PROMPT, dtype=torch.int64)) if call == "prefill" else sched.steps[call]
    return step.inputs(DecodeState.new(width, 1, 10, [], 0, DEVICE)).layout


def poisoned_cache(kv_heads, dim, cache_len, dtype):
    """Random K/V below cache_len, NaN from there on (a kernel reading an unwritten slot shows up)."""
    cache = torch.randn(kv_heads, CAPACITY, dim, device=DEVICE).to(dtype)
    cache[:, cache_len:] = float("nan")
    return cache


def check_attention(kind, width, cache_len, group, dim=16, kv_heads=2, dtype=torch.float32, **launch):
    lay = engine_layout(kind, width)
    rows, heads = lay.rows, kv_heads * group
    gen = torch.Generator(device="cpu").manual_seed(1000 * width + cache_len + group)
    q, k, v = (torch.randn(rows, h, dim, generator=gen).to(DEVICE, dtype) for h in (heads, kv_heads, kv_heads))
    k_cache, v_cache = (poisoned_cache(kv_heads, dim, cache_len, dtype) for _ in range(2))
    length = torch.tensor(cache_len, device=DEVICE)
    scale = dim ** -0.5

    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_anchors(want_k, want_v, k, v, length, lay.n_anchor)
    ref = packed_attention_ref(q.double(), k.double(), v.double(), want_k.double().nan_to_num(1e4),
                               want_v.double().nan_to_num(1e4), length, lay, scale)

    out = packed_attention(q, k, v, k_cache, v_cache, length, lay, scale, **launch)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    # Exactly the anchors' K/V in slots cache_len .. cache_len + n_anchor - 1, every other slot untouched.
    torch.testing.assert_close(k_cache, want_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, want_v, rtol=0, atol=0, equal_nan=True)


LAYOUTS = ["ar", "prefill", "prefill_draft", "packed", "linear_verify", "linear_draft", "quadratic"]
# (cached length, GQA ratio): lengths 0, 1 and one that is no multiple of any block size, each ratio once.
CACHED = [(0, 2), (1, 4), (203, 1)]
# ar and prompt-only prefill do not depend on the width.
CASES = [(kind, w) for kind in LAYOUTS for w in ([1] if kind in ("ar", "prefill") else [1, 3, 8, 31])]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cache_len,group", CACHED)
@pytest.mark.parametrize("kind,width", CASES)
def test_packed_attention(kind, width, cache_len, group, dtype):
    check_attention(kind, width, cache_len, group, dtype=dtype)


@pytest.mark.parametrize("kind", ["prefill_draft", "packed", "quadratic"])
def test_small_blocks(kind):
    """Several blocks per KV range: anchor loop bounds, skipped scratch blocks, ragged tails."""
    check_attention(kind, 8, 203, 2, block_m=16, block_n=16)


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("cache_len", [0, 37, 203])
@pytest.mark.parametrize("kind", ["linear_verify", "packed", "quadratic"])
def test_split_kv(kind, cache_len, splits):
    """Split-KV: cache chunks computed on the device (some empty), then combined."""
    check_attention(kind, 3, cache_len, 2, block_n=32, num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim,kv_heads,group", [(24, 1, 4), (64, 2, 2), (128, 8, 4)])
def test_head_dims(dim, kv_heads, group, dtype):
    """Padded (24) and model (64, 128) head dims; the Nemotron-8B head configuration (32 q / 8 KV)."""
    if CUDA and dtype == torch.float32 and dim >= 64:
        pytest.skip("fp32 (IEEE, FMA) dots this wide compile for minutes; the CPU run covers fp32")
    check_attention("packed", 7, 203, group, dim=dim, kv_heads=kv_heads, dtype=dtype)


BATCH_LENS = (0, 5, 37)   # one cache length per request of a batch


def batch_inputs(kind, group, dtype, device=DEVICE, dim=16, kv_heads=2, poison=True):
    """A batch of len(BATCH_LENS) requests sharing one layout. The caches are layer 1 of 2 of request-major
    [B, L, Hkv, S, D] buffers seen as [L, B, Hkv, S, D]: non-contiguous [B, Hkv, S, D] views. Every slot
    from a request's cache_len on is NaN (poison) or random; returns the whole buffers."""
    lay = engine_layout(kind, 3).to(device)
    batch, heads = len(BATCH_LENS), kv_heads * group
    gen = torch.Generator(device="cpu").manual_seed(100 * group + len(kind))
    q, k, v = (torch.randn(batch, lay.rows, h, dim, generator=gen).to(device, dtype)
               for h in (heads, kv_heads, kv_heads))
    bufs = [torch.randn(batch, 2, kv_heads, CAPACITY, dim, generator=gen).to(device, dtype) for _ in range(2)]
    for b, n in enumerate(BATCH_LENS if poison else ()):
        for buf in bufs:
            buf[b, :, :, n:] = float("nan")
    k_all, v_all = (buf.transpose(0, 1) for buf in bufs)
    assert not k_all[1].is_contiguous()
    return lay, q, k, v, k_all, v_all, torch.tensor(BATCH_LENS, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("kind", ["prefill", "packed", "quadratic"])
def test_batch(kind, group, splits, dtype):
    """A batch of 3 requests with their own cache lengths, one launch: every request's output equals the
    reference run on that request alone, and its anchors land in its own cache at its own slots only."""
    lay, q, k, v, k_all, v_all, length = batch_inputs(kind, group, dtype)
    scale = q.shape[-1] ** -0.5
    want_k, want_v = k_all.clone(), v_all.clone()
    for b, n in enumerate(BATCH_LENS):
        want_k[1, b, :, n:n + lay.n_anchor] = k[b, :lay.n_anchor].transpose(0, 1)
        want_v[1, b, :, n:n + lay.n_anchor] = v[b, :lay.n_anchor].transpose(0, 1)

    out = packed_attention(q, k, v, k_all[1], v_all[1], length, lay, scale, block_n=16, num_splits=splits)
    assert out.shape == q.shape and out.dtype == dtype
    for b in range(len(BATCH_LENS)):
        ref = packed_attention_ref(q[b].double(), k[b].double(), v[b].double(), want_k[1, b].double().nan_to_num(1e4),
                                   want_v[1, b].double().nan_to_num(1e4), length[b], lay, scale)
        torch.testing.assert_close(out[b].double(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    # The whole buffers: the other layer, the other requests and every slot outside the anchors' are untouched.
    torch.testing.assert_close(k_all, want_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_all, want_v, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_with_a_see_row_per_request(dtype):
    """The prefill of prompts of several lengths in one call: `see` [B, R], a row per request (a request's mask
    rows see its own prompt, the shorter prompts padded after their end). One launch equals the reference run
    on each request alone with its own row of `see`; its anchors land in its own cache."""
    model = SimpleNamespace(device=DEVICE, cfg=SimpleNamespace(mask_token_id=0))
    sched = SCHEDULES["packed"](model, 3, SamplingParams(), TorchEpilogue(DEVICE, 3, SamplingParams()))
    prompts = [torch.zeros(n, dtype=torch.int64) for n in (7, 2, 5)]
    lay = sched.prefill(*prompts).inputs(None).layout
    assert lay.see.shape == (3, lay.rows)
    gen = torch.Generator(device="cpu").manual_seed(7)
    q, k, v = (torch.randn(3, lay.rows, h, 16, generator=gen).to(DEVICE, dtype) for h in (4, 2, 2))
    k_cache, v_cache = (torch.randn(3, 2, CAPACITY, 16, generator=gen).to(DEVICE, dtype) for _ in range(2))
    length, scale = torch.zeros(3, dtype=torch.int64, device=DEVICE), 16 ** -0.5
    want_k, want_v = k_cache.clone(), v_cache.clone()
    out = packed_attention(q, k, v, k_cache, v_cache, length, lay, scale)
    for b in range(3):
        write_anchors(want_k[b], want_v[b], k[b], v[b], length[b], lay.n_anchor)
        own = Layout(lay.n_anchor, lay.seg, lay.see[b], lay.draft_from)
        ref = packed_attention_ref(q[b].double(), k[b].double(), v[b].double(), want_k[b].double(),
                                   want_v[b].double(), length[b], own, scale)
        torch.testing.assert_close(out[b].double(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(k_cache, want_k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache, want_v, rtol=0, atol=0)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_batched_reference(kind, group):
    """The batched torch reference (vectorised over the batch) equals the per-request reference (CPU, fp32)."""
    cpu = torch.device("cpu")
    lay, q, k, v, k_all, v_all, length = batch_inputs(kind, group, torch.float32, cpu, poison=False)
    scale = q.shape[-1] ** -0.5
    want_k, want_v = k_all.clone(), v_all.clone()
    want = [packed_attention_ref(q[b], k[b], v[b], want_k[1, b], want_v[1, b], length[b], lay, scale)
            for b in range(len(BATCH_LENS))]
    out = packed_attention_ref(q, k, v, k_all[1], v_all[1], length, lay, scale)
    assert out.shape == q.shape
    torch.testing.assert_close(out, torch.stack(want), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_all, want_k, rtol=0, atol=0)
    torch.testing.assert_close(v_all, want_v, rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random 2-layer HF llama (GQA 2, head_dim 16) saved to disk and loaded through packed_ss."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      mask_token_id=96, eos_token_id=95)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(path)
    return load_model(path, device=DEVICE, dtype=torch.float32)


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_engine_greedy(tiny_model, schedule):
    """backend="triton" decodes the same greedy tokens as the torch reference, for every schedule."""
    prompt = [5, 17, 3, 88, 41, 9, 60]
    tokens = {b: Engine(tiny_model, schedule, width=3, backend=b).generate(prompt, max_new_tokens=8).tokens
              for b in ("torch", "triton")}
    assert len(tokens["torch"]) > 1
    assert tokens["triton"] == tokens["torch"]


def test_engine_compiled(tiny_model):
    """The fused kernel inside the engine's fullgraph-compiled step: an opaque op with declared cache writes
    (packed_attention_op), so it compiles on the CPU too, running the kernel in Triton's interpreter."""
    prompt = [5, 17, 3, 88, 41, 9, 60]
    want = Engine(tiny_model, "packed", width=3, backend="torch").generate(prompt, max_new_tokens=8).tokens
    got = Engine(tiny_model, "packed", width=3, backend="triton", compile=True).generate(prompt, max_new_tokens=8)
    assert got.tokens == want


AOT = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from packed_ss.kernels.attention import _combine_kernel, _packed_attention_kernel

    def build(fn, sig, consts, **opts):
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)

    i32 = lambda names: {n: "i32" for n in names.split()}
    for dt, g, d, bm, splits, prec in (("bf16", 4, 128, 64, 9, "tf32"), ("fp32", 2, 16, 16, 1, "ieee")):
        p = "*" + dt
        build(_packed_attention_kernel,
              dict(Q=p, K=p, V=p, KC=p, VC=p, Out=p, OPart="*fp32", MPart="*fp32", LPart="*fp32",
                   cache_len_ptr="*i64", seg_ptr="*i64", see_ptr="*i64", R="i32", n_anchor="i32", HKV="i32",
                   scale_log2="fp32", s_cl="i32", s_see="i32", **i32("s_qb s_qr s_qh s_kb s_kr s_kh s_vb s_vr s_vh "
                                                        "s_kcb s_kch s_kcs s_vcb s_vch s_vcs s_ob s_or s_oh")),
              dict(G=g, D=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=64, NUM_SPLITS=splits, PREC=prec), num_warps=4)
    build(_combine_kernel, dict(Out="*bf16", OPart="*fp32", MPart="*fp32", LPart="*fp32",
                                **i32("R H s_ob s_or s_oh")),
          dict(D=128, BLOCK_D=128, NUM_SPLITS=9, BLOCK_S=16))
""")


@pytest.mark.skipif(CUDA, reason="on a GPU every test above compiles the kernels for real")
def test_compiles_for_hopper():
    """The interpreter skips Triton's type checks: compile ahead of time for sm_90 (ptxas ships with triton)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", AOT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
