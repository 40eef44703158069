// Keccak (SHA-3, SHAKE) over a tensor's bytes and tinygrad's tree hash: uint64 xors, shifts and a lane gather
// (tinygrad's keccak, https://keccak.team/keccak_specs_summary.html), one kernel per round of the permutation.
#include <array>

#include "ops_util.hpp"

namespace tg {
using namespace detail;

namespace {
Tensor u64(uint64_t v, const std::string& dev) { return Tensor(UOp::cnst_int(dtypes::uint64, int64_t(v)), {}, dev); }

// (..., n) of any dtype -> (..., n * itemsize) uint8, little-endian (the bytes in memory).
Tensor to_bytes(const Tensor& t) {
  int64_t sz = t.dtype().itemsize();
  if (sz == 1) return t.dtype() == dtypes::uint8 ? t : t.bitcast(dtypes::uint8);
  DType u = sz == 2 ? dtypes::uint16 : sz == 4 ? dtypes::uint32 : dtypes::uint64;
  if (sz != 2 && sz != 4 && sz != 8) fail("keccak", "cannot take the bytes of " + t.dtype().name());
  Tensor x = t.bitcast(u).cast(dtypes::uint64).unsqueeze(-1);
  std::vector<uint64_t> sh;
  for (int64_t b = 0; b < sz; b++) sh.push_back(uint64_t(8 * b));
  Tensor shifts = Tensor::from_vector(sh, {sz}, t.device());
  Tensor bytes = ((x >> shifts) & u64(0xff, t.device())).cast(dtypes::uint8);  // (..., n, sz)
  return bytes.flatten(-2, -1);
}

// (..., 8k) uint8 -> (..., k) uint64, little-endian.
Tensor to_u64(const Tensor& bytes) {
  Shape s = bytes.shape();
  s.back() /= 8;
  s.push_back(8);
  std::vector<uint64_t> sh;
  for (int b = 0; b < 8; b++) sh.push_back(uint64_t(8 * b));
  Tensor shifts = Tensor::from_vector(sh, {8}, bytes.device());
  return (bytes.reshape(s).cast(dtypes::uint64) << shifts).sum(-1);  // disjoint bits: the sum is the or
}

constexpr std::array<uint64_t, 24> kRoundConst = {
    1, 0x8082, 0x800000000000808a, 0x8000000080008000, 0x808b, 0x80000001, 0x8000000080008081, 0x8000000000008009,
    0x8a, 0x88, 0x80008009, 0x8000000a, 0x8000808b, 0x800000000000008b, 0x8000000000008089, 0x8000000000008003,
    0x8000000000008002, 0x8000000000000080, 0x800a, 0x800000008000000a, 0x8000000080008081, 0x8000000000008080,
    0x80000001, 0x8000000080008008};
// The pi step as a gather of lanes (lane x + 5y), and each lane's rho rotation after it.
constexpr std::array<int32_t, 25> kPi = {0, 6, 12, 18, 24, 3, 9, 10, 16, 22, 1, 7, 13, 19, 20, 4, 5, 11, 17, 23, 2, 8, 14, 15, 21};
constexpr std::array<uint64_t, 25> kRho = {0,  44, 43, 21, 14, 28, 20, 3,  45, 61, 1,  6, 25,
                                           8,  18, 27, 36, 10, 15, 56, 62, 55, 39, 41, 2};

Tensor rotl(const Tensor& x, const Tensor& r, const std::string& dev) {  // r in [0, 64): (64 - r) & 63 keeps r = 0 defined
  return (x << r) | (x >> ((u64(64, dev) - r) & u64(63, dev)));
}

// keccak-f[1600] on a (rows, 25) uint64 state.
Tensor f1600(Tensor state, const std::string& dev) {
  int64_t bs = state.shape()[0];
  Tensor pi = Tensor::from_vector(std::vector<int32_t>(kPi.begin(), kPi.end()), {25}, dev);
  Tensor rho = Tensor::from_vector(std::vector<uint64_t>(kRho.begin(), kRho.end()), {25}, dev);
  Tensor one = u64(1, dev);
  for (int i = 0; i < 24; i++) {
    // theta: each lane xor the parities of the columns left and right of it (the right one rotated by 1)
    Tensor p = state.reshape({bs, 5, 5});  // [b, y, x]
    Tensor c = p.shrink({{0, bs}, {0, 1}, {0, 5}});
    for (int64_t y = 1; y < 5; y++) c = c ^ p.shrink({{0, bs}, {y, y + 1}, {0, 5}});  // (bs, 1, 5)
    Tensor d = c.roll(1, 2) ^ rotl(c.roll(-1, 2), one, dev);
    state = (p ^ d).reshape({bs, 25});
    // rho and pi
    state = rotl(state.index_select(1, pi), rho, dev).reshape({bs, 5, 5});
    // chi and iota
    state = state ^ (~state.roll(-1, 2) & state.roll(-2, 2));
    std::vector<uint64_t> rc(25, 0);
    rc[0] = kRoundConst[size_t(i)];
    state = (state.reshape({bs, 25}) ^ Tensor::from_vector(rc, {25}, dev)).contiguous();
  }
  return state;
}
}  // namespace

Tensor Tensor::keccak(const std::string& cfg) const {
  if (cfg == "sha3_224") return keccak(144, 6);
  if (cfg == "sha3_256") return keccak(136, 6);
  if (cfg == "shake_128") return keccak(168, 31);
  fail("keccak", "cfg must be \"sha3_224\", \"sha3_256\" or \"shake_128\", got \"" + cfg + "\"");
}

Tensor Tensor::keccak(int64_t rate, int64_t dsbyte) const {
  if (ndim() < 1) fail("keccak", "needs at least 1 dim (the message is the last), got a 0-d tensor");
  if (rate <= 0 || rate >= 200 || rate % 8 != 0 || dsbyte < 1 || dsbyte > 255)
    fail("keccak", "rate " + std::to_string(rate) + " must be a multiple of 8 below 200 and dsbyte " + std::to_string(dsbyte) + " a byte");
  const std::string& dev = device();
  Shape lead(shape().begin(), shape().end() - 1);
  int64_t rows = 1;
  for (int64_t v : lead) rows *= v;
  Tensor data = to_bytes(*this).reshape({rows, -1});
  int64_t len = data.shape()[1], pad = rate - len % rate, blocks = (len + pad) / rate;
  // the message, its padding bytes (dsbyte ... 0x80) xored in, each rate-byte block widened to the 200-byte state
  data = data.pad({{0, 0}, {0, pad}}).reshape({rows, blocks, rate}).pad({{0, 0}, {0, 0}, {0, 200 - rate}});
  std::vector<uint8_t> mask(size_t(blocks * 200), 0);
  size_t last = size_t((blocks - 1) * 200 + rate - pad);
  mask[last] = uint8_t(dsbyte);
  mask[size_t((blocks - 1) * 200 + rate - 1)] ^= 0x80;
  data = (data.reshape({rows, blocks * 200}) ^ Tensor::from_vector(mask, {blocks * 200}, dev)).reshape({rows, blocks, 200});
  Tensor lanes = to_u64(data);  // (rows, blocks, 25)
  Tensor state = Tensor::zeros({rows, 25}, dtypes::uint64, dev);
  for (int64_t k = 0; k < blocks; k++) state = f1600(state ^ lanes.shrink({{0, rows}, {k, k + 1}, {0, 25}}).reshape({rows, 25}), dev);
  int64_t out = (200 - rate) / 2;
  Shape os = lead;
  os.push_back(out);
  return to_bytes(state).shrink({{0, rows}, {0, out}}).reshape(os);
}

namespace {
Tensor hash_1mb(const Tensor& x) {  // (B, 2^20) bytes -> (B, 16)
  int64_t b = x.shape()[0];
  return x.reshape({-1, 4096}).keccak("shake_128").reshape({b, -1}).keccak("shake_128");
}
}  // namespace

Tensor Tensor::hash() const {
  constexpr int64_t kMb = int64_t(1) << 20;
  Tensor data = to_bytes(ndim() == 0 ? reshape({1}) : flatten());
  int64_t n = data.shape()[0], chunks = std::max<int64_t>(1, (n + kMb - 1) / kMb);
  while (chunks > 1) {  // hash each MiB to 16 bytes until one MiB holds them all
    data = hash_1mb(data.pad_to({chunks * kMb}).reshape({chunks, kMb})).flatten();
    chunks = (chunks + 65535) / 65536;
  }
  return hash_1mb(data.pad_to({kMb}).unsqueeze(0)).flatten();
}

}  // namespace tg
