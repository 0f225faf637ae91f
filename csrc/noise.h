// Shared-noise sampling (packed_ss/decode/shared_noise.py), both couplings. The exponential race (Gumbel-max):
// a row's sample is the token x of largest p(x) / E(seed, position, x), E = -log(u) standard exponential noise,
// with the uniform u of packed_ss.decode.sampling.exponential_noise bit for bit: token x takes words 2 (x % 2),
// 2 (x % 2) + 1 of the Philox4x32-10 block at counter (x / 2, position lo, position hi, kNoiseStream), key
// (seed lo, seed hi), 53 bits in (0, 1). The inverse CDF: the token where the cumulative p in token order first
// exceeds u times its total, u = philox_uniform(seed, position, 0), with Serial::inverse_cdf's arithmetic (the
// rejection rule's AR draw). Rows are independent: the CPU loop below runs them in parts on a few threads
// (OpenMP), the CUDA kernel (noise.cu) the race, one thread block per row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "epilogue.h"

namespace pss {

constexpr uint32_t kNoiseStream = 1u;  // sampling.NOISE_STREAM: apart from the rejection rule's uniforms

// The uniform of two Philox words: 27 bits of the first and 26 of the second, (n + 1/2) 2^-53 in (0, 1). n is
// below 2^53, so it is exact through int64 (which vectorises where uint64 to double does not).
PSS_HD double uniform53(uint32_t hi, uint32_t lo) {
  const int64_t n = static_cast<int64_t>((static_cast<uint64_t>(hi >> 5) << 26) + (lo >> 6));
  return (static_cast<double>(n) + 0.5) * (1.0 / 9007199254740992.0);
}

// u of token x in the row keyed by (seed, position).
PSS_HD double noise_uniform(int64_t seed, int64_t position, int64_t x) {
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(position);
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(x >> 1), static_cast<uint32_t>(o),
                                  static_cast<uint32_t>(o >> 32), kNoiseStream, static_cast<uint32_t>(s),
                                  static_cast<uint32_t>(s >> 32));
  const int w = static_cast<int>(x & 1) * 2;
  return uniform53(r.v[w], r.v[w + 1]);
}

// The race over entries begin, begin + step, ... < end of one row: the first entry j with the largest
// p_j / E(seed, position, token_j), token_j = idx[j] (j when idx is null: dense), starting from `*best`
// (updated). An entry that cannot win is skipped before its logarithm: p / E <= p / (1 - u), since
// -log u >= 1 - u (with a margin for the bound's rounding). Returns the entry (-1 when every p is 0).
template <typename T>
PSS_HD int64_t race_entry(int64_t seed, int64_t position, const T* prob, const int64_t* idx, int64_t begin,
                          int64_t end, int64_t step, double* best) {
  int64_t won = -1;
  for (int64_t j = begin; j < end; j += step) {
    const double p = static_cast<double>(prob[j]);
    if (!(p > 0.0)) continue;
    const double u = noise_uniform(seed, position, idx ? idx[j] : j);
    if (won >= 0 && p / (1.0 - u) * (1.0 + 1e-12) <= *best) continue;
    const double score = p / -log(u);
    if (won < 0 || score > *best) {
      *best = score;
      won = j;
    }
  }
  return won;
}

#if !defined(__CUDACC__)  // the CPU race: host code of module.cpp alone

// Functions the compiler also builds for AVX-512 (x86-64-v4), the build picked when the module loads: the
// Philox rounds then run on 8 pairs of tokens at once.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PSS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define PSS_CPU_CLONES
#endif

// u[j] = noise_uniform(seed, position, 2 first_pair + j) for j < 2 pairs, bit for bit: one Philox block per
// pair of tokens, in a loop over pairs the compiler vectorises.
PSS_CPU_CLONES static void noise_uniforms(int64_t seed, int64_t position, int64_t first_pair, int64_t pairs,
                                          double* u) {
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(position);
  const uint32_t c1 = static_cast<uint32_t>(o), c2 = static_cast<uint32_t>(o >> 32);
  const uint32_t k0 = static_cast<uint32_t>(s), k1 = static_cast<uint32_t>(s >> 32);
  for (int64_t p = 0; p < pairs; ++p) {
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(first_pair + p), c1, c2, kNoiseStream, k0, k1);
    u[2 * p] = uniform53(r.v[0], r.v[1]);
    u[2 * p + 1] = uniform53(r.v[2], r.v[3]);
  }
}

// The race of a dense row on the CPU: the same decisions as race_entry, the uniforms made first, a chunk at a
// time (noise_uniforms). A chunk whose every p is 0 (tokens that top-k or top-p removed) takes no part, so its
// uniforms are not made.
template <typename T>
int64_t race_dense_cpu(int64_t seed, int64_t position, const T* prob, int64_t k) {
  constexpr int64_t kChunk = 512;
  double u[kChunk];
  int64_t won = -1;
  double best = 0.0;
  for (int64_t c = 0; c < k; c += kChunk) {
    const int64_t n = imin(kChunk, k - c);
    bool drawn = false;
    for (int64_t i = 0; i < n; ++i) drawn |= prob[c + i] > T(0);
    if (!drawn) continue;
    noise_uniforms(seed, position, c / 2, (n + 1) / 2, u);
    for (int64_t i = 0; i < n; ++i) {
      const double p = static_cast<double>(prob[c + i]);
      if (!(p > 0.0)) continue;
      if (won >= 0 && p / (1.0 - u[i]) * (1.0 + 1e-12) <= best) continue;
      const double score = p / -log(u[i]);
      if (won < 0 || score > best) {
        best = score;
        won = c + i;
      }
    }
  }
  return won;
}

