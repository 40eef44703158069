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
// The same class runs other mixes of reads and writes (one to three float arrays read, one written as float or
// float16): a kernel with another mix is judged against what the machine's memory does for that mix, beside the
// triad. (On the 2-core Zen 5 VM, quiet, the one-read stream read 0.97-1.11 of the triad's GB/s in the same rounds:
// the two agree there; a machine whose writes cost more than its reads would not.)
// The older triad (a TBB loop over 2^16-float blocks, default partitioner, SSE2 code from the default -O3 flags, one
// store kind) moved 24-55 GB/s where tg's own add moved 68 GB/s on the same VM (2-core AMD EPYC Zen 5).
#include <immintrin.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
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

// One part, n elements (a multiple of 16, the arrays 64-byte aligned): a[i] = s*b[i] (reads 1), b[i] + s*c[i] (2:
// the triad) or b[i] + s*c[i] + d[i] (3), stored as float or (half) as IEEE half; nt: streaming stores. One
// definition for each vector ISA (its target attribute, vector types and intrinsics; W floats a vector). AVX-512's
// half conversion is the zero-masked one: GCC 12 warns that the plain one's undefined source "may be used
// uninitialized".
#define TG_TRIAD_PART(NAME, TARGET, W, VEC, HVEC, SET1, LOAD, MUL, ADD, FMA, STORE, STREAM, TOHALF, HSTORE, HSTREAM)  \
  template <int reads>                                                                                             \
  __attribute__((target(TARGET))) inline VEC NAME##_value(const float* b, const float* c, const float* d, size_t i, \
                                                          VEC vs) {                                                \
    if constexpr (reads == 1) return MUL(vs, LOAD(b + i));                                                         \
    VEC v = FMA(vs, LOAD(c + i), LOAD(b + i));                                                                     \
    if constexpr (reads == 3) v = ADD(v, LOAD(d + i));                                                             \
    return v;                                                                                                      \
  }                                                                                                                \
  template <int reads, bool half>                                                                                  \
  __attribute__((target(TARGET))) inline void NAME(void* a, const float* b, const float* c, const float* d,         \
                                                   size_t n, float s, bool nt) {                                   \
    const VEC vs = SET1(s);                                                                                        \
    if constexpr (half) {                                                                                          \
      auto* h = static_cast<HVEC*>(a);                                                                             \
      if (nt)                                                                                                      \
        for (size_t i = 0; i < n; i += W) HSTREAM(h + i / W, TOHALF(NAME##_value<reads>(b, c, d, i, vs)));          \
      else                                                                                                         \
        for (size_t i = 0; i < n; i += W) HSTORE(h + i / W, TOHALF(NAME##_value<reads>(b, c, d, i, vs)));           \
    } else {                                                                                                       \
      auto* f = static_cast<float*>(a);                                                                            \
      if (nt)                                                                                                      \
        for (size_t i = 0; i < n; i += W) STREAM(f + i, NAME##_value<reads>(b, c, d, i, vs));                      \
      else                                                                                                         \
        for (size_t i = 0; i < n; i += W) STORE(f + i, NAME##_value<reads>(b, c, d, i, vs));                       \
    }                                                                                                              \
    _mm_sfence();                                                                                                  \
  }
#define TG_TRIAD_HALF512(v) _mm512_maskz_cvtps_ph(0xffff, v, _MM_FROUND_TO_NEAREST_INT)
#define TG_TRIAD_HALF256(v) _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)
TG_TRIAD_PART(part_avx512, "avx512f", 16, __m512, __m256i, _mm512_set1_ps, _mm512_load_ps, _mm512_mul_ps, _mm512_add_ps,
              _mm512_fmadd_ps, _mm512_store_ps, _mm512_stream_ps, TG_TRIAD_HALF512, _mm256_store_si256, _mm256_stream_si256)
TG_TRIAD_PART(part_avx2, "avx2,fma,f16c", 8, __m256, __m128i, _mm256_set1_ps, _mm256_load_ps, _mm256_mul_ps, _mm256_add_ps,
              _mm256_fmadd_ps, _mm256_store_ps, _mm256_stream_ps, TG_TRIAD_HALF256, _mm_store_si128, _mm_stream_si128)
#undef TG_TRIAD_PART
#undef TG_TRIAD_HALF512
#undef TG_TRIAD_HALF256
// SSE2: float output only (a half needs F16C, which every AVX2 CPU has)
template <int reads>
inline void part_sse2(void* a, const float* b, const float* c, const float* d, size_t n, float s, bool nt) {
  const __m128 vs = _mm_set1_ps(s);
  auto* f = static_cast<float*>(a);
  for (size_t i = 0; i < n; i += 4) {
    __m128 v = reads == 1 ? _mm_mul_ps(vs, _mm_load_ps(b + i)) : _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i)));
    if (reads == 3) v = _mm_add_ps(v, _mm_load_ps(d + i));
    nt ? _mm_stream_ps(f + i, v) : _mm_store_ps(f + i, v);
  }
  _mm_sfence();
}

using PartFn = void (*)(void*, const float*, const float*, const float*, size_t, float, bool);
template <int reads>
inline PartFn pick(bool avx512, bool avx2, bool half) {
  if (avx512) return half ? part_avx512<reads, true> : part_avx512<reads, false>;
  if (avx2) return half ? part_avx2<reads, true> : part_avx2<reads, false>;
  return half ? nullptr : part_sse2<reads>;
}
// The IEEE half of a float that one holds exactly (the small integers check() expects)
inline uint16_t half_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f == 0.0f) return 0;
  return uint16_t(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 127u + 15u) << 10) | ((u >> 13) & 0x3ffu));
}

}  // namespace triad_detail

