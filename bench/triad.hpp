#pragma once
// The memory-bandwidth reference of the bench programs: a best-effort STREAM triad, a[i] = b[i] + s*c[i], counted
// as STREAM counts it (12 bytes an element: two reads and one write, the write's cache-line fill not counted, as tg's
// elementwise kernels are counted). Best effort, as STREAM's rules ask:
//   - the threads tg's kernels run on (bench::tg_threads), each given one contiguous part of the arrays (a static
//     partition, as STREAM's OpenMP loop), in a task arena of that many threads;
//   - 64-byte aligned arrays, first touched in parallel with the same partition (their pages spread as the runs'
//     accesses are, on a machine with more than one memory node);
//   - vector code for the CPU it runs on (AVX-512, AVX2 or SSE2, chosen at run time), both with ordinary stores and
//     with non-temporal ones (which skip the write's cache-line fill), the best of the two kinds;
//   - arrays far larger than the last-level cache: 2^24 floats (64 MiB) each by default, 192 MiB in all, 6x the
//     32 MiB L3 a Zen 5 CCD's cores share (glibc reports the whole socket's, 508 MiB; the VM has no sysfs cache
//     entries), the same footprint as the add it is compared with; 2^25 measured lower on the VM, not higher;
//   - the best of several repetitions.
// The older triad (a TBB loop over 2^16-float blocks, default partitioner, SSE2 code from the default -O3 flags, one
// store kind) moved 24-55 GB/s where tg's own add moved 68 GB/s on the same VM (2-core AMD EPYC Zen 5).
#include <immintrin.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace bench {

namespace triad_detail {

// One part: a[i] = b[i] + s*c[i] for i in [0, n), a 64-byte aligned (n a multiple of 16); nt: streaming stores.
__attribute__((target("avx512f"))) inline void part_avx512(float* a, const float* b, const float* c, size_t n, float s,
                                                          bool nt) {
  const __m512 vs = _mm512_set1_ps(s);
  if (nt)
    for (size_t i = 0; i < n; i += 16)
      _mm512_stream_ps(a + i, _mm512_fmadd_ps(vs, _mm512_load_ps(c + i), _mm512_load_ps(b + i)));
  else
    for (size_t i = 0; i < n; i += 16)
      _mm512_store_ps(a + i, _mm512_fmadd_ps(vs, _mm512_load_ps(c + i), _mm512_load_ps(b + i)));
  _mm_sfence();
}
__attribute__((target("avx2,fma"))) inline void part_avx2(float* a, const float* b, const float* c, size_t n, float s,
                                                         bool nt) {
  const __m256 vs = _mm256_set1_ps(s);
  if (nt)
    for (size_t i = 0; i < n; i += 8)
      _mm256_stream_ps(a + i, _mm256_fmadd_ps(vs, _mm256_load_ps(c + i), _mm256_load_ps(b + i)));
  else
    for (size_t i = 0; i < n; i += 8)
      _mm256_store_ps(a + i, _mm256_fmadd_ps(vs, _mm256_load_ps(c + i), _mm256_load_ps(b + i)));
  _mm_sfence();
}
inline void part_sse2(float* a, const float* b, const float* c, size_t n, float s, bool nt) {
  const __m128 vs = _mm_set1_ps(s);
  for (size_t i = 0; i < n; i += 4) {
    __m128 v = _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i)));
    nt ? _mm_stream_ps(a + i, v) : _mm_store_ps(a + i, v);
  }
  _mm_sfence();
}

}  // namespace triad_detail

/** A STREAM triad over three arrays of n floats on tg's threads (see the file comment). Not thread-safe. */
class Triad {
 public:
  explicit Triad(size_t n = size_t(1) << 24) : n_(n / 64 * 64), threads_(std::max(1, tg_threads())), arena_(threads_) {
    for (float** p : {&a_, &b_, &c_}) {
      *p = static_cast<float*>(std::aligned_alloc(64, n_ * sizeof(float)));
      if (!*p) throw std::bad_alloc();
    }
    if (__builtin_cpu_supports("avx512f"))
      part_ = triad_detail::part_avx512, isa_ = "AVX-512";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      part_ = triad_detail::part_avx2, isa_ = "AVX2";
    for_parts([&](size_t lo, size_t hi) {  // first touch, by parts
      std::fill(a_ + lo, a_ + hi, 0.0f), std::fill(b_ + lo, b_ + hi, 1.0f), std::fill(c_ + lo, c_ + hi, 2.0f);
    });
  }
  ~Triad() { std::free(a_), std::free(b_), std::free(c_); }
  Triad(const Triad&) = delete;
  Triad& operator=(const Triad&) = delete;

