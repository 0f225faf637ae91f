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

from packed_ss import Engine, host, load_model
from packed_ss.decode.epilogue import TorchEpilogue
from packed_ss.decode.registry import schedules
from packed_ss.decode.state import DecodeState
from packed_ss.model.attention import Layout, anchor_pages, gather_positions, packed_attention_ref, write_anchors

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
    sched = schedules()[sched_name](model, width, False, TorchEpilogue(DEVICE, width, False))
    step = sched.prefill(torch.zeros(PROMPT, dtype=torch.int64)) if call == "prefill" else sched.steps[call]
    return step.inputs(DecodeState.new(width, 1, 10, [], 0, DEVICE)).layout


def paged(caches: torch.Tensor, page_size: int, gen: torch.Generator, spare: int = 3):
    """Per-request caches [B, Hkv, S, D] as a pool [pages, page_size, Hkv, D] and a page table [B, n]: the
    requests' pages interleaved in a random order, with the null page and `spare` pages of NaN no table names
    (a kernel reading or writing outside a request's pages shows up there)."""
    batch, kv_heads, slots, dim = caches.shape
    n = -(-slots // page_size)
    padded = torch.full((batch, kv_heads, n * page_size, dim), float("nan"), dtype=caches.dtype, device=caches.device)
    padded[:, :, :slots] = caches
    pool = torch.full((1 + batch * n + spare, page_size, kv_heads, dim), float("nan"), dtype=caches.dtype,
                      device=caches.device)
    table = (1 + torch.randperm(batch * n + spare, generator=gen)[:batch * n]).view(batch, n).to(caches.device)
    pool[table] = padded.transpose(1, 2).reshape(batch, n, page_size, kv_heads, dim)
    return pool, table


def poisoned_caches(batch, kv_heads, dim, cache_lens, dtype, gen):
    """Random K/V below each request's cache_len, NaN from there on (a kernel reading an unwritten slot shows up)."""
    caches = torch.randn(batch, kv_heads, CAPACITY, dim, generator=gen).to(DEVICE, dtype)
    for b, n in enumerate(cache_lens):
        caches[b, :, n:] = float("nan")
    return caches


def check_paged(lay, q, k, v, caches, cache_lens, dtype, page_size=16, see_rows=None, **launch):
    """The kernel against the reference over the same paged pools (anchors written in place by both), per
    request alone (its own row of `see` when `see_rows`); every pool slot outside the anchors' is untouched."""
    gen = torch.Generator(device="cpu").manual_seed(len(cache_lens) + page_size)
    (k_pool, table), (v_pool, _) = (paged(c, page_size, torch.Generator().manual_seed(gen.initial_seed()))
                                    for c in caches)
    length, scale = torch.tensor(cache_lens, device=DEVICE), q.shape[-1] ** -0.5
    want_k, want_v = k_pool.clone(), v_pool.clone()
    write_anchors(want_k, want_v, anchor_pages(table, length, lay.n_anchor, page_size), k, v)
    out = packed_attention(q, k, v, k_pool, v_pool, table, length, lay, scale, **launch)
    assert out.shape == q.shape and out.dtype == dtype
    for b in range(len(cache_lens)):
        own = lay if see_rows is None else Layout(lay.n_anchor, lay.seg, lay.see[b], lay.draft_from)
        ref = packed_attention_ref(q[b:b + 1].double(), k[b:b + 1].double(), v[b:b + 1].double(),
                                   want_k.double().nan_to_num(1e4), want_v.double().nan_to_num(1e4),
                                   table[b:b + 1], length[b:b + 1], own, scale)
        torch.testing.assert_close(out[b:b + 1].double(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    # Exactly the anchors' K/V in slots cache_len .. cache_len + n_anchor - 1, every other slot untouched.
    torch.testing.assert_close(k_pool, want_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_pool, want_v, rtol=0, atol=0, equal_nan=True)


def check_attention(kind, width, cache_len, group, dim=16, kv_heads=2, dtype=torch.float32, page_size=16,
                    **launch):
    lay = engine_layout(kind, width)
    rows, heads = lay.rows, kv_heads * group
    gen = torch.Generator(device="cpu").manual_seed(1000 * width + cache_len + group)
    q, k, v = (torch.randn(1, rows, h, dim, generator=gen).to(DEVICE, dtype) for h in (heads, kv_heads, kv_heads))
    caches = [poisoned_caches(1, kv_heads, dim, [cache_len], dtype, gen) for _ in range(2)]
    check_paged(lay, q, k, v, caches, [cache_len], dtype, page_size, **launch)


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
    """Several pages per KV range: anchor loop bounds, skipped scratch pages, ragged tails."""
    check_attention(kind, 8, 203, 2, block_m=16, block_n=16)


@pytest.mark.parametrize("page_size", [1, 5, 16, 64, 256])
@pytest.mark.parametrize("kind", ["prefill_draft", "packed"])
def test_cache_block_sizes(kind, page_size):
    """Cache pages smaller than a KV tile, not dividing it (5), equal to it and larger: every tile gathers its
    keys block by block; the anchors cross block boundaries."""
    check_attention(kind, 7, 203, 2, page_size=page_size, block_n=32)


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
    """A batch of len(BATCH_LENS) requests sharing one layout, with caches [B, Hkv, S, D] of their own; every
    slot from a request's cache_len on is NaN (poison) or random."""
    lay = engine_layout(kind, 3).to(device)
    batch, heads = len(BATCH_LENS), kv_heads * group
    gen = torch.Generator(device="cpu").manual_seed(100 * group + len(kind))
    q, k, v = (torch.randn(batch, lay.rows, h, dim, generator=gen).to(device, dtype)
               for h in (heads, kv_heads, kv_heads))
    caches = [poisoned_caches(batch, kv_heads, dim, BATCH_LENS if poison else [CAPACITY] * batch, dtype, gen)
              for _ in range(2)]
    return lay, q, k, v, [c.to(device) for c in caches]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("kind", ["prefill", "packed", "quadratic"])
def test_batch(kind, group, splits, dtype):
    """A batch of 3 requests with their own cache lengths and pages of one pool, one launch: every request's
    output equals the reference run on that request alone, and its anchors land in its own pages at its own
    slots only."""
    lay, q, k, v, caches = batch_inputs(kind, group, dtype)
    check_paged(lay, q, k, v, caches, BATCH_LENS, dtype, block_n=16, num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_with_a_see_row_per_request(dtype):
    """The prefill of prompts of several lengths in one call: `see` [B, R], a row per request (a request's mask
    rows see its own prompt, the shorter prompts padded after their end). One launch equals the reference run
    on each request alone with its own row of `see`; its anchors land in its own cache."""
    model = SimpleNamespace(device=DEVICE, cfg=SimpleNamespace(mask_token_id=0))
    sched = schedules()["packed"](model, 3, False, TorchEpilogue(DEVICE, 3, False))
    prompts = [torch.zeros(n, dtype=torch.int64) for n in (7, 2, 5)]
    lay = sched.prefill(*prompts).inputs(None).layout
    assert lay.see.shape == (3, lay.rows)
    gen = torch.Generator(device="cpu").manual_seed(7)
    q, k, v = (torch.randn(3, lay.rows, h, 16, generator=gen).to(DEVICE, dtype) for h in (4, 2, 2))
    caches = [torch.randn(3, 2, CAPACITY, 16, generator=gen).to(DEVICE, dtype) for _ in range(2)]
    check_paged(lay, q, k, v, caches, [0, 0, 0], dtype, see_rows=True)


def test_anchors_past_the_table_go_to_the_null_block():
    """An anchor whose slot lies past a request's table writes nothing that request or another can see: the
    reference puts it in the null page, the kernel drops it; both leave every other block as it was."""
    lay = engine_layout("packed", 3)
    gen = torch.Generator(device="cpu").manual_seed(3)
    q, k, v = (torch.randn(1, lay.rows, h, 16, generator=gen).to(DEVICE) for h in (4, 2, 2))
    k_pool, v_pool = (torch.randn(5, 4, 2, 16, generator=gen).to(DEVICE) for _ in range(2))
    table = torch.tensor([[3, 1]], device=DEVICE)                  # 8 slots; the anchors start at slot 6
    length = torch.tensor([6], device=DEVICE)
    for attend in (packed_attention_ref, packed_attention):
        kp, vp = k_pool.clone(), v_pool.clone()
        attend(q, k, v, kp, vp, table, length, lay, 0.25)
        torch.testing.assert_close(kp[[2, 4]], k_pool[[2, 4]], rtol=0, atol=0)   # no table names them
        torch.testing.assert_close(kp[1, 2:], k[0, :2], rtol=0, atol=0)          # slots 6, 7: the first two
        torch.testing.assert_close(kp[3], k_pool[3], rtol=0, atol=0)             # slots 0..3: before cache_len


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_batched_reference(kind, group):
    """The batched torch reference (vectorised over the batch, one shuffled pool) equals the reference run on
    each request alone over its own contiguous cache (an identity table) (CPU, fp32)."""
    cpu = torch.device("cpu")
    lay, q, k, v, caches = batch_inputs(kind, group, torch.float32, cpu, poison=False)
    scale = q.shape[-1] ** -0.5
    (k_pool, table), (v_pool, _) = (paged(c, 16, torch.Generator().manual_seed(5)) for c in caches)
    length = torch.tensor(BATCH_LENS)
    out = packed_attention_ref(q, k, v, k_pool, v_pool, table, length, lay, scale)
    assert out.shape == q.shape
    for b in range(len(BATCH_LENS)):
        n = CAPACITY // 16
        identity = torch.arange(1, n + 1)[None]
        k_own, v_own = (torch.cat([torch.zeros(1, 16, *c.shape[1::2]), c[b].transpose(0, 1).reshape(n, 16, *c.shape[1::2])])
                        for c in caches)
        want = packed_attention_ref(q[b:b + 1], k[b:b + 1], v[b:b + 1], k_own, v_own, identity, length[b:b + 1], lay,
                                    scale)
        torch.testing.assert_close(out[b:b + 1], want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gather_positions(k_pool, table[b:b + 1]), gather_positions(k_own, identity), rtol=0, atol=0)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_the_reference_reads_only_the_pages_its_rows_see(kind, monkeypatch):
    """On the CPU, eagerly, the torch reference reads a page table no further than its furthest visible position
    (model.attention.pages_seen): NaN in every page past it changes nothing, and its output equals the device
    path's (which reads the whole table) over the same pools with those pages zero, to float32 rounding (the
    scratch rows' keys follow the cache's, at another offset)."""
    cpu = torch.device("cpu")
    lay, q, k, v, caches = batch_inputs(kind, 1, torch.float32, cpu, poison=False)
    scale, page = q.shape[-1] ** -0.5, 16
    (k_pool, table), (v_pool, _) = (paged(c, page, torch.Generator().manual_seed(5)) for c in caches)
    length = torch.tensor(BATCH_LENS)
    seen = int((length[:, None] + lay.see + 1).max())
    assert seen < table.shape[1] * page - page, "the table must reach past the positions the rows see"
    unseen = table[:, -(-seen // page):].flatten()
    poisoned = [pool.clone().index_fill_(0, unseen, float("nan")) for pool in (k_pool, v_pool)]
    zero = [pool.clone().index_fill_(0, unseen, 0.0) for pool in (k_pool, v_pool)]
    out = packed_attention_ref(q, k, v, *poisoned, table, length, lay, scale)
    assert out.isfinite().all()
    with monkeypatch.context() as m:
        m.setattr(host, "reads_are_free", lambda t: False)
        whole = packed_attention_ref(q, k, v, *zero, table, length, lay, scale)
        assert packed_attention_ref(q, k, v, *poisoned, table, length, lay, scale).isnan().any()
    torch.testing.assert_close(out, whole, rtol=1e-6, atol=1e-6)


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
              dict(Q=p, K=p, V=p, KC=p, VC=p, Table="*i64", Out=p, OPart="*fp32", MPart="*fp32", LPart="*fp32",
                   cache_len_ptr="*i64", seg_ptr="*i64", see_ptr="*i64", R="i32", n_anchor="i32", HKV="i32",
                   scale_log2="fp32", s_cl="i32", s_see="i32", n_table="i32", s_tb="i32",
                   **i32("s_qb s_qr s_qh s_kb s_kr s_kh s_vb s_vr s_vh "
                         "s_kcn s_kcs s_kch s_vcn s_vcs s_vch s_ob s_or s_oh")),
              dict(G=g, D=d, BLOCK_D=d, BLOCK_M=bm, BLOCK_N=64, PAGE_SIZE=16, NUM_SPLITS=splits, PREC=prec),
              num_warps=4)
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
