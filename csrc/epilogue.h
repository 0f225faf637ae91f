// The step epilogue of packed-ss: acceptance, residual / bonus sampling, emit, retain.
//
// One call covers a whole batch of `batch` requests, each stepped exactly as if it were alone: the
// per-sequence math below sees one request (`at(st, b)` / `at(s, b)` offset every pointer to request b).
// One request's step ends with: verify the stored draft against the verifier rows (greedy matching, or
// rejection sampling against the STORED proposal distribution Q), draw the correction (normalised
// max(p - Q, 0)) or the bonus (p) by inverse CDF, append the accepted tokens with the stop rules
// (stop token, length cap), advance the cache length, and retain the proposal suffix with its Q as the
// next draft. The torch reference is packed_ss/acceptance.py, state.py (emit, retain), sampling.py
// (Philox uniforms, inverse_cdf) and schedules/*.py; this file reproduces it bit for bit on the CPU.
//
// What the epilogue consumes (the model's lm_head and the logits processing stay in torch):
//   greedy:  the argmax of every verifier row and every proposal row (int64 [batch, rows]);
//   sampled: the truncated distributions of those rows exactly as sampling.truncated_probs returns
//            them: sparse (idx [batch, rows, K] int64, prob [batch, rows, K] float32/float64), sorted by
//            decreasing probability under top-k / top-p; without truncation dense (`Step::dense`: prob
//            [batch, rows, vocab], idx is the token id and is not passed). The verifier's p is densified
//            internally, one row at a time, into a [batch, vocab] workspace (a row per request) only where
//            a residual or bonus is drawn.
// Within a request the rows are contiguous; from one request to the next they advance by a row stride
// (Step::v_stride / z_stride, in rows), so they may be a slice along dim 1 of a bigger [batch, R_total, K].
// A null index pointer below always means "dense": entry j is token j.
// What it produces: the updated DecodeState (out, n_out, cache_len, last, done, draft, draft_len,
// q_idx, q_prob, nfe, n_verify, n_accepted, n_bonus, offset) and `res` [batch, B + 2] (B = W + 1, the
// block): per request the emitted tokens, A (n_accept) and the retain shift.
//
// Everything is written once, as templates over an executor X: `Serial` (here) runs the requests one
// after the other on one CPU thread; the CUDA build (epilogue.cu) runs the same functions in one thread
// block per request (gridDim.x = batch), every thread taking the same scalar decisions, with
// block-cooperative versions of the vector parts (lookups, the inverse-CDF scan, densifying a row).
// Only the executor's leader writes state.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PSS_HD __host__ __device__ inline
#else
#define PSS_HD inline
#endif

namespace pss {

PSS_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
PSS_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// ---- Philox4x32-10, keyed like sampling.philox_uniform ------------------------------------------------
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

struct Philox4 {
  uint32_t v[4];
};

PSS_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// u[i] of philox_uniform(seed, offset, n) for any n > i: counter (i / 4, offset lo, offset hi, 0),
// key (seed lo, seed hi), word i % 4, top 24 bits scaled to [0, 1).
PSS_HD double philox_uniform(int64_t seed, int64_t offset, int64_t i) {
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(i >> 2), static_cast<uint32_t>(o),
                                  static_cast<uint32_t>(o >> 32), 0u, static_cast<uint32_t>(s),
                                  static_cast<uint32_t>(s >> 32));
  return static_cast<double>(r.v[i & 3] >> 8) * (1.0 / 16777216.0);
}

// ---- the decoder state and one step's inputs, as raw pointers -----------------------------------------
// DecodeState (state.py), field for field, batch-major (a leading [batch] dimension, contiguous); all on
// one device. The shapes below are one request's; request b's row starts b rows further on.
struct State {
  int64_t* cache_len;
  int64_t* last;
  int64_t* draft;       // [width]
  int64_t* draft_len;
  int64_t* q_idx;       // [width, support] (not read or written when Step::dense)
  void* q_prob;         // [width, support], in the rows' probability dtype T (q_bytes = sizeof(T))
  int64_t* out;         // [out_len], out_len >= max_new + block
  int64_t* n_out;
  bool* done;
  const int64_t* seed;
  int64_t* offset;
  const int64_t* stop_ids;  // [n_stop]; entries < 0 never match (padding)
  const int64_t* max_new;
  int64_t* nfe;
  int64_t* n_verify;
  int64_t* n_accepted;
  int64_t* n_bonus;    // verifications that accepted a whole non-empty draft and appended the bonus
  int64_t width;     // W
  int64_t support;   // K of the stored Q rows (1 under greedy decoding: unused)
  int64_t n_stop;
  int64_t batch;     // the requests of one call
  int64_t out_len;   // out's row length (out.stride(0))
  int64_t q_bytes;   // bytes per q_prob entry: 4 (float32) or 8 (float64), the step's T
};