  /** One triad over the arrays; nt: non-temporal stores. */
  void run(bool nt) {
    for_parts([&](size_t lo, size_t hi) { part_(a_ + lo, b_ + lo, c_ + lo, hi - lo, 3.0f, nt); });
  }
  /** The ms of one run of each store kind, the faster's (each kind's best so far is kept: best_gbs). */
  double once_ms() {
    double ms[2];
    for (int nt = 0; nt < 2; nt++) {
      ms[nt] = bench::best_ms([&] { run(nt); }, 1);
      best_[nt] = std::min(best_[nt], ms[nt]);
    }
    return std::min(ms[0], ms[1]);
  }
  /** Best ms over `reps` rounds of once_ms. */
  double best_ms(int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) best = std::min(best, once_ms());
    return best;
  }
  /** GB/s of a run of `ms` (12 bytes an element). */
  double gbs(double ms) const { return 12.0 * double(n_) / ms / 1e6; }
  /** Best GB/s so far with ordinary (nt false) or non-temporal stores. */
  double best_gbs(bool nt) const { return gbs(best_[nt]); }
  /** "16777216 floats (64 MiB) x 3, 2 threads, AVX-512" */
  std::string describe() const {
    char s[96];
    std::snprintf(s, sizeof s, "%zu floats (%zu MiB) x 3, %d threads, %s", n_, n_ * 4 >> 20, threads_, isa_);
    return s;
  }
  void check() const {  // every element written (the last run's values)
    for (size_t i = 0; i < n_; i += 4093)
      if (a_[i] != 7.0f) throw std::runtime_error("[triad] wrong result at " + std::to_string(i));
  }

 private:
  template <class F>
  void for_parts(F&& f) {
    const size_t parts = size_t(threads_);
    arena_.execute([&] {
      tbb::parallel_for(
          size_t(0), parts, [&](size_t p) { f(n_ / 64 * p / parts * 64, n_ / 64 * (p + 1) / parts * 64); },
          tbb::static_partitioner());
    });
  }
  size_t n_;
  int threads_;
  tbb::task_arena arena_;
  float *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  void (*part_)(float*, const float*, const float*, size_t, float, bool) = triad_detail::part_sse2;
  const char* isa_ = "SSE2";
  double best_[2] = {1e30, 1e30};
};

/** Times of `sides` and the triad in rounds (interleaved). */
struct Rounds {
  std::vector<std::vector<double>> ms;  ///< ms[side][round]: the better of the side's two runs in the round
  double triad_ms = 1e30;               ///< the triad's best (Triad::once_ms) over the rounds
  /** The side's best ms. */
  double best(size_t side) const { return *std::min_element(ms[side].begin(), ms[side].end()); }
  /** The side's median over the rounds. */
  double median(size_t side) const {
    std::vector<double> v = ms[side];
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

/** `rounds` rounds of the triad and then each side, every one of them run twice a round: the triad's ordinary run,
 *  then its non-temporal one on the same arrays; each side's first run, then its second. Whichever runs first after
 *  another is slower: its arrays are not the ones just streamed (2-core Zen 5 VM, one process, both on tg's thread
 *  pool: the triad's non-temporal run after tg's add 1.83-2.17 ms, after its own run 1.58-1.73; tg's add after the
 *  triad 1.87-2.37, after itself 1.77-1.94; why was not found), and its threads' one oneTBB worker first leaves the
 *  other's task arena (150-200 us in a micro-benchmark: a worker leaves an arena only after spinning in it). With one
 *  run a round, a side paid both every time and the triad's best never did: tg's add read 0.61-0.88 of the triad
 *  where two runs a round read 0.94-1.01 in the same minutes. */
inline Rounds interleaved(Triad& triad, const std::vector<std::function<void()>>& sides, int rounds) {
  Rounds r;
  r.ms.resize(sides.size());
  for (int k = 0; k < rounds; k++) {
    r.triad_ms = std::min(r.triad_ms, triad.once_ms());
    for (size_t s = 0; s < sides.size(); s++) r.ms[s].push_back(best_ms(sides[s], 2));
  }
  return r;
}

}  // namespace bench
