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
// in the value) says which values the head reaches down to: the bins from the top until they hold p of the
// mass. Those bins' tokens are gathered and sorted, and the scan runs over them; where it keeps all of them (the
// mass before the last one is still below p), the next bin is gathered, down to the whole row. Each gathered
// bin's values are below every earlier one's, so the concatenated sorts are the sort of the row's head. One
// pass over the row for the histogram, one per gather (mostly one or two), and a sort of the nucleus, not of
// the row: on the 4M model's 4,096 tokens at T = 0.7 the nucleus holds a median of 122.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
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

// The cut of one row (vocab entries, non-negative) for top-p p < 1 (infinite where nothing is kept, as the
// reference's minimum over no token).
template <typename T>
T nucleus_cut(const T* row, int64_t vocab, T p, std::vector<double>& mass, std::vector<T>& head) {
  mass.assign(kBins, 0.0);
  for (int64_t x = 0; x < vocab; ++x) mass[nucleus_bin(row[x])] += static_cast<double>(row[x]);
  head.clear();
  double acc = 0.0, binned = 0.0;
  int64_t scanned = 0, low = kBins;     // the bins >= low are in head, sorted up to `scanned`
  T last = std::numeric_limits<T>::infinity();
  for (int64_t bin = kBins - 1; bin >= 0; --bin) {
    binned += mass[bin];
    if (bin > 0 && (mass[bin] == 0.0 || (low == kBins && binned < static_cast<double>(p)))) continue;
    for (int64_t x = 0; x < vocab; ++x) {
      const int64_t b = nucleus_bin(row[x]);
      if (b >= bin && b < low) head.push_back(row[x]);
    }
    low = bin;
    std::sort(head.begin() + scanned, head.end(), std::greater<T>());
    for (; scanned < static_cast<int64_t>(head.size()); ++scanned) {
      const T v = head[scanned];
      acc += static_cast<double>(v);
      const T before = static_cast<T>(acc) - v;
      if (!(before < p)) return last;
      last = v;
    }
  }
  return last;      // every token kept
}

// cut[r] for rows begin <= r < end of prob [n_rows, vocab] with top-p p[r]; 0 (every token) where p[r] >= 1.
template <typename T>
void nucleus_rows(const T* prob, const T* p, int64_t begin, int64_t end, int64_t vocab, T* cut) {
  std::vector<double> mass;
  std::vector<T> head;
  for (int64_t r = begin; r < end; ++r)
    cut[r] = p[r] < T(1) ? nucleus_cut(prob + r * vocab, vocab, p[r], mass, head) : T(0);
}

// A thread of the cut takes at least this many entries: it does more per entry than a draw (two passes, a bin's
// add), so it splits sooner. 8 rows of 4,096 took 80 us on one thread, 48-60 on two (AMD EPYC).
constexpr int64_t kCutEntriesPerThread = 1 << 13;

// nucleus_rows over every row, in contiguous parts on up to `threads` of OpenMP's threads (torch's, as
// sample_cpu's) where the rows hold enough entries to pay for them. Rows are independent.
template <typename T>
void nucleus_cpu(const T* prob, const T* p, int64_t n_rows, int64_t vocab, T* cut, int64_t threads) {
  const int64_t parts = imax(1, imin(imin(threads, n_rows), n_rows * vocab / kCutEntriesPerThread));
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int64_t t = 0; t < parts; ++t)
    nucleus_rows(prob, p, n_rows * t / parts, n_rows * (t + 1) / parts, vocab, cut);
}

}  // namespace pss