// q_prob as the step's probability type (Python checks that the two agree).
template <typename T>
PSS_HD T* q_prob_of(const State& st) { return static_cast<T*>(st.q_prob); }

// What the step verifies.
enum Verify : int32_t {
  kVerifyNone = 0,   // no verifier rows (Linear-SS drafting call)
  kVerifyOne = 1,    // one AR token from verifier row 0, A = 1 (ar steps, the prefill)
  kVerifyDraft = 2,  // the stored draft against B = W + 1 verifier rows (Alg. 1 lines 5-6 / Alg. 2 5-8)
};
// How the next draft is retained from the proposal rows: draft = z[shift .. shift + W - 1] (clamped).
constexpr int64_t kRetainNone = -2;     // keep the draft (ar, Linear-SS verification)
constexpr int64_t kRetainShiftA = -1;   // shift by the emitted count a (packed, prefill); >= 0: fixed shift
// Phases: verify writes res; commit reads it. Quadratic-SS selects its proposal branch in between.
constexpr int32_t kPhaseVerify = 1, kPhaseCommit = 2, kPhaseBoth = 3;

template <typename T>
struct Step {
  int32_t verify;
  int64_t retain;
  bool sampled;
  bool dense;           // sampled without truncation: every distribution (p, q, stored Q) is [vocab] dense
  int64_t block;        // B = W + 1; the proposal uniforms are u[B + j] (Schedule.propose)
  int64_t vocab;
  // verifier rows: greedy argmax [v_rows]; sampled truncated p, sparse [v_rows, v_k]. A draft verifies within
  // them: at most v_rows - 1 of its tokens (the callers' drafts fit; a longer one is cut)
  const int64_t* v_arg;
  const int64_t* v_idx;
  const T* v_prob;
  int64_t v_rows;
  int64_t v_k;
  // proposal rows: greedy argmax [n_z]; sampled truncated q, sparse [n_z, z_k] (z_k == State::support)
  const int64_t* z_arg;
  const int64_t* z_idx;
  const T* z_prob;
  int64_t z_k;
  int64_t n_z;
  T* scratch;           // [vocab] workspace for the dense residual / bonus row (sampled kVerifyDraft)
  int64_t* res;         // [B + 2]: emitted tokens [0, B), A at [B], the retain shift at [B + 1] (-1: none)
  const int64_t* residual_u;  // the correction / bonus draw's uniform index (any-order: u_t); null: W
  // From one request to the next (the shapes above are one request's): the verifier rows advance by
  // v_stride rows, the proposal rows by z_stride rows, scratch by vocab, res by B + 2, residual_u by 1.
  int64_t v_stride;
  int64_t z_stride;
};

// ---- one request of a batched call: every pointer offset to request b's row ---------------------------
template <typename P>
PSS_HD P* advance(P* p, int64_t n) { return p ? p + n : p; }   // null stays null (dense / absent rows)

PSS_HD State at(const State& st, int64_t b) {
  State r = st;
  const int64_t q = st.width * st.support;
  r.cache_len = advance(st.cache_len, b);
  r.last = advance(st.last, b);
  r.draft = advance(st.draft, b * st.width);
  r.draft_len = advance(st.draft_len, b);
  r.q_idx = advance(st.q_idx, b * q);
  r.q_prob = st.q_prob ? static_cast<void*>(static_cast<char*>(st.q_prob) + b * q * st.q_bytes) : nullptr;
  r.out = advance(st.out, b * st.out_len);
  r.n_out = advance(st.n_out, b);
  r.done = advance(st.done, b);
  r.seed = advance(st.seed, b);
  r.offset = advance(st.offset, b);
  r.stop_ids = advance(st.stop_ids, b * st.n_stop);
  r.max_new = advance(st.max_new, b);
  r.nfe = advance(st.nfe, b);
  r.n_verify = advance(st.n_verify, b);
  r.n_accepted = advance(st.n_accepted, b);
  r.n_bonus = advance(st.n_bonus, b);
  r.batch = 1;
  return r;
}

