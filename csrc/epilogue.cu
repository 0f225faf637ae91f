// CUDA build of the step epilogue: one call covers the batch, the functions of epilogue.h running in one
// thread block per request (gridDim.x = batch; block b takes request b through at(..., blockIdx.x)).
//
// Every thread of a block walks the same scalar path (the decisions are cheap and identical); the
// vector parts are block-cooperative: lookups of p(d) / Q(d) in sparse rows, densifying a row into the
// request's [vocab] workspace row, and the inverse-CDF scan. The retained Q rows ([W, K] per request, up
// to W x vocab entries) are copied by a second kernel, its grid [blocks, batch] (y = request), each
// request's blocks reading the retain shift the first kernel left in that request's res[B + 1].
// Both launch on the caller's stream, allocate nothing and never synchronise: CUDA-graph capturable.
//
// The inverse CDF sums in double, like the CPU build, but in parallel chunks (each thread a contiguous
// chunk, chunk sums combined by a block scan) instead of one left-to-right pass. The prefixes can differ
// from the CPU build's in the last bit of a double, so a draw can differ only when a prefix rounds onto a
// float boundary next to the target: both remain exact samplers of the same distribution.
#include <cuda_runtime.h>

#include <cstdio>

#include "epilogue_cuda.h"

#ifndef PSS_CUDA_ARCHS
#define PSS_CUDA_ARCHS "unknown"
#endif

namespace pss {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBatch = 65535;   // gridDim.y of retain_q_kernel
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ double warp_inclusive_sum(double v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const double up = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

template <int NT>
struct Block {
  static_assert(NT % 32 == 0 && NT <= 1024, "block size");

  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ void sync() const { __syncthreads(); }

  // prob[j] for the first j with idx[j] == token, 0 if none
  template <typename P>
  __device__ P lookup(const int64_t* idx, const P* prob, int64_t k, int64_t token) {
    if (!idx) return token >= 0 && token < k ? prob[token] : P(0);
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = static_cast<unsigned long long>(k);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < k; j += NT) {
      if (idx[j] == token) {
        atomicMin(&first, static_cast<unsigned long long>(j));
        break;
      }
    }
    __syncthreads();
    const unsigned long long f = first;
    __syncthreads();  // `first` is reused by the next call
    return f < static_cast<unsigned long long>(k) ? prob[f] : P(0);
  }

  template <typename T>
  __device__ int64_t inverse_cdf(const T* w, int64_t n, double u, bool* positive) {
    constexpr int kWarps = NT / 32;
    __shared__ double warp_prefix[kWarps];
    __shared__ double total_shared;
    __shared__ unsigned long long first;
    __shared__ long long last_positive;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int64_t chunk = (n + NT - 1) / NT;
    const int64_t lo = imin(n, t * chunk), hi = imin(n, lo + chunk);
    double s = 0.0;
    long long lp = -1;
    for (int64_t i = lo; i < hi; ++i) {
      const T v = w[i];
      s += static_cast<double>(v);
      if (v > T(0)) lp = i;
    }
    if (t == 0) {
      first = static_cast<unsigned long long>(n);
      last_positive = 0;
    }
    // exclusive prefix of the chunk sums: within the warp, then across warps
    const double incl = warp_inclusive_sum(s, lane);
    double excl = __shfl_up_sync(kFull, incl, 1);
    if (lane == 0) excl = 0.0;
    if (lane == 31) warp_prefix[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      const double v = lane < kWarps ? warp_prefix[lane] : 0.0;
      const double vi = warp_inclusive_sum(v, lane);
      double ve = __shfl_up_sync(kFull, vi, 1);
      if (lane == 0) ve = 0.0;
      if (lane < kWarps) warp_prefix[lane] = ve;
      if (lane == 31) total_shared = vi;
    }
    __syncthreads();
    const T total = static_cast<T>(total_shared);
    const T target = static_cast<T>(u) * total;
    if (positive) *positive = total > T(0);
    double acc = warp_prefix[warp] + excl;
    for (int64_t i = lo; i < hi; ++i) {
      acc += static_cast<double>(w[i]);
      if (static_cast<T>(acc) > target) {
        atomicMin(&first, static_cast<unsigned long long>(i));
        break;
      }
    }
    if (lp >= 0) atomicMax(&last_positive, lp);
    __syncthreads();
    const int64_t r = imin(static_cast<int64_t>(first), static_cast<int64_t>(last_positive));
    __syncthreads();  // the shared words are reused by the next call
    return r;
  }

  template <typename T>
  __device__ void densify(T* scratch, int64_t vocab, const int64_t* idx, const T* prob, int64_t k) {
    for (int64_t x = threadIdx.x; x < vocab; x += NT) scratch[x] = idx ? T(0) : prob[x];
    __syncthreads();
    if (!idx) return;
    for (int64_t j = threadIdx.x; j < k; j += NT) scratch[idx[j]] = prob[j];
    __syncthreads();
  }

  template <typename T>
  __device__ void subtract_clamp(T* scratch, const int64_t* q_idx, const T* q_prob, int64_t k) {
    for (int64_t j = threadIdx.x; j < k; j += NT) {
      const int64_t x = q_idx ? q_idx[j] : j;
      const T r = scratch[x] - q_prob[j];
      scratch[x] = r > T(0) ? r : T(0);
    }
    __syncthreads();
  }

  // the Q rows are copied by retain_q_kernel, after this kernel, from the shift left in res[B + 1]
  template <typename T>
  __device__ void retain_q(const State&, const Step<T>&, int64_t) {}
};

// Block b steps request b.
template <typename T>
__global__ void __launch_bounds__(kThreads) step_kernel(State st, Step<T> s, int32_t phase) {
  Block<kThreads> x;
  const int64_t b = blockIdx.x;
  run(at(st, b), at(s, b), phase, x);
}

// The retained Q rows of request blockIdx.y, from the shift step_kernel left in its res row (-1: none).
template <typename T>
__global__ void retain_q_kernel(State st_all, Step<T> s_all) {
  const int64_t b = blockIdx.y;
  const State st = at(st_all, b);
  const Step<T> s = at(s_all, b);
  const int64_t shift = s.res[s.block + 1];
  if (shift < 0) return;
  const int64_t* z_idx = s.dense ? nullptr : s.z_idx;   // null: dense Q, no index rows
  const int64_t k = st.support, total = st.width * k, z_k = s.z_k, n_z = s.n_z;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / k, j = e - i * k;
    const int64_t src = imin(shift + i, n_z - 1);
    if (z_idx) st.q_idx[e] = z_idx[src * z_k + j];
    q_prob_of<T>(st)[e] = s.z_prob[src * z_k + j];
  }
}

