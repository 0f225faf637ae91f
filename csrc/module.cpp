// packed_ss._epilogue: Python binding of the step epilogue (epilogue.h).
//
// One call covers a whole batch of requests (a batch-major DecodeState, rows [batch, R, K]): `step_cpu`
// runs it on the CPU (the Serial executor, request after request); `step_cuda`, compiled in when CMake
// found a CUDA compiler (HAS_CUDA), launches the kernels of epilogue.cu on the caller's stream, one thread
// block per request. Python hands over raw addresses (torch's data_ptr()) and the per-request strides;
// packed_ss/decode/epilogue/native.py checks dtypes, shapes, strides and devices before calling.
// No torch headers: the module depends on pybind11 (and, with CUDA, the static CUDA runtime) alone, so
// it imports without a GPU; a CUDA call without one raises RuntimeError naming the runtime's error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "epilogue.h"
#include "lookup.h"
#include "policy.h"
#include "noise.h"
#include "nucleus.h"
#ifdef PSS_WITH_CUDA
#include "epilogue_cuda.h"
#include "noise_cuda.h"
#endif

namespace py = pybind11;
using namespace pss;

namespace {

template <typename P>
P* as_ptr(uintptr_t address) {
  return reinterpret_cast<P*>(address);
}

State make_state(uintptr_t cache_len, uintptr_t last, uintptr_t draft, uintptr_t draft_len, uintptr_t q_idx,
                 uintptr_t q_prob, uintptr_t out, uintptr_t n_out, uintptr_t done, uintptr_t seed, uintptr_t offset,
                 uintptr_t stop_ids, uintptr_t max_new, uintptr_t nfe, uintptr_t n_verify, uintptr_t n_accepted,
                 uintptr_t n_bonus, int64_t width, int64_t support, int64_t n_stop, int64_t batch, int64_t out_len,
                 int64_t q_bytes) {
  if (width < 1 || support < 1 || n_stop < 0) throw std::invalid_argument("State: bad width / support / n_stop");
  if (batch < 0 || out_len < width + 1) throw std::invalid_argument("State: bad batch / out_len");
  if (q_bytes != 4 && q_bytes != 8) throw std::invalid_argument("State: q_prob must be float32 or float64");
  return State{as_ptr<int64_t>(cache_len),     as_ptr<int64_t>(last),       as_ptr<int64_t>(draft),
               as_ptr<int64_t>(draft_len),     as_ptr<int64_t>(q_idx),      as_ptr<void>(q_prob),
               as_ptr<int64_t>(out),           as_ptr<int64_t>(n_out),      as_ptr<bool>(done),
               as_ptr<const int64_t>(seed),    as_ptr<int64_t>(offset),     as_ptr<const int64_t>(stop_ids),
               as_ptr<const int64_t>(max_new), as_ptr<int64_t>(nfe),        as_ptr<int64_t>(n_verify),
               as_ptr<int64_t>(n_accepted),    as_ptr<int64_t>(n_bonus),    width,
               support,                        n_stop,                      batch,
               out_len,                        q_bytes};
}

struct Args {  // one call's arguments, as Python passes them
  int32_t phase, verify;
  int64_t retain;
  bool sampled, dense;
  int64_t block, vocab;
  uintptr_t v_arg, v_idx, v_prob;
  int64_t v_rows, v_k, v_stride;
  uintptr_t z_arg, z_idx, z_prob;
  int64_t z_k, z_stride, n_z;
  uintptr_t scratch, res, residual_u;
};

template <typename T>
Step<T> make_step(const State& st, const Args& a) {
  // Cheap checks of what would otherwise be out-of-bounds accesses.
  if (a.phase < kPhaseVerify || a.phase > kPhaseBoth) throw std::invalid_argument("epilogue: bad phase");
  if (a.verify < kVerifyNone || a.verify > kVerifyDraft) throw std::invalid_argument("epilogue: bad verify mode");
  if (a.block != st.width + 1) throw std::invalid_argument("epilogue: block must be width + 1");
  if (a.retain < kRetainNone) throw std::invalid_argument("epilogue: bad retain mode");
  if (a.res == 0) throw std::invalid_argument("epilogue: res buffer missing");
  if (a.v_stride < 0 || a.z_stride < 0) throw std::invalid_argument("epilogue: negative row stride");
  if (a.dense && (!a.sampled || st.support != a.vocab || (a.v_k && a.v_k != a.vocab) || (a.z_k && a.z_k != a.vocab)))
    throw std::invalid_argument("epilogue: dense distributions must span the vocabulary");
  if ((a.phase & kPhaseVerify) && a.verify != kVerifyNone) {
    if (a.sampled ? ((a.v_idx == 0 && !a.dense) || a.v_prob == 0 || a.v_k < 1) : a.v_arg == 0)
      throw std::invalid_argument("epilogue: verifier rows missing");
    if (a.sampled && a.verify == kVerifyDraft && (a.scratch == 0 || a.vocab < 1))
      throw std::invalid_argument("epilogue: sampled verification needs the [batch, vocab] workspace");
    if (a.v_rows < 1) throw std::invalid_argument("epilogue: no verifier rows");
    if (st.batch > 1 && a.v_stride < a.v_rows)
      throw std::invalid_argument("epilogue: the verifier row stride is shorter than one request's rows");
  }
  if ((a.phase & kPhaseCommit) && a.retain != kRetainNone) {
    if (a.n_z < 1) throw std::invalid_argument("epilogue: retain needs proposal rows");
    if (a.sampled ? ((a.z_idx == 0 && !a.dense) || a.z_prob == 0 || a.z_k != st.support) : a.z_arg == 0)
      throw std::invalid_argument("epilogue: proposal rows missing, or their support differs from the state's");
    if (st.batch > 1 && a.z_stride < a.n_z)
      throw std::invalid_argument("epilogue: the proposal row stride is shorter than one request's rows");
  }
  return Step<T>{a.verify,
                 a.retain,
                 a.sampled,
                 a.dense,
                 a.block,
                 a.vocab,
                 as_ptr<const int64_t>(a.v_arg),
                 as_ptr<const int64_t>(a.v_idx),
                 as_ptr<const T>(a.v_prob),
                 a.v_rows,
                 a.v_k,
                 as_ptr<const int64_t>(a.z_arg),
                 as_ptr<const int64_t>(a.z_idx),
                 as_ptr<const T>(a.z_prob),
                 a.z_k,
                 a.n_z,
                 as_ptr<T>(a.scratch),
                 as_ptr<int64_t>(a.res),
                 as_ptr<const int64_t>(a.residual_u),
                 a.v_stride,
                 a.z_stride};
}

// Binds `step_<device>(state, prob_bits, phase, verify, retain, sampled, dense, block, vocab, v_arg, v_idx, v_prob,
// v_rows, v_k, v_stride, z_arg, z_idx, z_prob, z_k, z_stride, n_z, scratch, res, residual_u, stream)`: one call on the
// state's whole batch; request b's rows start b * v_stride (z_stride) rows in, its scratch row b * vocab
// entries, its res row b * (block + 2), its residual index at residual_u + b. run(st, step, phase, stream)
// does the work.
template <typename Run32, typename Run64>
void def_step(py::module_& m, const char* name, Run32 run32, Run64 run64) {
  m.def(
      name,
      [run32, run64](const State& st, int32_t prob_bits, int32_t phase, int32_t verify, int64_t retain, bool sampled,
                     bool dense, int64_t block, int64_t vocab, uintptr_t v_arg, uintptr_t v_idx, uintptr_t v_prob,
                     int64_t v_rows, int64_t v_k, int64_t v_stride, uintptr_t z_arg, uintptr_t z_idx, uintptr_t z_prob, int64_t z_k,
                     int64_t z_stride, int64_t n_z, uintptr_t scratch, uintptr_t res, uintptr_t residual_u,
                     uintptr_t stream) {
        const Args a{phase,  verify, retain,   sampled, dense,  block,  vocab,    v_arg, v_idx,   v_prob, v_rows,
                     v_k,    v_stride, z_arg,  z_idx,   z_prob, z_k,    z_stride, n_z,   scratch, res,    residual_u};
        if (prob_bits == 32)
          run32(st, make_step<float>(st, a), phase, stream);
        else if (prob_bits == 64)
          run64(st, make_step<double>(st, a), phase, stream);
        else
          throw std::invalid_argument("epilogue: probabilities must be float32 or float64");
      },
      "One epilogue call on a whole batch of sequences (csrc/epilogue.h).");
}

template <typename T>
void run_cpu(const State& st, const Step<T>& s, int32_t phase, uintptr_t /*stream*/) {
  run_serial(st, s, phase);
}

#ifdef PSS_WITH_CUDA
void require_cuda_device() {
  static bool found = false;  // queried once per process, off the hot path
  if (found) return;
  char err[256] = {0};
  const int n = cuda_device_count(err, sizeof(err));
  if (n < 1)
    throw std::runtime_error(std::string("packed_ss CUDA epilogue: no usable CUDA device (") +
                             (n < 0 ? err : "none found") + ")");
  found = true;
}

template <typename T, typename F>
void run_cuda(F launch, const State& st, const Step<T>& s, int32_t phase, uintptr_t stream) {
  require_cuda_device();
  char err[256] = {0};
  if (launch(st, s, phase, reinterpret_cast<void*>(stream), err, sizeof(err)) != 0)
    throw std::runtime_error(std::string("packed_ss CUDA epilogue: ") + err);
}
#endif

}  // namespace