template <typename T>
PSS_HD Step<T> at(const Step<T>& s, int64_t b) {
  Step<T> r = s;
  r.v_arg = advance(s.v_arg, b * s.v_stride);
  r.v_idx = advance(s.v_idx, b * s.v_stride * s.v_k);
  r.v_prob = advance(s.v_prob, b * s.v_stride * s.v_k);
  r.z_arg = advance(s.z_arg, b * s.z_stride);
  r.z_idx = advance(s.z_idx, b * s.z_stride * s.z_k);
  r.z_prob = advance(s.z_prob, b * s.z_stride * s.z_k);
  r.scratch = advance(s.scratch, b * s.vocab);
  r.res = advance(s.res, b * (s.block + 2));
  r.residual_u = advance(s.residual_u, b);
  return r;
}

// ---- the serial executor (CPU build) ----------------------------------------------------------------
// Index drawn with probability proportional to w[0..n) by inverse CDF, as sampling.inverse_cdf computes
// it with torch on the CPU: the cumulative sum accumulates in double and rounds each prefix to T (torch's
// CPU cumsum), target = T(u) * total in T, the draw is the number of prefixes <= target, clamped to the
// last positive weight. `positive` tells whether the total is > 0.
struct Serial {
  static constexpr bool leader() { return true; }
  static void sync() {}

  template <typename P>
  static P lookup(const int64_t* idx, const P* prob, int64_t k, int64_t token) {
    if (!idx) return token >= 0 && token < k ? prob[token] : P(0);
    for (int64_t j = 0; j < k; ++j)
      if (idx[j] == token) return prob[j];
    return P(0);
  }

  template <typename T>
  static int64_t inverse_cdf(const T* w, int64_t n, double u, bool* positive) {
    double acc = 0.0;
    int64_t last_positive = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += static_cast<double>(w[i]);
      if (w[i] > T(0)) last_positive = i;
    }
    const T total = static_cast<T>(acc);
    const T target = static_cast<T>(u) * total;
    if (positive) *positive = total > T(0);
    acc = 0.0;
    int64_t j = n;
    for (int64_t i = 0; i < n; ++i) {
      acc += static_cast<double>(w[i]);
      if (static_cast<T>(acc) > target) {
        j = i;
        break;
      }
    }
    return imin(j, last_positive);
  }

  // scratch[0..vocab) = the dense row of a sparse distribution (sampling.densify)
  template <typename T>
  static void densify(T* scratch, int64_t vocab, const int64_t* idx, const T* prob, int64_t k) {
    for (int64_t x = 0; x < vocab; ++x) scratch[x] = idx ? T(0) : prob[x];
    if (idx)
      for (int64_t j = 0; j < k; ++j) scratch[idx[j]] = prob[j];
  }

  // scratch = max(scratch - Q, 0) for the stored sparse Q
  template <typename T>
  static void subtract_clamp(T* scratch, const int64_t* q_idx, const T* q_prob, int64_t k) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t x = q_idx ? q_idx[j] : j;
      const T r = scratch[x] - q_prob[j];
      scratch[x] = r > T(0) ? r : T(0);
    }
  }

  // next Q rows = proposal rows z[min(shift + i, n_z - 1)] (state.retain)
  template <typename T>
  static void retain_q(const State& st, const Step<T>& s, int64_t shift) {
    const int64_t k = st.support;
    for (int64_t i = 0; i < st.width; ++i) {
      const int64_t src = imin(shift + i, s.n_z - 1);
      for (int64_t j = 0; j < k; ++j) {
        if (!s.dense) st.q_idx[i * k + j] = s.z_idx[src * s.z_k + j];
        q_prob_of<T>(st)[i * k + j] = s.z_prob[src * s.z_k + j];
      }
    }
  }
};

