// Shared-noise sampling on CUDA (noise.h): the race of every row, one thread block per row. Asynchronous on
// the caller's stream, no allocation: capturable.
#include <cuda_runtime.h>

#include <cstdio>

#include "noise.h"
#include "noise_cuda.h"

namespace pss {
namespace {

constexpr int kRaceThreads = 256;

// One block per row: each thread races entries tid, tid + 256, ...; the block keeps the largest score, the
// first entry among equal ones (as the serial race does).
template <typename T>
__global__ void __launch_bounds__(kRaceThreads) race_kernel(const int64_t* seed, const int64_t* position,
                                                            int64_t rows_per_seed, const T* prob, const int64_t* idx,
                                                            int64_t k, int64_t* tokens) {
  __shared__ double best_score[kRaceThreads];
  __shared__ int64_t best_entry[kRaceThreads];
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t* row_idx = idx ? idx + r * k : nullptr;
  double best = 0.0;
  best_entry[tid] = race_entry(seed[r / rows_per_seed], position[r], prob + r * k, row_idx, tid, k, kRaceThreads, &best);
  best_score[tid] = best;
  __syncthreads();
  for (int half = kRaceThreads / 2; half > 0; half >>= 1) {
    if (tid < half) {
      const int64_t a = best_entry[tid], b = best_entry[tid + half];
      const double sa = best_score[tid], sb = best_score[tid + half];
      if (b >= 0 && (a < 0 || sb > sa || (sb == sa && b < a))) {
        best_entry[tid] = b;
        best_score[tid] = sb;
      }
    }
    __syncthreads();
  }
  if (tid == 0) {
    const int64_t e = best_entry[0] < 0 ? 0 : best_entry[0];
    tokens[r] = row_idx ? row_idx[e] : e;
  }
}

int report(cudaError_t e, char* err, size_t err_len) {
  if (e == cudaSuccess) return 0;
  if (err && err_len) snprintf(err, err_len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  return static_cast<int>(e);
}

template <typename T>
int race(const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed, const T* prob,
         const int64_t* idx, int64_t k, int64_t* tokens, void* stream, char* err, size_t err_len) {
  if (n_rows < 1) return 0;
  race_kernel<T><<<static_cast<unsigned>(n_rows), kRaceThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      seed, position, rows_per_seed, prob, idx, k, tokens);
  return report(cudaGetLastError(), err, err_len);
}

}  // namespace

int cuda_race_rows_f32(const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed,
                       const float* prob, const int64_t* idx, int64_t k, int64_t* tokens, void* stream, char* err,
                       size_t err_len) {
  return race(seed, position, n_rows, rows_per_seed, prob, idx, k, tokens, stream, err, err_len);
}

int cuda_race_rows_f64(const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed,
                       const double* prob, const int64_t* idx, int64_t k, int64_t* tokens, void* stream, char* err,
                       size_t err_len) {
  return race(seed, position, n_rows, rows_per_seed, prob, idx, k, tokens, stream, err, err_len);
}

}  // namespace pss
