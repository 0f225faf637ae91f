// Top-p on the CPU (packed_ss/decode/sampling.py `kept`, rows without top-k): the smallest probability a row
// keeps, without sorting the row.
//
// The rule, over the row sorted in descending order v_0 >= v_1 >= ...: token i is kept while the mass ranked
// before it, before_i = cumsum(v)_i - v_i, is below p; the cut is the last kept v_i, and every token at least
// as probable as the cut is kept (ties too). torch's CPU cumsum accumulates a float row in double and rounds
// each partial sum to the row's type; the scan below does the same, so the cut is the reference's bit for bit.
//
// Only the head of the sorted row is needed, up to the first token not kept. A histogram of the row's mass by
// the leading bits of each probability (its float bit pattern: exponent and kMantissaBits of mantissa; monotone
// in the value) says which values the head reaches down to. The bins that the scan would keep whole are passed
// by their mass (float rows); the bin where the cut falls is gathered and sorted, and the scan runs over it;
// where it keeps all of it, the next bin follows, down to the whole row. Each gathered bin's values are below
// every earlier one's, so the concatenated sorts are the sort of the row's head. One pass over the row for the
// histogram, one per gather (mostly one), and a sort of the cut's bin, not of the nucleus: the flat rows of a
// diffusion draft at T = 0.7 keep thousands of tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "noise.h"

namespace pss {

constexpr int kMantissaBits = 3;                       // of the bins' keys: 8 bins per power of two
constexpr int kBinShift = 23 - kMantissaBits;          // float: 23 mantissa bits
constexpr int64_t kBins = int64_t{1} << (31 - kBinShift);  // non-negative floats: the sign bit is 0

template <typename T>
inline int64_t nucleus_bin(T value) {
  const float f = static_cast<float>(value);           // rounding to float is monotone: so is the key
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<int64_t>((bits & 0x7fffffffu) >> kBinShift);   // -0.0 in bin 0: never out of range
}

// The smallest float of bin `bin` (its key's bits with the mantissa bits below the key at 0).
inline float nucleus_bin_floor(int64_t bin) {
  const uint32_t bits = static_cast<uint32_t>(bin) << kBinShift;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A float bin whose values are all at least 2^-29 has entries that are multiples of 2^-52: while their sums stay
// below 2, a double holds every partial sum exactly, in any order. Such a bin's mass is the sorted scan's, bit
// for bit, and the scan needs no sort to pass it.
constexpr float kExactFloor = 1.0f / (1 << 29);

// The cut of one row (vocab entries, non-negative) for top-p p < 1 (infinite where nothing is kept, as the
// reference's minimum over no token). The bins are taken from the top. Along the sorted scan, before_i is
// non-decreasing (the rounded sum grows, v_i shrinks, and a float subtraction is monotone in each argument), so a
// bin is kept whole where its last token passes; for a float bin of exact sums (kExactFloor) that token's before
// is at most round(acc + mass) - floor(bin), so where that is below p the bin is passed by its mass alone. The
// other bins are gathered (one pass over the row, down to the bin whose mass reaches p), sorted, and scanned
// token by token; the pass also finds the least entry of the bin passed last, the cut where the scan stops at
// once. Bin 0 is never passed, so the scan ends on a gathered bin.
template <typename T>
T nucleus_cut(const T* row, int64_t vocab, T p, std::vector<double>& mass, std::vector<T>& head) {
  mass.assign(kBins, 0.0);
  int64_t top = 0;
  for (int64_t x = 0; x < vocab; ++x) {
    const int64_t b = nucleus_bin(row[x]);
    mass[b] += static_cast<double>(row[x]);
    top = std::max(top, b);
  }
  double acc = 0.0;
  T last = std::numeric_limits<T>::infinity();
  int64_t passed = -1;                  // the bin passed by its mass last, while `last` is not yet its least entry
  for (int64_t bin = top; bin >= 0; --bin) {
    if (bin > 0 && mass[bin] == 0.0) continue;
    const double total = acc + mass[bin];
    const T floor = static_cast<T>(nucleus_bin_floor(bin));
    if (std::is_same<T, float>::value && floor >= kExactFloor && total < 2.0 &&
        static_cast<T>(static_cast<T>(total) - floor) < p) {
      acc = total;
      passed = bin;
      continue;
    }
    int64_t low = bin;                  // gathered with the bins below it that the head reaches before p
    for (double reach = total; low > 0 && reach < static_cast<double>(p);) reach += mass[--low];
    head.clear();
    for (int64_t x = 0; x < vocab; ++x) {
      const int64_t b = nucleus_bin(row[x]);
      if (b >= low && b <= bin)
        head.push_back(row[x]);
      else if (b == passed)
        last = std::min(last, row[x]);
    }
    bin = low;
    passed = -1;
    std::sort(head.begin(), head.end(), std::greater<T>());
    for (const T v : head) {
      acc += static_cast<double>(v);
      const T before = static_cast<T>(acc) - v;
      if (!(before < p)) return last;
      last = v;
    }
  }
  return last;      // every token kept
}

// cut[r] for rows begin <= r < end of prob [n_rows, vocab] with top-p p[r * n_p / n_rows] (n_p settings, each
// for n_rows / n_p consecutive rows: a request's); 0 (every token) where that is at least 1. Where `truncated` is
// given, row r of it [n_rows, vocab] is also written: prob's entries at least cut[r], zero elsewhere (the bits of
// sampling.py's prob * kept(...): v * 1 = v, v * 0 = +0 for the non-negative v).
template <typename T>
void nucleus_rows(const T* prob, const double* p, int64_t n_p, int64_t n_rows, int64_t begin, int64_t end,
                  int64_t vocab, T* cut, T* truncated) {
  std::vector<double> mass;
  std::vector<T> head;
  for (int64_t r = begin; r < end; ++r) {
    const T* row = prob + r * vocab;
    const T top_p = static_cast<T>(p[r * n_p / n_rows]);
    cut[r] = top_p < T(1) ? nucleus_cut(row, vocab, top_p, mass, head) : T(0);
    if (truncated == nullptr) continue;
    T* out = truncated + r * vocab;
    const T least = cut[r];
    for (int64_t x = 0; x < vocab; ++x) out[x] = row[x] >= least ? row[x] : T(0);
  }
}

// A thread of the cut takes at least this many entries: it does more per entry than a draw (two passes, a bin's
// add), so it splits sooner. The 8 rows of a `packed` W = 3 call at T = 0.7 / top-p 0.95 (4,096 tokens) take
// 63-65 us on one thread, 38-46 on two (AMD EPYC).
constexpr int64_t kCutEntriesPerThread = 1 << 13;

// nucleus_rows over every row, in contiguous parts on up to `threads` of OpenMP's threads (torch's, as
// sample_cpu's) where the rows hold enough entries to pay for them. Rows are independent.
template <typename T>
void nucleus_cpu(const T* prob, const double* p, int64_t n_p, int64_t n_rows, int64_t vocab, T* cut,
                 T* truncated, int64_t threads) {
  const int64_t parts = imax(1, imin(imin(threads, n_rows), n_rows * vocab / kCutEntriesPerThread));
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int64_t t = 0; t < parts; ++t)
    nucleus_rows(prob, p, n_p, n_rows, n_rows * t / parts, n_rows * (t + 1) / parts, vocab, cut, truncated);
}

}  // namespace pss