// ---- the step ----------------------------------------------------------------------------------------
template <typename T, typename X>
PSS_HD int64_t sample_sparse(X& x, const int64_t* idx, const T* prob, int64_t k, double u) {
  const int64_t j = x.inverse_cdf(prob, k, u, static_cast<bool*>(nullptr));
  return idx ? idx[j] : j;
}

// Row r of a sparse [rows, k] index array, or null (dense) when there is none.
PSS_HD const int64_t* row_of(const int64_t* idx, int64_t r, int64_t k) { return idx ? idx + r * k : nullptr; }

PSS_HD bool is_stop(const State& st, int64_t token) {
  for (int64_t j = 0; j < st.n_stop; ++j)
    if (st.stop_ids[j] == token) return true;
  return false;
}

// Verification: res[0..n) = the emitted tokens C, res[B] = A = h + 1 (acceptance.py).
template <typename T, typename X>
PSS_HD void verify(const State& st, const Step<T>& s, X& x) {
  const int64_t b = s.block, w = st.width;
  const int64_t seed = *st.seed, offset = *st.offset;
  const int64_t draft_len = imin(*st.draft_len, s.v_rows - 1);
  if (s.verify == kVerifyOne || (s.sampled && s.verify == kVerifyDraft && draft_len == 0 && !s.residual_u)) {
    // Schedule.sample_token: argmax, or a draw from the truncated p with u[0]. A sampled empty draft's
    // verification is this AR step (the any-order steps, which name their residual uniform, excepted).
    const int64_t token = s.sampled ? sample_sparse(x, row_of(s.v_idx, 0, s.v_k), s.v_prob, s.v_k,
                                                    philox_uniform(seed, offset, 0))
                                    : s.v_arg[0];
    if (x.leader()) {
      for (int64_t i = 0; i < b; ++i) s.res[i] = token;
      s.res[b] = 1;
    }
    return;
  }
  if (s.verify != kVerifyDraft) return;
  int64_t h = 0;
  if (!s.sampled) {
    // verify_greedy: the leading draft tokens equal to the verifier argmax; emit the argmax rows (the last
    // repeated past v_rows)
    while (h < w && h < draft_len && st.draft[h] == s.v_arg[h]) ++h;
    if (x.leader()) {
      for (int64_t i = 0; i < b; ++i) s.res[i] = s.v_arg[imin(i, s.v_rows - 1)];
      s.res[b] = h + 1;
    }
    return;
  }
  // verify_sampled: accept d_i while u_i * Q_i(d_i) < p_i(d_i), in p's dtype, Q the stored distribution
  const int64_t* q_idx = s.dense ? nullptr : st.q_idx;
  const int64_t* v_idx = s.dense ? nullptr : s.v_idx;
  while (h < w && h < draft_len) {
    const int64_t d = st.draft[h];
    const T p_d = x.lookup(row_of(v_idx, h, s.v_k), s.v_prob + h * s.v_k, s.v_k, d);
    const T q_d = x.lookup(row_of(q_idx, h, st.support), q_prob_of<T>(st) + h * st.support, st.support, d);
    if (!(static_cast<T>(philox_uniform(seed, offset, h)) * q_d < p_d)) break;
    ++h;
  }
  // correction from max(p_h - Q_h, 0) after a rejection, bonus from p_h after full acceptance; p_h when the
  // residual has no mass (p == Q up to rounding)
  const double u_c = philox_uniform(seed, offset, s.residual_u ? *s.residual_u : w);
  x.densify(s.scratch, s.vocab, row_of(v_idx, h, s.v_k), s.v_prob + h * s.v_k, s.v_k);
  bool positive = true;
  int64_t c = 0;
  if (h < draft_len) {
    const int64_t hq = imin(h, w - 1);
    x.subtract_clamp(s.scratch, row_of(q_idx, hq, st.support), q_prob_of<T>(st) + hq * st.support, st.support);
    c = x.inverse_cdf(s.scratch, s.vocab, u_c, &positive);
    if (!positive) x.densify(s.scratch, s.vocab, row_of(v_idx, h, s.v_k), s.v_prob + h * s.v_k, s.v_k);
  }
  if (h >= draft_len || !positive) c = x.inverse_cdf(s.scratch, s.vocab, u_c, static_cast<bool*>(nullptr));
  if (x.leader()) {
    for (int64_t i = 0; i < b; ++i) s.res[i] = i < h ? st.draft[i] : c;
    s.res[b] = h + 1;
  }
}