int report(cudaError_t e, char* err, size_t err_len) {
  if (e == cudaSuccess) return 0;
  if (err && err_len) snprintf(err, err_len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  return static_cast<int>(e);
}

template <typename T>
int launch(const State& st, const Step<T>& s, int32_t phase, void* stream, char* err, size_t err_len) {
  if (st.batch < 1) return 0;   // nothing to launch (a grid of 0 blocks is invalid)
  if (st.batch > kMaxBatch) return report(cudaErrorInvalidConfiguration, err, err_len);
  const cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const unsigned n = static_cast<unsigned>(st.batch);
  step_kernel<T><<<n, kThreads, 0, cs>>>(st, s, phase);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return report(e, err, err_len);
  if (s.sampled && (phase & kPhaseCommit) && s.retain != kRetainNone) {
    const int64_t total = st.width * st.support;
    const unsigned blocks = static_cast<unsigned>(imax(1, imin((total + 255) / 256, 2048)));
    retain_q_kernel<T><<<dim3(blocks, n), 256, 0, cs>>>(st, s);
    e = cudaGetLastError();
  }
  return report(e, err, err_len);
}

}  // namespace

int cuda_step_f32(const State& st, const Step<float>& s, int32_t phase, void* stream, char* err, size_t err_len) {
  return launch(st, s, phase, stream, err, err_len);
}

int cuda_step_f64(const State& st, const Step<double>& s, int32_t phase, void* stream, char* err, size_t err_len) {
  return launch(st, s, phase, stream, err, err_len);
}

int cuda_device_count(char* err, size_t err_len) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    report(e, err, err_len);
    cudaGetLastError();  // clear it: later calls report their own errors
    return -1;
  }
  return n;
}

const char* cuda_archs() { return PSS_CUDA_ARCHS; }

}  // namespace pss