/** A streaming kernel over arrays of n floats on tg's threads (see the file comment): by default the STREAM triad
 *  (two float arrays read, one written); `reads` 1..3 float arrays read and one written as float, or (half) as IEEE
 *  half: the same mix of reads and writes as a memory-bound kernel it is compared with. Not thread-safe. */
class Triad {
 public:
  explicit Triad(size_t n = size_t(1) << 24, int reads = 2, bool half = false)
      : n_(n / 64 * 64), reads_(reads), half_(half), threads_(std::max(1, tg_threads())), arena_(threads_) {
    if (reads < 1 || reads > 3) throw std::invalid_argument("[triad] reads must be 1..3, got " + std::to_string(reads));
    const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");  // F16C: every AVX2 CPU has it (Ivy Bridge on)
    isa_ = avx512 ? "AVX-512" : avx2 ? "AVX2" : "SSE2";
    part_ = reads == 1 ? triad_detail::pick<1>(avx512, avx2, half) : reads == 2 ? triad_detail::pick<2>(avx512, avx2, half) : triad_detail::pick<3>(avx512, avx2, half);
    if (!part_) throw std::invalid_argument("[triad] half output needs F16C");
    float** inputs[] = {&b_, &c_, &d_};
    for (int k = 0; k < reads; k++) {
      *inputs[k] = static_cast<float*>(std::aligned_alloc(64, n_ * sizeof(float)));
      if (!*inputs[k]) throw std::bad_alloc();
    }
    a_ = std::aligned_alloc(64, n_ * out_bytes());
    if (!a_) throw std::bad_alloc();
    for_parts([&](size_t lo, size_t hi) {  // first touch, by parts
      std::memset(static_cast<char*>(a_) + lo * out_bytes(), 0, (hi - lo) * out_bytes());
      std::fill(b_ + lo, b_ + hi, 1.0f);
      if (c_) std::fill(c_ + lo, c_ + hi, 2.0f);
      if (d_) std::fill(d_ + lo, d_ + hi, 1.0f);
    });
  }
  ~Triad() { std::free(a_), std::free(b_), std::free(c_), std::free(d_); }
  Triad(const Triad&) = delete;
  Triad& operator=(const Triad&) = delete;

  /** One run over the arrays; nt: non-temporal stores. */
  void run(bool nt) {
    for_parts([&](size_t lo, size_t hi) {
      part_(static_cast<char*>(a_) + lo * out_bytes(), b_ + lo, c_ ? c_ + lo : nullptr, d_ ? d_ + lo : nullptr, hi - lo, 3.0f, nt);
    });
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
  /** Bytes an element: each array read once, the output written once (the triad's 12, as STREAM counts). */
  double bytes_per_element() const { return 4.0 * reads_ + double(out_bytes()); }
  /** GB/s of a run of `ms`. */
  double gbs(double ms) const { return bytes_per_element() * double(n_) / ms / 1e6; }
  /** Best GB/s so far with ordinary (nt false) or non-temporal stores. */
  double best_gbs(bool nt) const { return gbs(best_[nt]); }
  /** "16777216 floats (64 MiB) x 3, 2 threads, AVX-512"; another mix: "... 1 read, 1 written as float16 ..." */
  std::string describe() const {
    char s[128];
    if (reads_ == 2 && !half_)
      std::snprintf(s, sizeof s, "%zu floats (%zu MiB) x 3, %d threads, %s", n_, n_ * 4 >> 20, threads_, isa_);
    else
      std::snprintf(s, sizeof s, "%zu floats (%zu MiB): %d read, 1 written as %s, %d threads, %s", n_, n_ * 4 >> 20, reads_,
                    half_ ? "float16" : "float32", threads_, isa_);
    return s;
  }
  void check() const {  // every element written (the last run's values)
    const float want = reads_ == 1 ? 3.0f : reads_ == 2 ? 7.0f : 8.0f;
    for (size_t i = 0; i < n_; i += 4093) {
      bool ok;
      if (half_) {
        uint16_t h;
        std::memcpy(&h, static_cast<const char*>(a_) + 2 * i, 2);
        ok = h == triad_detail::half_bits(want);
      } else {
        ok = static_cast<const float*>(a_)[i] == want;
      }
      if (!ok) throw std::runtime_error("[triad] wrong result at " + std::to_string(i));
    }
  }

 private:
  size_t out_bytes() const { return half_ ? 2 : 4; }
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
  int reads_;
  bool half_;
  int threads_;
  tbb::task_arena arena_;
  void* a_ = nullptr;
  float *b_ = nullptr, *c_ = nullptr, *d_ = nullptr;
  triad_detail::PartFn part_ = nullptr;
  const char* isa_ = "SSE2";
  double best_[2] = {1e30, 1e30};
};

/** Times of `sides` and the triad in rounds (interleaved). */
struct Rounds {
  std::vector<std::vector<double>> ms;  ///< ms[side][round]: the better of the side's two runs in the round
  double triad_ms = 1e30;               ///< the triad's best (Triad::once_ms) over the rounds
  double mix_ms = 1e30;                 ///< the same-mix stream's best over the rounds (interleaved's `mix`)
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
 *  where two runs a round read 0.94-1.01 in the same minutes. With `mix`, that stream runs after the triad each
 *  round, the same way. */
inline Rounds interleaved(Triad& triad, const std::vector<std::function<void()>>& sides, int rounds, Triad* mix = nullptr) {
  Rounds r;
  r.ms.resize(sides.size());
  for (int k = 0; k < rounds; k++) {
    r.triad_ms = std::min(r.triad_ms, triad.once_ms());
    if (mix) r.mix_ms = std::min(r.mix_ms, mix->once_ms());
    for (size_t s = 0; s < sides.size(); s++) r.ms[s].push_back(best_ms(sides[s], 2));
  }
  return r;
}

}  // namespace bench