// Commit: emit with the stop rules (state.emit), the counters (Schedule.commit), retain (state.retain),
// and the RNG offset (one per sampled call). Everything but the offset is masked by `active`, the state
// before this step, as DecodeState.assign does.
template <typename T, typename X>
PSS_HD void commit(const State& st, const Step<T>& s, X& x) {
  const int64_t b = s.block, w = st.width;
  const bool active = !*st.done;
  const int64_t n_out = *st.n_out, max_new = *st.max_new, draft_len = *st.draft_len;
  const int64_t seed = *st.seed, offset = *st.offset;
  const int64_t n = s.verify == kVerifyDraft ? b : (s.verify == kVerifyOne ? 1 : 0);
  int64_t a = 0, first_stop = n + 1;
  if (n > 0) {
    const int64_t n_accept = s.res[b];
    for (int64_t i = 0; i < n && i < n_accept; ++i) {
      if (is_stop(st, s.res[i])) {
        first_stop = i + 1;
        break;
      }
    }
    a = active ? imin(imin(n_accept, max_new - n_out), first_stop) : 0;
  }
  x.sync();  // every thread has read the state it needs before the leader writes it
  if (x.leader() && active) {
    if (n > 0) {
      for (int64_t i = 0; i < n; ++i) st.out[n_out + i] = s.res[i];
      *st.n_out = n_out + a;
      *st.cache_len += a;
      *st.last = s.res[imax(a - 1, 0)];
      *st.done = (n_out + a >= max_new) || (first_stop <= a);
    }
    *st.nfe += 1;
    if (s.verify == kVerifyDraft) {
      const int64_t n_accept = s.res[b];
      *st.n_verify += 1;
      *st.n_accepted += imax(a - 1, 0);
      *st.n_bonus += (n_accept == draft_len + 1 && draft_len > 0 && a == n_accept) ? 1 : 0;
    }
  }
  int64_t q_shift = -1;
  if (s.retain != kRetainNone && active) {
    // next draft = z[shift:], each slot past the proposals repeating the last one (state.retain)
    const int64_t shift = s.retain == kRetainShiftA ? a : s.retain;
    const int64_t last_row = s.n_z - 1;
    for (int64_t r = imin(shift, last_row); r <= imin(shift + w - 1, last_row); ++r) {
      const int64_t token = s.sampled ? sample_sparse(x, row_of(s.dense ? nullptr : s.z_idx, r, s.z_k),
                                                      s.z_prob + r * s.z_k, s.z_k,
                                                      philox_uniform(seed, offset, b + r))
                                      : s.z_arg[r];
      if (x.leader())
        for (int64_t i = 0; i < w; ++i)
          if (imin(shift + i, last_row) == r) st.draft[i] = token;
    }
    if (x.leader()) *st.draft_len = imax(imin(s.n_z - shift, w), 0);
    if (s.sampled) q_shift = shift;
  }
  if (x.leader()) {
    s.res[b + 1] = q_shift;
    if (s.sampled) *st.offset = offset + 1;
  }
  if (q_shift >= 0) x.retain_q(st, s, q_shift);
}

// One call of the epilogue on one sequence (st and s already offset to it by at()).
template <typename T, typename X>
PSS_HD void run(const State& st, const Step<T>& s, int32_t phase, X& x) {
  if (phase & kPhaseVerify) verify(st, s, x);
  x.sync();
  if (phase & kPhaseCommit) commit(st, s, x);
}

// One call on the whole batch, serially (the CPU build): request b, then b + 1, ...
template <typename T>
inline void run_serial(const State& st, const Step<T>& s, int32_t phase) {
  Serial x;
  for (int64_t b = 0; b < st.batch; ++b) run(at(st, b), at(s, b), phase, x);
}

}  // namespace pss