// The sum of w[0..n) in double, on 8 lanes (which the compiler vectorises where one serial sum cannot).
template <typename T>
double lane_sum(const T* w, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(w[i + l]);
  double sum = 0.0;
  for (; i < n; ++i) sum += static_cast<double>(w[i]);
  for (int l = 0; l < 8; ++l) sum += lane[l];
  return sum;
}

// The inverse-CDF entry of a dense row w[0..n) for u: Serial::inverse_cdf's draw (the prefix sums in double, each
// rounded to T, the first above T(u) * total; clamped to the last positive entry), found a chunk at a time: a
// chunk whose sum leaves the prefix at or below the target is passed whole, and the chunk that crosses it is
// summed serially. The sums in lanes may differ from the serial ones in their last bits, so a prefix within a
// rounding of the target may fall on the other side.
template <typename T>
int64_t cdf_dense_cpu(double u, const T* w, int64_t n) {
  constexpr int64_t kChunk = 1024;
  const T target = static_cast<T>(u) * static_cast<T>(lane_sum(w, n));
  double prefix = 0.0;
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t m = imin(kChunk, n - c);
    const double chunk = lane_sum(w + c, m);
    if (!(static_cast<T>(prefix + chunk) > target)) {
      prefix += chunk;
      continue;
    }
    for (int64_t i = c; i < c + m; ++i) {
      prefix += static_cast<double>(w[i]);
      if (static_cast<T>(prefix) > target) return i;
    }
  }
  for (int64_t i = n - 1; i > 0; --i)
    if (w[i] > T(0)) return i;
  return 0;
}

// The inverse-CDF entry of a sparse row (prob, idx)[0..k) for u: its entries in token order, then
// Serial::inverse_cdf (the draw of the row made dense).
template <typename T>
int64_t cdf_sparse_cpu(double u, const T* prob, const int64_t* idx, int64_t k) {
  std::vector<int64_t> order(k);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [idx](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  std::vector<T> w(k);
  for (int64_t j = 0; j < k; ++j) w[j] = prob[order[j]];
  return order[Serial::inverse_cdf(w.data(), k, u, static_cast<bool*>(nullptr))];
}

enum class Coupling { kRace, kInverseCdf };

// tokens[r] = the shared-noise sample of row r (prob [n_rows, k], idx [n_rows, k] or null), keyed by
// (seed[r / rows_per_seed], position[r]), for rows begin <= r < end.
template <typename T>
void sample_rows_cpu(Coupling coupling, const int64_t* seed, const int64_t* position, int64_t begin, int64_t end,
                     int64_t rows_per_seed, const T* prob, const int64_t* idx, int64_t k, int64_t* tokens) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t key = seed[r / rows_per_seed];
    const T* row = prob + r * k;
    const int64_t* row_idx = idx ? idx + r * k : nullptr;
    int64_t j;
    if (coupling == Coupling::kInverseCdf) {
      const double u = philox_uniform(key, position[r], 0);
      j = row_idx ? cdf_sparse_cpu(u, row, row_idx, k) : cdf_dense_cpu(u, row, k);
    } else {
      double best = 0.0;
      j = row_idx ? race_entry(key, position[r], row, row_idx, 0, k, 1, &best) : race_dense_cpu(key, position[r], row, k);
      j = j < 0 ? 0 : j;
    }
    tokens[r] = row_idx ? row_idx[j] : j;
  }
}

constexpr int64_t kEntriesPerThread = 1 << 16;  // a thread of the CPU draw takes at least this many entries

// sample_rows_cpu over every row, split into contiguous parts on up to `threads` threads (the caller's, torch's
// intra-op count) when the rows hold enough entries to pay for them. The parts run on OpenMP's threads: the
// module links libgomp.so.1, which resolves to the copy torch loaded, so the draw reuses torch's intra-op
// threads rather than racing them for the cores (threads of its own ran 2.7x as long as alone, between torch
// ops). Rows are independent: the same tokens whatever the split.
template <typename T>
void sample_cpu(Coupling coupling, const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed,
                const T* prob, const int64_t* idx, int64_t k, int64_t* tokens, int64_t threads) {
  const int64_t parts = imax(1, imin(imin(threads, n_rows), n_rows * k / kEntriesPerThread));
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int64_t t = 0; t < parts; ++t)
    sample_rows_cpu(coupling, seed, position, n_rows * t / parts, n_rows * (t + 1) / parts, rows_per_seed, prob, idx,
                    k, tokens);
}

#endif  // !defined(__CUDACC__)

}  // namespace pss