PYBIND11_MODULE(_epilogue, m) {
  m.doc() = "packed-ss step epilogue: acceptance, residual sampling and state update (csrc/epilogue.h)";
  py::class_<State>(m, "State", "Raw addresses of a batch-major DecodeState's tensors (decode/epilogue/native.py).")
      .def(py::init(&make_state))
      .def_readonly("width", &State::width)
      .def_readonly("support", &State::support)
      .def_readonly("n_stop", &State::n_stop)
      .def_readonly("batch", &State::batch)
      .def_readonly("out_len", &State::out_len);
  def_step(m, "step_cpu", &run_cpu<float>, &run_cpu<double>);
  m.def(
      "lookup_draft_cpu",
      [](uintptr_t context, int64_t context_len, uintptr_t out, int64_t out_len, uintptr_t n_out, uintptr_t stop_ids,
         int64_t n_stop, int64_t batch, const std::vector<int64_t>& ngrams, int64_t width, uintptr_t draft,
         uintptr_t length, uintptr_t order) {
        if (batch < 0 || context_len < 0 || out_len < 0 || context_len + out_len < 1 || n_stop < 0 || width < 1)
          throw std::invalid_argument("lookup_draft: bad batch / context_len / out_len / n_stop / width");
        for (const int64_t n : ngrams)
          if (n < 1 || n > kMaxNgram) throw std::invalid_argument("lookup_draft: n-gram lengths must be 1 .. 8");
        lookup_draft_rows(as_ptr<const int64_t>(context), context_len, as_ptr<const int64_t>(out), out_len,
                          as_ptr<const int64_t>(n_out), as_ptr<const int64_t>(stop_ids), n_stop, batch, ngrams.data(),
                          static_cast<int64_t>(ngrams.size()), width, as_ptr<int64_t>(draft),
                          as_ptr<int64_t>(length), as_ptr<int64_t>(order));
      },
      "lookup.py's lookup_draft over a state's contiguous int64 rows: (context, context_len, out, out_len, n_out, "
      "stop_ids, n_stop, batch, ngrams, width, draft, length, order)");
  m.def(
      "point_mass_cpu",
      [](uintptr_t q_prob, int32_t prob_bits, uintptr_t draft, uintptr_t rows, int64_t batch, int64_t width,
         int64_t support) {
        if (batch < 0 || width < 1 || support < 1)
          throw std::invalid_argument("point_mass: bad batch / width / support");
        if (prob_bits == 32)
          point_mass_rows(as_ptr<float>(q_prob), as_ptr<const int64_t>(draft), as_ptr<const bool>(rows), batch, width,
                          support);
        else
          point_mass_rows(as_ptr<double>(q_prob), as_ptr<const int64_t>(draft), as_ptr<const bool>(rows), batch,
                          width, support);
      },
      "Epilogue.point_mass over contiguous rows: q_prob [batch, width, support] of the rows taking a lookup draft "
      "(draft [batch, width]) zeroed, then 1 on each draft token (lookup.h)");
  m.def(
      "take_lookup_cpu",
      [](uintptr_t draft, uintptr_t length, uintptr_t order, uintptr_t preferred, uintptr_t keep, uintptr_t passive,
         uintptr_t done, uintptr_t st_draft, uintptr_t st_draft_len, uintptr_t lookup_draft, int64_t batch,
         int64_t width, uintptr_t q_prob, int32_t prob_bits, int64_t support) {
        if (batch < 0 || width < 1 || (q_prob && support < 1))
          throw std::invalid_argument("take_lookup: bad batch / width / support");
        const TakeLookup a{as_ptr<const int64_t>(draft), as_ptr<const int64_t>(length), as_ptr<const int64_t>(order),
                           as_ptr<const bool>(preferred), as_ptr<const bool>(keep), as_ptr<const bool>(passive),
                           as_ptr<const bool>(done), as_ptr<int64_t>(st_draft), as_ptr<int64_t>(st_draft_len),
                           as_ptr<bool>(lookup_draft), batch, width};
        if (prob_bits == 32)
          take_lookup_rows(a, as_ptr<float>(q_prob), support);
        else
          take_lookup_rows(a, as_ptr<double>(q_prob), support);
      },
      "Epilogue.take_lookup over contiguous rows: (draft, length, order, preferred, keep, passive, done, the state's "
      "draft, draft_len and lookup_draft, batch, width, q_prob or 0, its bits, support) (lookup.h)");
  m.def(
      "choose_cpu",
      [](uintptr_t costs, uintptr_t widths, uintptr_t masks, uintptr_t estimate, int64_t shapes, int64_t width,
         int64_t orders, int64_t packed, double row, double call, double margin, int64_t cost_batch, int64_t doze,
         int64_t run_first, int64_t run_last, bool per_request, uintptr_t look_hit, uintptr_t look_order,
         uintptr_t diffusion, uintptr_t length, uintptr_t order, uintptr_t done, uintptr_t passive, uintptr_t greedy,
         uintptr_t queued, uintptr_t nfe, uintptr_t choice, uintptr_t quiet_until, uintptr_t quiet_run,
         int64_t batch) {
        if (shapes < 1 || width < 1 || orders < 1 || packed < 0 || cost_batch < 2 || batch < 0)
          throw std::invalid_argument("choose: bad shapes / width / orders / packed / cost_batch / batch");
        const PolicyNumbers p{as_ptr<const float>(costs), as_ptr<const int64_t>(widths), as_ptr<const int64_t>(masks),
                              as_ptr<const int64_t>(estimate), shapes, width, orders, packed,
                              static_cast<float>(row), static_cast<float>(call), static_cast<float>(margin),
                              cost_batch, doze, run_first, run_last, per_request};
        const PolicyRows r{as_ptr<const float>(look_hit), as_ptr<const float>(look_order),
                           as_ptr<const float>(diffusion), as_ptr<const int64_t>(length), as_ptr<const int64_t>(order),
                           as_ptr<const bool>(done), as_ptr<const bool>(passive), as_ptr<const bool>(greedy),
                           as_ptr<const bool>(queued), as_ptr<const int64_t>(nfe), as_ptr<int64_t>(choice),
                           as_ptr<int64_t>(quiet_until), as_ptr<int64_t>(quiet_run), batch};
        choose_rows(p, r);
      },
      "decode/policy.py's Policy.choose over contiguous rows (policy.h)");
  m.def(
      "prefers_lookup_cpu",
      [](uintptr_t look_hit, uintptr_t diffusion, uintptr_t length, uintptr_t order, int64_t batch, int64_t width,
         int64_t orders, int64_t packed, uintptr_t preferred) {
        if (batch < 0 || width < 1 || orders < 1 || packed < 0)
          throw std::invalid_argument("prefers_lookup: bad batch / width / orders / packed");
        prefers_lookup_rows(as_ptr<const float>(look_hit), as_ptr<const float>(diffusion),
                            as_ptr<const int64_t>(length), as_ptr<const int64_t>(order), batch, width, orders, packed,
                            as_ptr<bool>(preferred));
      },
      "decode/policy.py's Policy.prefers_lookup over contiguous rows (policy.h)");
  m.def(
      "score_lookup_cpu",
      [](uintptr_t look_hit, uintptr_t look_order, uintptr_t probe, uintptr_t probe_len, uintptr_t probe_at,
         uintptr_t probe_order, uintptr_t out, uintptr_t n_out, uintptr_t draft, uintptr_t length, uintptr_t order,
         uintptr_t done, uintptr_t passive, int64_t batch, int64_t width, int64_t orders, int64_t out_len,
         double rate) {
        if (batch < 0 || width < 1 || orders < 1 || out_len < 1)
          throw std::invalid_argument("score_lookup: bad batch / width / orders / out_len");
        score_lookup_rows({as_ptr<float>(look_hit), as_ptr<float>(look_order), as_ptr<int64_t>(probe),
                           as_ptr<int64_t>(probe_len), as_ptr<int64_t>(probe_at), as_ptr<int64_t>(probe_order),
                           as_ptr<const int64_t>(out), as_ptr<const int64_t>(n_out), as_ptr<const int64_t>(draft),
                           as_ptr<const int64_t>(length), as_ptr<const int64_t>(order), as_ptr<const bool>(done),
                           as_ptr<const bool>(passive), batch, width, orders, out_len, static_cast<float>(rate)});
      },
      "decode/policy.py's Policy.score_lookup over contiguous rows (policy.h)");
  m.def(
      "observe_cpu",
      [](uintptr_t diffusion, uintptr_t last_ran, uintptr_t prior, uintptr_t packed, uintptr_t ran, uintptr_t emitted,
         uintptr_t verified_lookup, uintptr_t done, uintptr_t passive, int64_t batch, int64_t packed_shapes,
         double rate, double drift) {
        if (batch < 0 || packed_shapes < 0) throw std::invalid_argument("observe: bad batch / packed_shapes");
        observe_rows({as_ptr<float>(diffusion), as_ptr<int64_t>(last_ran), as_ptr<const float>(prior),
                      as_ptr<const int64_t>(packed), as_ptr<const int64_t>(ran), as_ptr<const int64_t>(emitted),
                      as_ptr<const bool>(verified_lookup), as_ptr<const bool>(done), as_ptr<const bool>(passive),
                      batch, packed_shapes, static_cast<float>(rate), static_cast<float>(drift)});
      },
      "decode/policy.py's Policy.observe over contiguous rows (policy.h)");
  m.def(
      "nucleus_cpu",
      [](uintptr_t prob, uintptr_t p, int64_t n_p, int64_t n_rows, int64_t vocab, int32_t prob_bits, uintptr_t cut,
         uintptr_t truncated, int64_t threads) {
        if (n_rows > 0 && (n_p < 1 || n_rows % n_p != 0))
          throw std::invalid_argument("nucleus_cpu: n_rows is not a multiple of n_p");
        if (prob_bits == 32)
          nucleus_cpu(as_ptr<const float>(prob), as_ptr<const double>(p), n_p, n_rows, vocab, as_ptr<float>(cut),
                      as_ptr<float>(truncated), threads);
        else
          nucleus_cpu(as_ptr<const double>(prob), as_ptr<const double>(p), n_p, n_rows, vocab, as_ptr<double>(cut),
                      as_ptr<double>(truncated), threads);
      },
      "cut[r] = the smallest probability top-p keeps of row r of prob [n_rows, vocab], its top-p p[r * n_p / n_rows] "
      "(double, rounded to prob's type; 0 where that is >= 1), as sampling.kept's sorted rule; where `truncated` is "
      "not 0, that row of prob zeroed below cut[r] too; on up to `threads` threads (nucleus.h)");
  m.def("philox_uniform", &philox_uniform, "u[i] of packed_ss.sampling.philox_uniform(seed, offset, n)");
  m.def("noise_uniform", &noise_uniform, "u of token x in the row (seed, position): sampling.exponential_noise's");
  m.def(
      "sample_cpu",
      [](bool inverse_cdf, uintptr_t seed, uintptr_t position, int64_t n_rows, int64_t rows_per_seed, uintptr_t prob,
         int32_t prob_bits, uintptr_t idx, int64_t k, uintptr_t tokens, int64_t threads) {
        const Coupling coupling = inverse_cdf ? Coupling::kInverseCdf : Coupling::kRace;
        const auto* s = as_ptr<const int64_t>(seed);
        const auto* at = as_ptr<const int64_t>(position);
        if (prob_bits == 32)
          sample_cpu(coupling, s, at, n_rows, rows_per_seed, as_ptr<const float>(prob), as_ptr<const int64_t>(idx), k,
                     as_ptr<int64_t>(tokens), threads);
        else
          sample_cpu(coupling, s, at, n_rows, rows_per_seed, as_ptr<const double>(prob), as_ptr<const int64_t>(idx), k,
                     as_ptr<int64_t>(tokens), threads);
      },
      "tokens[r] = the shared-noise sample of row r of prob [n_rows, k] (idx [n_rows, k] or 0: dense), keyed by "
      "(seed[r / rows_per_seed], position[r]), by the inverse CDF or the race, on up to `threads` threads (noise.h)");
#ifdef PSS_WITH_CUDA
  def_step(
      m, "step_cuda",
      [](const State& st, const Step<float>& s, int32_t phase, uintptr_t stream) {
        run_cuda(cuda_step_f32, st, s, phase, stream);
      },
      [](const State& st, const Step<double>& s, int32_t phase, uintptr_t stream) {
        run_cuda(cuda_step_f64, st, s, phase, stream);
      });
  m.def(
      "race_cuda",
      [](uintptr_t seed, uintptr_t position, int64_t n_rows, int64_t rows_per_seed, uintptr_t prob, int32_t prob_bits,
         uintptr_t idx, int64_t k, uintptr_t tokens, uintptr_t stream) {
        require_cuda_device();
        char err[256] = {0};
        const auto* s = as_ptr<const int64_t>(seed);
        const auto* at = as_ptr<const int64_t>(position);
        const int rc = prob_bits == 32
            ? cuda_race_rows_f32(s, at, n_rows, rows_per_seed, as_ptr<const float>(prob), as_ptr<const int64_t>(idx),
                                 k, as_ptr<int64_t>(tokens), reinterpret_cast<void*>(stream), err, sizeof(err))
            : cuda_race_rows_f64(s, at, n_rows, rows_per_seed, as_ptr<const double>(prob), as_ptr<const int64_t>(idx),
                                 k, as_ptr<int64_t>(tokens), reinterpret_cast<void*>(stream), err, sizeof(err));
        if (rc != 0) throw std::runtime_error(std::string("packed_ss CUDA shared-noise race: ") + err);
      },
      "sample_cpu's race on the device, on `stream` (noise.cu)");
  m.def("cuda_device_count", []() {
    char err[256] = {0};
    const int n = cuda_device_count(err, sizeof(err));
    return py::make_tuple(n, std::string(err));
  }, "(number of CUDA devices, or -1 and the CUDA runtime's message)");
  m.attr("HAS_CUDA") = true;
  m.attr("CUDA_ARCHS") = cuda_archs();
#else
  m.attr("HAS_CUDA") = false;
  m.attr("CUDA_ARCHS") = "";
#endif
  m.attr("VERIFY_NONE") = static_cast<int>(kVerifyNone);
  m.attr("VERIFY_ONE") = static_cast<int>(kVerifyOne);
  m.attr("VERIFY_DRAFT") = static_cast<int>(kVerifyDraft);
  m.attr("RETAIN_NONE") = kRetainNone;
  m.attr("RETAIN_SHIFT_A") = kRetainShiftA;
  m.attr("PHASE_VERIFY") = static_cast<int>(kPhaseVerify);
  m.attr("PHASE_COMMIT") = static_cast<int>(kPhaseCommit);
  m.attr("PHASE_BOTH") = static_cast<int>(kPhaseBoth);
}
