// GGUF (llama.cpp's model format, v2/v3): header, metadata key/values, tensor infos, then aligned tensor data.
// Every count, length and offset is checked against the bytes left before anything is read or allocated; quantised
// blocks are dequantised on the host with ggml's reference formulas (ggml-quants.c, dequantize_row_*). The writer
// quantises with the matching quantize_row_*_ref formulas.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "gguf_grids.hpp"
#include "mapped.hpp"
#include "tg/env.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"
#include "tg/nn/state.hpp"

namespace tg::nn {

namespace {

using VT = GGUFValue::Type;

const char* value_type_name(VT t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool",  "string", "array", "uint64", "int64", "float64"};
  return uint32_t(t) < 13 ? names[uint32_t(t)] : "unknown";
}

// ggml tensor types: block size (elements) and bytes per block; size 0 = not supported here.
struct GgmlType {
  const char* name;
  uint64_t block, bytes;
};
GgmlType ggml_type(uint32_t t) {
  switch (t) {
    case 0: return {"f32", 1, 4};
    case 1: return {"f16", 1, 2};
    case 2: return {"q4_0", 32, 18};
    case 3: return {"q4_1", 32, 20};
    case 6: return {"q5_0", 32, 22};
    case 7: return {"q5_1", 32, 24};
    case 8: return {"q8_0", 32, 34};
    case 9: return {"q8_1", 0, 0};
    case 10: return {"q2_K", 256, 84};
    case 11: return {"q3_K", 256, 110};
    case 12: return {"q4_K", 256, 144};
    case 13: return {"q5_K", 256, 176};
    case 14: return {"q6_K", 256, 210};
    case 15: return {"q8_K", 0, 0};
    case 20: return {"iq4_nl", 32, 18};
    case 23: return {"iq4_xs", 256, 136};
    case 24: return {"i8", 1, 1};
    case 25: return {"i16", 1, 2};
    case 26: return {"i32", 1, 4};
    case 27: return {"i64", 1, 8};
    case 28: return {"f64", 1, 8};
    case 30: return {"bf16", 1, 2};
    case 39: return {"mxfp4", 32, 17};
    case 41: return {"q1_0", 128, 18};
    case 16: return {"iq2_xxs", 256, 66};
    case 17: return {"iq2_xs", 256, 74};
    case 18: return {"iq3_xxs", 256, 98};
    case 19: return {"iq1_s", 256, 50};
    case 21: return {"iq3_s", 256, 110};
    case 22: return {"iq2_s", 256, 82};
    case 29: return {"iq1_m", 256, 56};
    default: return {nullptr, 0, 0};
  }
}

// The dtype of a type stored one element at a time (f32, f16, bf16, the ints, f64); uint8 (the blocks) otherwise.
DType element_dtype(uint32_t t) {
  switch (t) {
    case 0: return dtypes::float32;
    case 1: return dtypes::float16;
    case 24: return dtypes::int8;
    case 25: return dtypes::int16;
    case 26: return dtypes::int32;
    case 27: return dtypes::int64;
    case 28: return dtypes::float64;
    case 30: return dtypes::bfloat16;
    default: return dtypes::uint8;
  }
}

// ggml's integer and float64 types are data, not weights: they keep their dtype even when the rest is dequantised.
bool keeps_dtype(uint32_t t) { return t >= 24 && t <= 28; }

struct Reader {
  const uint8_t* p;
  size_t n;
  size_t off = 0;
  const std::string& path;

  [[noreturn]] void bad(const std::string& why) const { throw Error("[gguf_load] " + path + ": " + why); }
  size_t left() const { return n - off; }
  template <class T>
  T get(const std::string& what) {
    if (left() < sizeof(T))
      bad("the file ends inside " + what + " (offset " + std::to_string(off) + " of " + std::to_string(n) + " bytes)");
    T v;
    std::memcpy(&v, p + off, sizeof(T));  // GGUF is little-endian, as is every host tg runs on
    off += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    uint64_t len = get<uint64_t>("the length of " + what);
    if (len > left())
      bad(what + " has length " + std::to_string(len) + ", past the end of the file (" + std::to_string(left()) + " bytes left)");
    std::string s(reinterpret_cast<const char*>(p + off), size_t(len));
    off += size_t(len);
    return s;
  }
};

// Fewest bytes one value of a type takes in the file (bounds an array's count before reading it).
uint64_t min_bytes(VT t) {
  switch (t) {
    case VT::UINT8: case VT::INT8: case VT::BOOL: return 1;
    case VT::UINT16: case VT::INT16: return 2;
    case VT::UINT32: case VT::INT32: case VT::FLOAT32: return 4;
    case VT::ARRAY: return 12;
    default: return 8;  // 64-bit values, strings (their length)
  }
}

GGUFValue read_value(Reader& r, VT t, const std::string& key, int depth) {
  GGUFValue v;
  v.type = t;
  std::string what = "the value of '" + key + "'";
  switch (t) {
    case VT::UINT8: v.value = uint64_t(r.get<uint8_t>(what)); break;
    case VT::INT8: v.value = int64_t(r.get<int8_t>(what)); break;
    case VT::UINT16: v.value = uint64_t(r.get<uint16_t>(what)); break;
    case VT::INT16: v.value = int64_t(r.get<int16_t>(what)); break;
    case VT::UINT32: v.value = uint64_t(r.get<uint32_t>(what)); break;
    case VT::INT32: v.value = int64_t(r.get<int32_t>(what)); break;
    case VT::UINT64: v.value = r.get<uint64_t>(what); break;
    case VT::INT64: v.value = r.get<int64_t>(what); break;
    case VT::FLOAT32: v.value = double(r.get<float>(what)); break;
    case VT::FLOAT64: v.value = r.get<double>(what); break;
    case VT::BOOL: {
      uint8_t b = r.get<uint8_t>(what);
      if (b > 1) r.bad("bool value of '" + key + "' is " + std::to_string(b) + ", expected 0 or 1");
      v.value = b == 1;
      break;
    }
    case VT::STRING: v.value = r.str(what); break;
    case VT::ARRAY: {
      if (depth >= 4) r.bad("arrays nested more than 4 deep in '" + key + "'");
      uint32_t et = r.get<uint32_t>("the element type of '" + key + "'");
      if (et > 12) r.bad("array '" + key + "' has unknown element type " + std::to_string(et));
      v.elem_type = VT(et);
      uint64_t count = r.get<uint64_t>("the length of array '" + key + "'");
      if (count > r.left() / min_bytes(v.elem_type))
        r.bad("array '" + key + "' claims " + std::to_string(count) + " " + value_type_name(v.elem_type) +
              " elements, more than the " + std::to_string(r.left()) + " bytes left can hold");
      std::vector<GGUFValue> a;
      a.reserve(size_t(count));
      for (uint64_t i = 0; i < count; i++) a.push_back(read_value(r, v.elem_type, key, depth + 1));
      v.value = std::move(a);
      break;
    }
    default: r.bad("'" + key + "' has unknown value type " + std::to_string(uint32_t(t)));
  }
  return v;
}

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: dims[0] is contiguous
  uint32_t type;
  uint64_t offset, nelem = 1, nbytes = 0;
};

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of a q4_K/q5_K block
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ggml's non-linear 4-bit codebooks (ggml-common.h): iq4_nl/iq4_xs, and mxfp4's e2m1 values doubled (its scale is
// halved to match: GGML_E8M0_TO_FP32_HALF)
constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// GGML_E8M0_TO_FP32_HALF: 2^(e - 128), the denormals 2^-128 and 2^-127 for e = 0 and 1
float e8m0_half(uint8_t e) {
  uint32_t b = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

void dequantize(const uint8_t* src, const TensorInfo& t, float* y) {
  auto f16 = [](const uint8_t* q) {
    uint16_t h;
    std::memcpy(&h, q, 2);
    return half_bits_to_float(h);
  };
  uint64_t nb = t.nelem / ggml_type(t.type).block;
  switch (t.type) {
    case 0: std::memcpy(y, src, size_t(t.nelem) * 4); break;
    case 1: for (uint64_t i = 0; i < t.nelem; i++) y[i] = f16(src + 2 * i); break;
    case 30:
      for (uint64_t i = 0; i < t.nelem; i++) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        y[i] = bf16_bits_to_float(b);
      }
      break;
    case 8:  // q8_0: d (f16), 32 x int8; y = q * d
      for (uint64_t i = 0; i < nb; i++, src += 34, y += 32) {
        float d = f16(src);
        for (int j = 0; j < 32; j++) y[j] = float(int8_t(src[2 + j])) * d;
      }
      break;
    case 2:  // q4_0: d (f16), 16 bytes of nibbles; low nibbles are elements 0..15, high ones 16..31; y = (q - 8) * d
      for (uint64_t i = 0; i < nb; i++, src += 18, y += 32) {
        float d = f16(src);
        for (int j = 0; j < 16; j++) {
          y[j] = float((src[2 + j] & 0x0F) - 8) * d;
          y[j + 16] = float((src[2 + j] >> 4) - 8) * d;
        }
      }
      break;
    case 3:  // q4_1: d, m (f16), 16 bytes of nibbles; y = q * d + m
      for (uint64_t i = 0; i < nb; i++, src += 20, y += 32) {
        float d = f16(src), m = f16(src + 2);
        for (int j = 0; j < 16; j++) {
          y[j] = float(src[4 + j] & 0x0F) * d + m;
          y[j + 16] = float(src[4 + j] >> 4) * d + m;
        }
      }
      break;
    case 6:  // q5_0: d (f16), qh (32 high bits, little-endian), 16 bytes of nibbles; y = ((q | h << 4) - 16) * d
    case 7:  // q5_1: d, m (f16), qh, 16 bytes of nibbles; y = (q | h << 4) * d + m
      for (uint64_t i = 0, bytes = t.type == 6 ? 22 : 24; i < nb; i++, src += bytes, y += 32) {
        float d = f16(src), m = t.type == 7 ? f16(src + 2) : 0.f;
        const uint8_t* q = src + bytes - 20;
        uint32_t qh;
        std::memcpy(&qh, q, 4);
        for (int j = 0; j < 16; j++) {
          int x0 = (q[4 + j] & 0x0F) | int(((qh >> j) << 4) & 0x10), x1 = (q[4 + j] >> 4) | int((qh >> (j + 12)) & 0x10);
          y[j] = t.type == 6 ? float(x0 - 16) * d : float(x0) * d + m;
          y[j + 16] = t.type == 6 ? float(x1 - 16) * d : float(x1) * d + m;
        }
      }
      break;
    case 20:  // iq4_nl: d (f16), 16 bytes of nibbles indexing kvalues_iq4nl; y = d * kvalues[q]
      for (uint64_t i = 0; i < nb; i++, src += 18, y += 32) {
        float d = f16(src);
        for (int j = 0; j < 16; j++) {
          y[j] = d * float(kvalues_iq4nl[src[2 + j] & 0xF]);
          y[j + 16] = d * float(kvalues_iq4nl[src[2 + j] >> 4]);
        }
      }
      break;
    case 23:  // iq4_xs: d (f16), scales_h (u16), scales_l[4], qs[128]; sub-block ib of 32: 6-bit scale ls,
              // y = (d * (ls - 32)) * kvalues_iq4nl[q]
      for (uint64_t i = 0; i < nb; i++, src += 136) {
        float d = f16(src);
        uint16_t sh;
        std::memcpy(&sh, src + 2, 2);
        const uint8_t* q = src + 8;
        for (int ib = 0; ib < 8; ib++, y += 32, q += 16) {
          int ls = ((src[4 + ib / 2] >> 4 * (ib % 2)) & 0xF) | (((sh >> 2 * ib) & 3) << 4);
          float dl = d * float(ls - 32);
          for (int j = 0; j < 16; j++) {
            y[j] = dl * float(kvalues_iq4nl[q[j] & 0xF]);
            y[j + 16] = dl * float(kvalues_iq4nl[q[j] >> 4]);
          }
        }
      }
      break;
    case 39:  // mxfp4: e (E8M0 exponent), 16 bytes of e2m1 nibbles; y = kvalues_mxfp4[q] * 2^(e - 128)
      for (uint64_t i = 0; i < nb; i++, src += 17, y += 32) {
        float d = e8m0_half(src[0]);
        for (int j = 0; j < 16; j++) {
          y[j] = float(kvalues_mxfp4[src[1 + j] & 0xF]) * d;
          y[j + 16] = float(kvalues_mxfp4[src[1 + j] >> 4]) * d;
        }
      }
      break;
    case 12:  // q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; y = d*sc*q - dmin*m
      for (uint64_t i = 0; i < nb; i++, src += 144) {
        float d = f16(src), dmin = f16(src + 2);
        const uint8_t* sc = src + 4;
        const uint8_t* q = src + 16;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
          uint8_t s1, m1, s2, m2;
          scale_min_k4(is, sc, s1, m1);
          scale_min_k4(is + 1, sc, s2, m2);
          float d1 = d * float(s1), mm1 = dmin * float(m1), d2 = d * float(s2), mm2 = dmin * float(m2);
          for (int l = 0; l < 32; l++) *y++ = d1 * float(q[l] & 0xF) - mm1;
          for (int l = 0; l < 32; l++) *y++ = d2 * float(q[l] >> 4) - mm2;
        }
      }
      break;
    case 13:  // q5_K: as q4_K, with a fifth bit per element in qh[32] (bit 2j / 2j+1 of qh[l] for chunk j)
      for (uint64_t i = 0; i < nb; i++, src += 176) {
        float d = f16(src), dmin = f16(src + 2);
        const uint8_t* sc = src + 4;
        const uint8_t* qh = src + 16;
        const uint8_t* ql = src + 48;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2)) {
          uint8_t s1, m1, s2, m2;
          scale_min_k4(is, sc, s1, m1);
          scale_min_k4(is + 1, sc, s2, m2);
          float d1 = d * float(s1), mm1 = dmin * float(m1), d2 = d * float(s2), mm2 = dmin * float(m2);
          for (int l = 0; l < 32; l++) *y++ = d1 * float((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - mm1;
          for (int l = 0; l < 32; l++) *y++ = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - mm2;
        }
      }
      break;
    case 14:  // q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales, d (f16); y = d * scale * (q - 32)
      for (uint64_t i = 0; i < nb; i++, src += 210) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        float d = f16(src + 208);
        for (int n = 0; n < 256; n += 128) {
          for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * float(sc[is]) * float(q1);
            y[l + 32] = d * float(sc[is + 2]) * float(q2);
            y[l + 64] = d * float(sc[is + 4]) * float(q3);
            y[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
          y += 128;
          ql += 64;
          qh += 32;
          sc += 8;
        }
      }
      break;
    // The IQ types: each group of 8 (or 4) elements is a lattice point, an index into a ggml grid (gguf_grids.hpp)
    // whose bytes are the magnitudes, with signs from a 7-bit code (ksigns_iq2xs: the 8th sign makes the count of
    // minus signs even) or from a bit per element; a 4-bit (or 3-bit) scale per sub-block.
    case 16:  // iq2_xxs: d (f16), per 32 elements two u32: 4 grid indices (bytes) and 4 7-bit sign codes + a 4-bit scale
      for (uint64_t i = 0; i < nb; i++, src += 66) {
        float d = f16(src);
        for (int ib = 0; ib < 8; ib++) {
          uint32_t aux[2];
          std::memcpy(aux, src + 2 + 8 * ib, 8);
          float db = d * (0.5f + float(aux[1] >> 28)) * 0.25f;
          for (int l = 0; l < 4; l++, y += 8) {
            uint64_t g = ggml_grids::iq2xxs_grid[(aux[0] >> 8 * l) & 0xFF];
            uint8_t signs = ggml_grids::ksigns_iq2xs[(aux[1] >> 7 * l) & 127];
            for (int j = 0; j < 8; j++) y[j] = db * float((g >> 8 * j) & 0xFF) * (signs >> j & 1 ? -1.f : 1.f);
          }
        }
      }
      break;
    case 17:  // iq2_xs: d (f16), 32 u16 (9-bit grid index | 7-bit sign code << 9), 8 bytes of two 4-bit scales
      for (uint64_t i = 0; i < nb; i++, src += 74) {
        float d = f16(src);
        for (int ib = 0; ib < 8; ib++) {
          uint8_t sc = src[66 + ib];
          float db[2] = {d * (0.5f + float(sc & 0xF)) * 0.25f, d * (0.5f + float(sc >> 4)) * 0.25f};
          for (int l = 0; l < 4; l++, y += 8) {
            uint16_t q;
            std::memcpy(&q, src + 2 + 2 * (4 * ib + l), 2);
            uint64_t g = ggml_grids::iq2xs_grid[q & 511];
            uint8_t signs = ggml_grids::ksigns_iq2xs[q >> 9];
            for (int j = 0; j < 8; j++) y[j] = db[l / 2] * float((g >> 8 * j) & 0xFF) * (signs >> j & 1 ? -1.f : 1.f);
          }
        }
      }
      break;
    case 22:  // iq2_s: d (f16), qs[32] (grid index low bits), signs[32] (a bit per element), qh[8] (2 high bits per
              // index), scales[8] (two 4-bit scales)
      for (uint64_t i = 0; i < nb; i++, src += 82) {
        float d = f16(src);
        const uint8_t *qs = src + 2, *signs = src + 34, *qh = src + 66, *scales = src + 74;
        for (int ib = 0; ib < 8; ib++) {
          float db[2] = {d * (0.5f + float(scales[ib] & 0xF)) * 0.25f, d * (0.5f + float(scales[ib] >> 4)) * 0.25f};
          for (int l = 0; l < 4; l++, y += 8) {
            uint64_t g = ggml_grids::iq2s_grid[qs[4 * ib + l] | ((qh[ib] << (8 - 2 * l)) & 0x300)];
            uint8_t sg = signs[4 * ib + l];
            for (int j = 0; j < 8; j++) y[j] = db[l / 2] * float((g >> 8 * j) & 0xFF) * (sg >> j & 1 ? -1.f : 1.f);
          }
        }
      }
      break;
    case 18:  // iq3_xxs: d (f16), qs[64] (grid indices, 4 values each), per 32 elements a u32 of 4 7-bit sign codes +
              // a 4-bit scale
      for (uint64_t i = 0; i < nb; i++, src += 98) {
        float d = f16(src);
        const uint8_t* qs = src + 2;
        for (int ib = 0; ib < 8; ib++, qs += 8) {
          uint32_t aux;
          std::memcpy(&aux, src + 66 + 4 * ib, 4);
          float db = d * (0.5f + float(aux >> 28)) * 0.5f;
          for (int l = 0; l < 4; l++, y += 8) {
            uint8_t signs = ggml_grids::ksigns_iq2xs[(aux >> 7 * l) & 127];
            uint32_t g1 = ggml_grids::iq3xxs_grid[qs[2 * l]], g2 = ggml_grids::iq3xxs_grid[qs[2 * l + 1]];
            for (int j = 0; j < 4; j++) {
              y[j] = db * float((g1 >> 8 * j) & 0xFF) * (signs >> j & 1 ? -1.f : 1.f);
              y[j + 4] = db * float((g2 >> 8 * j) & 0xFF) * (signs >> (j + 4) & 1 ? -1.f : 1.f);
            }
          }
        }
      }
      break;
    case 21:  // iq3_s: d (f16), qs[64] (grid index low bits), qh[8] (a 9th bit per index), signs[32], scales[4]
              // (two 4-bit scales s: 1 + 2s)
      for (uint64_t i = 0; i < nb; i++, src += 110) {
        float d = f16(src);
        const uint8_t *qs = src + 2, *qh = src + 66, *signs = src + 74, *scales = src + 106;
        for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
          float db = d * float(1 + 2 * ((scales[ib / 2] >> 4 * (ib % 2)) & 0xF));
          for (int l = 0; l < 4; l++, y += 8) {
            uint32_t g1 = ggml_grids::iq3s_grid[qs[2 * l] | ((qh[ib] << (8 - 2 * l)) & 256)];
            uint32_t g2 = ggml_grids::iq3s_grid[qs[2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256)];
            for (int j = 0; j < 4; j++) {
              y[j] = db * float((g1 >> 8 * j) & 0xFF) * (signs[l] >> j & 1 ? -1.f : 1.f);
              y[j + 4] = db * float((g2 >> 8 * j) & 0xFF) * (signs[l] >> (j + 4) & 1 ? -1.f : 1.f);
            }
          }
        }
      }
      break;
    case 19:  // iq1_s: d (f16), qs[32] (grid index low bits), qh[8] u16 (4 x 3 high index bits, a 3-bit scale s,
              // the sign of delta); y = (d * (2s + 1)) * (grid value (-1, 0, 1) + delta)
      for (uint64_t i = 0; i < nb; i++, src += 50) {
        float d = f16(src);
        const uint8_t* qs = src + 2;
        for (int ib = 0; ib < 8; ib++, qs += 4) {
          uint16_t qh;
          std::memcpy(&qh, src + 34 + 2 * ib, 2);
          float dl = d * float(2 * ((qh >> 12) & 7) + 1);
          float delta = qh & 0x8000 ? -ggml_grids::iq1s_delta : ggml_grids::iq1s_delta;
          for (int l = 0; l < 4; l++, y += 8) {
            uint64_t g = ggml_grids::iq1s_grid[qs[l] | (((qh >> 3 * l) & 7) << 8)];
            for (int j = 0; j < 8; j++) y[j] = dl * (float(int8_t(g >> 8 * j)) + delta);
          }
        }
      }
      break;
    case 29:  // iq1_m: qs[32] (grid index low bits), qh[16] (per 8 elements 3 high index bits and the sign of delta),
              // scales[8] (4 u16: 3-bit scales, and the 4 top bits of each make d's f16 bits)
      for (uint64_t i = 0; i < nb; i++, src += 56) {
        uint16_t sc[4];
        std::memcpy(sc, src + 48, 8);
        uint16_t dbits = uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        float d = half_bits_to_float(dbits);
        const uint8_t *qs = src, *qh = src + 32;
        for (int ib = 0; ib < 8; ib++, qs += 4, qh += 2) {
          float dl[2] = {d * float(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                         d * float(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
          for (int l = 0; l < 4; l++, y += 8) {
            uint8_t h = uint8_t(qh[l / 2] >> 4 * (l % 2));  // 3 high index bits, then the sign of delta
            uint64_t g = ggml_grids::iq1s_grid[qs[l] | ((h & 7) << 8)];
            float delta = h & 0x08 ? -ggml_grids::iq1s_delta : ggml_grids::iq1s_delta;
            for (int j = 0; j < 8; j++) y[j] = dl[l / 2] * (float(int8_t(g >> 8 * j)) + delta);
          }
        }
      }
      break;
    case 41:  // q1_0: d (f16), 16 bytes of sign bits, element j = bit j%8 of byte j/8; y = bit ? d : -d
      for (uint64_t i = 0; i < nb; i++, src += 18, y += 128) {
        float d = f16(src);
        for (int j = 0; j < 128; j++) y[j] = (src[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
      }
      break;
    case 10:  // q2_K: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin (f16); sub-block s of 16:
              // y = (d * sc[s]) * q - dmin * m[s], q = 2 bits of qs
    case 11:  // q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, d (f16); y = (d * (sc[s] - 32)) * (q - (h ? 0 : 4))
      for (uint64_t i = 0; i < nb; i++) {
        bool three = t.type == 11;
        const uint8_t* hm = src;
        const uint8_t* q = src + (three ? 32 : 16);
        const uint8_t* sc = three ? src + 96 : src;
        float d = f16(src + (three ? 108 : 80)), dmin = three ? 0.f : f16(src + 82);
        // half h, shift j, k: sub-block s = 8h + 2j + k, elements 128h + 32j + 16k + l from qs[32h + 16k + l] >> 2j,
        // q3_K's high bit from bit 4h + j of hmask[16k + l]
        for (int h = 0; h < 2; h++)
          for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) {
              int s = 8 * h + 2 * j + k;
              const uint8_t* qq = q + 32 * h + 16 * k;
              if (three) {
                int ls = ((sc[s % 8] >> 4 * (s / 8)) & 0xF) | (((sc[8 + s % 4] >> 2 * (s / 4)) & 3) << 4);
                float dl = d * float(ls - 32);
                for (int l = 0; l < 16; l++)
                  *y++ = dl * float(((qq[l] >> 2 * j) & 3) - ((hm[16 * k + l] >> (4 * h + j)) & 1 ? 0 : 4));
              } else {
                float dl = d * float(sc[s] & 0xF), ml = dmin * float(sc[s] >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * float((qq[l] >> 2 * j) & 3) - ml;
              }
            }
        src += three ? 110 : 84;
      }
      break;
  }
}

GGUFFile parse(const Bytes& f, const std::string& path, const std::string& device, bool dequantise) {
  Reader r{f.p, f.n, 0, path};
  uint8_t magic[4];
  for (uint8_t& m : magic) m = r.get<uint8_t>("the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) r.bad("not a GGUF file (the magic is not \"GGUF\")");
  GGUFFile out;
  out.version = r.get<uint32_t>("the version");
  if (out.version != 2 && out.version != 3)
    r.bad("GGUF version " + std::to_string(out.version) + " is not supported (versions 2 and 3 are)");
  uint64_t n_tensors = r.get<uint64_t>("the tensor count");
  uint64_t n_kv = r.get<uint64_t>("the metadata count");
  if (n_kv > r.left() / 13)
    r.bad("the header claims " + std::to_string(n_kv) + " metadata entries, more than the file can hold");
  for (uint64_t i = 0; i < n_kv; i++) {
    std::string key = r.str("metadata key " + std::to_string(i));
    uint32_t t = r.get<uint32_t>("the value type of '" + key + "'");
    if (t > 12) r.bad("'" + key + "' has unknown value type " + std::to_string(t));
    GGUFValue v = read_value(r, VT(t), key, 0);
    if (!out.metadata.emplace(key, std::move(v)).second) r.bad("metadata key '" + key + "' appears twice");
  }
  uint64_t align = 32;
  if (auto it = out.metadata.find("general.alignment"); it != out.metadata.end()) {
    const GGUFValue& a = it->second;
    if (a.type != VT::UINT32) r.bad(std::string("general.alignment must be a uint32, it is a ") + value_type_name(a.type));
    align = std::get<uint64_t>(a.value);
    if (align == 0 || (align & (align - 1)) != 0) r.bad("general.alignment " + std::to_string(align) + " is not a power of two");
  }
  if (n_tensors > r.left() / 24)
    r.bad("the header claims " + std::to_string(n_tensors) + " tensors, more than the file can hold");
  std::vector<TensorInfo> infos;
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; i++) {
    TensorInfo t;
    t.name = r.str("the name of tensor " + std::to_string(i));
    if (!names.insert(t.name).second) r.bad("tensor '" + t.name + "' appears twice");
    uint32_t nd = r.get<uint32_t>("the dimension count of '" + t.name + "'");
    if (nd > 4) r.bad("tensor '" + t.name + "' has " + std::to_string(nd) + " dimensions, at most 4 are allowed");
    for (uint32_t d = 0; d < nd; d++) {
      uint64_t ne = r.get<uint64_t>("the dimensions of '" + t.name + "'");
      if (ne > uint64_t(INT64_MAX) || __builtin_mul_overflow(t.nelem, ne, &t.nelem) || t.nelem > uint64_t(INT64_MAX))
        r.bad("tensor '" + t.name + "' has too many elements (dimension " + std::to_string(ne) + ")");
      t.dims.push_back(ne);
    }
    t.type = r.get<uint32_t>("the type of '" + t.name + "'");
    t.offset = r.get<uint64_t>("the data offset of '" + t.name + "'");
    GgmlType gt = ggml_type(t.type);
    if (!gt.name) r.bad("tensor '" + t.name + "' has unknown ggml type " + std::to_string(t.type));
    if (gt.block == 0)
      r.bad("tensor '" + t.name + "' has type " + gt.name + ", which tg does not dequantise (f32, f16, bf16, f64, i8-i64, q1_0, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_nl, iq4_xs, mxfp4)");
    if ((t.dims.empty() ? 1 : t.dims[0]) % gt.block != 0)
      r.bad("tensor '" + t.name + "' (" + gt.name + ") has a first dimension of " + std::to_string(t.dims.empty() ? 1 : t.dims[0]) +
            ", not a multiple of the block size " + std::to_string(gt.block));
    if (t.nelem / gt.block > uint64_t(f.n) / gt.bytes)
      r.bad("tensor '" + t.name + "' (" + std::to_string(t.nelem) + " " + gt.name + " elements) is larger than the file (" +
            std::to_string(f.n) + " bytes)");
    t.nbytes = t.nelem / gt.block * gt.bytes;  // <= the file's size: no overflow
    if (t.offset % align != 0)
      r.bad("tensor '" + t.name + "' starts at offset " + std::to_string(t.offset) + ", not a multiple of the alignment " + std::to_string(align));
    infos.push_back(std::move(t));
  }
  uint64_t data_start = (uint64_t(r.off) + align - 1) / align * align;  // r.off < 2^63, align <= 2^32
  uint64_t data_size = data_start <= f.n ? f.n - data_start : 0;
  for (auto& t : infos)
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      r.bad("tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at data offset " + std::to_string(t.offset) +
            ") lies past the end of the file (" + std::to_string(data_size) + " data bytes)");
  std::vector<const TensorInfo*> by_off;
  for (auto& t : infos)
    if (t.nbytes) by_off.push_back(&t);
  std::stable_sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_off.size(); i++)
    if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes)
      r.bad("tensors '" + by_off[i - 1]->name + "' and '" + by_off[i]->name + "' overlap in the data section");
  Device& target = get_device(device.empty() ? default_device() : device);  // "" is the default device
  bool disk = !target.runs_kernels();
  // A device that computes in host memory (CPU, CPU:N) reads each tensor where the file's mapping holds it, as
  // llama.cpp does: no copy, so loading takes no time and the weights' pages are the page cache's. The mapping is
  // private and writable (map_file), so a write into a weight copies its pages and never reaches the file.
  bool host = f.owner && target.allocator().host_memory();
  if (disk && dequantise)
    r.bad("dequantised tensors cannot be placed on " + device + " (storage only): load them with dequantise = false");
  for (auto& t : infos) {
    Shape s(t.dims.rbegin(), t.dims.rend());
    out.tensor_types.emplace(t.name, ggml_type(t.type).name);
    out.shapes.emplace(t.name, s);
    const uint8_t* src = f.p + data_start + t.offset;
    if (dequantise && !keeps_dtype(t.type)) {
      std::vector<float> y(size_t(t.nelem));
      if (t.nelem) dequantize(src, t, y.data());
      out.tensors.emplace(t.name, Tensor::from_blob(y.data(), s, dtypes::float32, device));
      continue;
    }
    // as stored: f32/f16/bf16 in their dtype, quantised blocks as uint8 (..., blocks per row, bytes per block)
    GgmlType gt = ggml_type(t.type);
    DType dt = element_dtype(t.type);
    Shape rs = s;
    if (gt.block > 1) {
      if (rs.empty()) rs.push_back(1);
      rs.back() = int64_t(uint64_t(rs.back()) / gt.block);
      rs.push_back(int64_t(gt.bytes));
    }
    bool view = host && reinterpret_cast<uintptr_t>(src) % size_t(dt.itemsize()) == 0;  // element-aligned in the file
    if (!disk && !view) {
      out.tensors.emplace(t.name, Tensor::from_blob(src, rs, dt, device));
      continue;
    }
    std::string dev = target.name();
    auto buf = std::make_shared<Buffer>(dev, dt, size_t(t.nbytes) / size_t(dt.itemsize()), const_cast<uint8_t*>(src), f.owner);
    out.tensors.emplace(t.name, Tensor(UOp::make(Ops::RESHAPE, dt, {buffer_uop(std::move(buf))}, std::vector<int64_t>(rs)), rs, dev));
  }
  return out;
}

// ---- dequantisation as tensor ops (fused into the kernels that read the weights)

// Columns [b, e) of the last dim.
Tensor cols(const Tensor& x, int64_t b, int64_t e) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : x.shape()) r.emplace_back(0, d);
  r.back() = {b, e};
  return x.shrink(r);
}

// The little-endian f16 in bytes [s, s+2) of the last dim, as float32 with a last dim of 1.
Tensor f16_at(const Tensor& x, int64_t s) {
  Tensor lo = cols(x, s, s + 1).cast(dtypes::uint16), hi = cols(x, s + 1, s + 2).cast(dtypes::uint16);
  return lo.bitwise_or(hi.lshift(Tensor(8).cast(dtypes::uint16))).bitcast(dtypes::float16).cast(dtypes::float32);
}

// The 8/bits fields of `bits` bits in each byte of x (..., n), lowest first: (..., 8/bits, n), uint8.
Tensor unpack(const Tensor& x, int64_t bits) {
  int64_t k = 8 / bits;
  Tensor shifts = (Tensor::arange(k, dtypes::int32) * int(bits)).cast(dtypes::uint8).reshape({k, 1});
  return x.unsqueeze(-2).rshift(shifts).bitwise_and(Tensor((1 << bits) - 1).cast(dtypes::uint8));
}

// (..., a, b) -> (..., a*b)
Tensor merge_last(const Tensor& x) {
  Shape s = x.shape();
  int64_t b = s.back();
  s.pop_back();
  s.back() *= b;
  return x.reshape(s);
}

// The 8 6-bit scales and mins of a q4_K/q5_K block from its 12 packed bytes q (..., 12): (..., 8) each, float32.
std::pair<Tensor, Tensor> scale_min_k4_t(const Tensor& q) {
  Tensor a = cols(q, 0, 4), b = cols(q, 4, 8), c = cols(q, 8, 12);
  auto u8 = [](int v) { return Tensor(v).cast(dtypes::uint8); };
  Tensor sc = cat({a.bitwise_and(u8(63)), c.bitwise_and(u8(15)).bitwise_or(a.rshift(u8(6)).lshift(u8(4)))}, -1);
  Tensor m = cat({b.bitwise_and(u8(63)), c.rshift(u8(4)).bitwise_or(b.rshift(u8(6)).lshift(u8(4)))}, -1);
  return {sc.cast(dtypes::float32), m.cast(dtypes::float32)};
}

// The high bits of q5_0/q5_1 from the 4 bytes of qh (..., 4): bit j (little-endian) is element j's, (..., 32) uint8.
Tensor bits32(const Tensor& qh) { return merge_last(unpack(qh, 1).transpose(-1, -2)); }

// The 16-entry codebook `values` looked up by the 4-bit codes q (uint8): float32 of q's shape, as a chain of
// selects on constants (no table buffer), which fuses into the kernel that reads q.
Tensor lut16(const Tensor& q, const int8_t* values) {
  Tensor y = Tensor(float(values[15])).expand(q.shape());
  for (int c = 14; c >= 0; c--) y = q.eq(Tensor(c).cast(dtypes::uint8)).where(Tensor(float(values[c])), y);
  return y;
}

// The 32 nibble codes of a 16-byte run (..., 16): low nibbles are elements 0..15, high ones 16..31, (..., 32) uint8.
Tensor nibbles(const Tensor& x) { return merge_last(unpack(x, 4)); }

}  // namespace

int64_t ggml_tile_rows(const std::string& type, const std::string& device) {
  if ((type != "q8_0" && type != "q4_0") || getenv_int("INTERLEAVE_ROWS", 1) == 0) return 0;
  Device& dev = get_device(device.empty() ? default_device() : device);
  if (!dev.runs_kernels() || dev.renderer().grid_limits().threads != 0) return 0;  // not a serial CPU
  const MachineModel m = dev.machine();
  // x86 (AVX-512, AVX2): with TG_CPU=haswell on Zen 4 (bench/qmatvec 8192 x 2048, THREADS=1, from DRAM) 4 rows
  // interleaved read q8_0 at 1.90-1.98x the plain layout, q4_0 1.02-1.03x (its nibble decoding bounds it); NEON/SVE
  // unmeasured
  if (m.isa != "AVX-512" && m.isa.rfind("AVX2", 0) != 0) return 0;
  // mirrors the heuristic's register tile (src/codegen/opt/opt.cpp); tests/llm_tests.cpp checks the two agree
  const int64_t lanes = std::max(1, m.vector_bits / 32), part = std::min<int64_t>(type == "q8_0" ? 32 : 16, 2 * lanes);
  const int64_t per_row = std::max<int64_t>(1, part / lanes);
  int64_t rows = 1;
  while (rows * 2 <= 16 && rows * 2 * per_row <= m.vector_registers / 2) rows *= 2;
  return rows;
}

namespace {

// Whether a decode matvec reads weights of `type` faster interleaved by `rows` than as stored, timed on `device`:
// y = x W^T (one row of x, W 2048 x 2048, INT_DOT's integer block sums) over enough distinct weights that together
// they are twice the last-level cache (each product reads its weight from memory, as a decode step does), the two
// layouts alternated, the best of 4 rounds each after a warm-up round. Which one wins depends on how the CPU's
// prefetchers take the tile's row streams, not on its ISA: q8_0 interleaved by 8 read 1.9x the plain layout on a
// Zen 4 (13-18 GB/s walking 8 rows line by line) and 0.89x on a Zen 5 (18-21 GB/s plain; bench/qmatvec 8192 x 2048,
// QMV_MATS=64, THREADS=1, quiet).
bool interleave_measured_faster(const std::string& type, int64_t rows, const std::string& device) {
  const int64_t n = 2048, k = 2048, bytes = type == "q8_0" ? 34 : 18, mat_bytes = n * k / 32 * bytes;
  const MachineModel m = get_device(device).machine();
  const int64_t llc = std::max<int64_t>(m.l3_bytes, int64_t(8) << 20);
  const int64_t mats = std::clamp<int64_t>((2 * llc + mat_bytes - 1) / mat_bytes, 2, 64);
  std::mt19937 gen(1);
  std::vector<uint8_t> blocks(static_cast<size_t>(mat_bytes));
  std::vector<Tensor> w[2];
  for (int64_t i = 0; i < mats; i++) {
    for (auto& b : blocks) b = uint8_t(gen());
    for (size_t b = 0; b < blocks.size(); b += size_t(bytes)) blocks[b + 1] = uint8_t(0x18 + gen() % 9);  // f16 scales near 2^-3
    Tensor raw = Tensor::from_vector(blocks, {n, k / 32, bytes}, device).realize();
    w[0].push_back(ggml_dequantize(raw, type).reshape({n, k}).T());
    Tensor il = ggml_interleave_rows(raw, rows).realize();
    w[1].push_back(ggml_dequantize(ggml_interleaved_view(il, n), type).reshape({n, k}).T());
  }
  std::vector<float> xv(static_cast<size_t>(k));
  for (auto& v : xv) v = float(int(gen() % 2001) - 1000) / 1000.0f;
  Tensor x = Tensor::from_vector(xv, {1, k}, device).realize();
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < 5; round++)
    for (int layout = 0; layout < 2; layout++) {
      auto t0 = std::chrono::steady_clock::now();
      for (const Tensor& wt : w[layout]) x.matmul(wt).realize();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) best[layout] = std::min(best[layout], ms);
    }
  if (debug_level() >= 1)
    std::fprintf(stderr, "ggml_decode_interleave: %s, %lld weights of 2048 x 2048: as stored %.2f ms, interleaved by %lld %.2f ms\n",
                 type.c_str(), (long long)mats, best[0], (long long)rows, best[1]);
  return best[1] < best[0];
}

}  // namespace

int64_t ggml_decode_interleave(const std::string& type, const std::string& device) {
  const int64_t rows = ggml_tile_rows(type, device);
  if (rows < 2 || getenv_int("INTERLEAVE_ROWS", -1, -1, 1) == 1) return rows;
  const std::string dev = device.empty() ? default_device() : device;
  // the machine model's line, type and rows
  const std::string what = device_info(dev) + " " + type + " " + std::to_string(rows);
  return measured_once("ggml_decode_interleave_v1_", what, [&] { return interleave_measured_faster(type, rows, dev); }) ? rows : 0;
}

Tensor ggml_interleave_rows(const Tensor& raw, int64_t rows) {
  if (rows < 1) throw Error("[ggml_interleave_rows] rows must be at least 1, got " + std::to_string(rows));
  if (raw.dtype() != dtypes::uint8 || raw.ndim() != 3)
    throw Error("[ggml_interleave_rows] expected uint8 blocks (rows, blocks, bytes), got " + raw.dtype().name() + " " + shape_str(raw.shape()));
  const int64_t n = raw.shape()[0], nb = raw.shape()[1], bytes = raw.shape()[2], np = (n + rows - 1) / rows * rows;
  return raw.pad({{0, np - n}, {0, 0}, {0, 0}}).reshape({np / rows, rows, nb, bytes}).permute({0, 2, 1, 3}).contiguous();
}

Tensor ggml_interleaved_view(const Tensor& stored, int64_t n) {
  if (stored.ndim() != 4 || n < 0 || n > stored.shape()[0] * stored.shape()[2])
    throw Error("[ggml_interleaved_view] expected an interleaved copy (groups, blocks, rows, bytes) of at least " + std::to_string(n) +
                " rows, got " + shape_str(stored.shape()));
  const Shape& s = stored.shape();
  Tensor v = stored.permute({0, 2, 1, 3}).reshape({s[0] * s[2], s[1], s[3]});
  return n == s[0] * s[2] ? v : v.shrink({{0, n}, {0, s[1]}, {0, s[3]}});
}

Tensor ggml_dequantize(const Tensor& raw, const std::string& type) {
  auto need = [&](int64_t bytes) {
    if (raw.dtype() != dtypes::uint8 || raw.ndim() < 2 || raw.shape().back() != bytes)
      throw Error("[ggml_dequantize] " + type + " blocks must be uint8 (..., blocks, " + std::to_string(bytes) + "), got " +
                  raw.dtype().name() + " " + shape_str(raw.shape()));
  };
  auto as_float = [&](DType d) {
    if (raw.dtype() != d) throw Error("[ggml_dequantize] a " + type + " tensor must be " + d.name() + ", got " + raw.dtype().name());
    return raw.cast(dtypes::float32);
  };
  if (type == "f32") return as_float(dtypes::float32);
  if (type == "f16") return as_float(dtypes::float16);
  if (type == "bf16") return as_float(dtypes::bfloat16);
  if (type == "f64") return as_float(dtypes::float64);
  if (type == "i8") return as_float(dtypes::int8);
  if (type == "i16") return as_float(dtypes::int16);
  if (type == "i32") return as_float(dtypes::int32);
  if (type == "i64") return as_float(dtypes::int64);
  if (type == "q1_0") {  // y = bit ? d : -d = (2 bit - 1) * d; element j is bit j%8 of byte j/8
    need(18);
    Tensor b = merge_last(unpack(cols(raw, 2, 18), 1).transpose(-1, -2)).cast(dtypes::float32);  // (..., 128)
    return merge_last((b * 2.0 - 1.0) * f16_at(raw, 0));
  }
  if (type == "q2_K" || type == "q3_K") {  // sub-block s of 16: q2_K y = (d * sc[s]) * q - dmin * m[s];
                                          // q3_K y = (d * (sc[s] - 32)) * (q | h << 2) - 4)
    bool three = type == "q3_K";
    need(three ? 110 : 84);
    auto shape = [&](std::initializer_list<int64_t> tail) {
      Shape s = raw.shape();
      s.pop_back();
      s.insert(s.end(), tail);
      return s;
    };
    // element 128h + 32j + 16k + l is bits 2j..2j+1 of qs[32h + 16k + l]: (..., h, k, j, l) -> (..., h, j, k, l)
    int64_t o = three ? 32 : 16;
    Tensor q = unpack(cols(raw, o, o + 64).reshape(shape({2, 2, 16})), 2).transpose(-3, -2);
    Tensor d = f16_at(raw, three ? 108 : 80).reshape(shape({1, 1, 1, 1}));
    Tensor y;
    if (three) {
      // the high bit is bit 4h + j of hmask[16k + l]: (..., k, h, j, l) -> (..., h, j, k, l)
      Tensor h = unpack(cols(raw, 0, 32).reshape(shape({2, 16})), 1).reshape(shape({2, 2, 4, 16}));
      h = h.transpose(-4, -3).transpose(-3, -2);
      Tensor qf = q.bitwise_or(h.lshift(Tensor(2).cast(dtypes::uint8))).cast(dtypes::float32) - 4.0;
      // sc[s] = nibble s/8 of byte s%8 | bits 2(s/4).. of byte 8 + s%4 << 4
      Tensor lo = merge_last(unpack(cols(raw, 96, 104), 4)), hi = merge_last(unpack(cols(raw, 104, 108), 2));
      Tensor sc = lo.bitwise_or(hi.lshift(Tensor(4).cast(dtypes::uint8))).cast(dtypes::float32) - 32.0;
      y = (d * sc.reshape(shape({2, 4, 2, 1}))) * qf;
    } else {
      Tensor sc = cols(raw, 0, 16).reshape(shape({2, 4, 2, 1}));
      Tensor dl = d * sc.bitwise_and(Tensor(15).cast(dtypes::uint8)).cast(dtypes::float32);
      Tensor ml = f16_at(raw, 82).reshape(shape({1, 1, 1, 1})) * sc.rshift(Tensor(4).cast(dtypes::uint8)).cast(dtypes::float32);
      y = dl * q.cast(dtypes::float32) - ml;
    }
    Shape out = raw.shape();
    out.pop_back();
    out.back() *= 256;
    return y.reshape(out);
  }
  if (type == "q8_0") {  // y = d * q
    need(34);
    return merge_last(cols(raw, 2, 34).bitcast(dtypes::int8).cast(dtypes::float32) * f16_at(raw, 0));
  }
  if (type == "q4_0") {  // y = (q - 8) * d; low nibbles are elements 0..15
    need(18);
    Tensor q = merge_last(unpack(cols(raw, 2, 18), 4)).cast(dtypes::float32);
    return merge_last((q - 8.0) * f16_at(raw, 0));
  }
  if (type == "q4_1") {  // y = q * d + m
    need(20);
    Tensor q = merge_last(unpack(cols(raw, 4, 20), 4)).cast(dtypes::float32);
    return merge_last(q * f16_at(raw, 0) + f16_at(raw, 2));
  }
  if (type == "q5_0" || type == "q5_1") {  // q5_0: y = (q - 16) * d; q5_1: y = q * d + m; q = nibble | high bit << 4
    bool one = type == "q5_1";
    int64_t o = one ? 4 : 2;
    need(o + 20);
    Tensor q = nibbles(cols(raw, o + 4, o + 20)).bitwise_or(bits32(cols(raw, o, o + 4)).lshift(Tensor(4).cast(dtypes::uint8)));
    Tensor qf = q.cast(dtypes::float32);
    return merge_last(one ? qf * f16_at(raw, 0) + f16_at(raw, 2) : (qf - 16.0) * f16_at(raw, 0));
  }
  if (type == "iq4_nl") {  // y = d * kvalues_iq4nl[q]
    need(18);
    return merge_last(f16_at(raw, 0) * lut16(nibbles(cols(raw, 2, 18)), kvalues_iq4nl));
  }
  if (type == "iq4_xs") {  // sub-block ib (32 elements): y = (d * (ls[ib] - 32)) * kvalues_iq4nl[q]
    need(136);
    // ls[ib] = nibble ib%2 of scales_l[ib/2] | bits 2ib..2ib+1 of scales_h (u16, little-endian) << 4
    Tensor lo = merge_last(unpack(cols(raw, 4, 8), 4).transpose(-1, -2));  // (..., 8): byte ib/2, nibble ib%2
    Tensor hi = merge_last(unpack(cols(raw, 2, 4), 2).transpose(-1, -2));  // (..., 8): byte ib/4, field ib%4
    Tensor ls = lo.bitwise_or(hi.lshift(Tensor(4).cast(dtypes::uint8))).cast(dtypes::float32);
    Tensor dl = f16_at(raw, 0) * (ls - 32.0);  // (..., 8)
    Shape s = raw.shape();
    s.back() = 8;
    s.push_back(16);
    Tensor q = merge_last(unpack(cols(raw, 8, 136).reshape(s), 4));  // (..., 8, 32): sub-block ib, nibble-half*16 + j
    return merge_last(merge_last(dl.unsqueeze(-1) * lut16(q, kvalues_iq4nl)));
  }
  if (type == "mxfp4") {  // y = kvalues_mxfp4[q] * 2^(e - 128) (GGML_E8M0_TO_FP32_HALF; e = 0, 1: denormals)
    need(17);
    Tensor e = cols(raw, 0, 1).cast(dtypes::uint32);
    Tensor small = Tensor(0x00200000).cast(dtypes::uint32).lshift(e), big = (e - Tensor(1).cast(dtypes::uint32)).lshift(Tensor(23).cast(dtypes::uint32));
    Tensor d = e.lt(Tensor(2).cast(dtypes::uint32)).where(small, big).bitcast(dtypes::float32);
    return merge_last(lut16(nibbles(cols(raw, 1, 17)), kvalues_mxfp4) * d);
  }
  if (type == "q4_K" || type == "q5_K") {  // sub-block s (32 elements): y = (d * sc[s]) * q - dmin * m[s]
    bool five = type == "q5_K";
    need(five ? 176 : 144);
    Shape s = raw.shape();
    s.back() = 4;
    s.push_back(32);  // (..., chunk j, l): byte l of chunk j holds elements 64j + l (low nibble) and 64j + 32 + l
    Shape s8 = raw.shape();
    s8.back() = 8;
    s8.push_back(32);
    Tensor q = unpack(cols(raw, five ? 48 : 16, five ? 176 : 144).reshape(s), 4).reshape(s8);  // (..., 8, 32)
    if (five) q = q.bitwise_or(unpack(cols(raw, 16, 48), 1).lshift(Tensor(4).cast(dtypes::uint8)));  // bit s of qh[l]
    auto [sc, m] = scale_min_k4_t(cols(raw, 4, 16));
    Tensor d = f16_at(raw, 0), dmin = f16_at(raw, 2);
    Tensor y = ((d * sc).unsqueeze(-1) * q.cast(dtypes::float32)) - (dmin * m).unsqueeze(-1);
    return merge_last(merge_last(y));
  }
  if (type == "q6_K") {  // y = d * sc[i/16] * (q - 32), q = 4 low bits from ql, 2 high bits from qh
    need(210);
    // within each half of 128: element 32g + l takes ql[32(g%2) + l] >> 4(g/2) and (qh[l] >> 2g) & 3, written as
    // (..., half, g, l) with every byte index linear in half, g and l (a kernel's loops stay plain)
    auto shape = [&](std::initializer_list<int64_t> tail) {
      Shape s = raw.shape();
      s.pop_back();
      s.insert(s.end(), tail);
      return s;
    };
    int64_t nd = raw.ndim() - 1;  // the blocks' axis and those before it
    // ql (..., half 2, g%2 2, l 32) -> unpack: (..., half, g%2, g/2, l) -> (..., half, g/2, g%2, l) = (..., half, g, l)
    std::vector<int64_t> perm;
    for (int64_t a = 0; a <= nd; a++) perm.push_back(a);
    perm.insert(perm.end(), {nd + 2, nd + 1, nd + 3});
    Tensor lo = unpack(cols(raw, 0, 128).reshape(shape({2, 2, 32})), 4).permute(perm).reshape(shape({2, 4, 32}));
    Tensor hi = unpack(cols(raw, 128, 192).reshape(shape({2, 32})), 2);  // (..., half, g, l)
    Tensor q = lo.bitwise_or(hi.lshift(Tensor(4).cast(dtypes::uint8))).cast(dtypes::float32) - 32.0;  // (..., 2, 4, 32)
    // sc[i/16], i = 128 half + 32 g + l: (..., half, g, l/16 2, 1)
    Tensor sc = cols(raw, 192, 208).bitcast(dtypes::int8).cast(dtypes::float32).reshape(shape({2, 4, 2, 1}));
    Tensor d = f16_at(raw, 208).reshape(shape({1, 1, 1, 1}));
    Tensor y = (d * sc) * q.reshape(shape({2, 4, 2, 16}));
    Shape out = raw.shape();
    out.pop_back();
    out.back() *= 256;
    return y.reshape(out);
  }
  for (uint32_t c : {16, 17, 18, 19, 21, 22, 29})
    if (type == ggml_type(c).name)
      throw Error("[ggml_dequantize] " + type + " (a lattice-grid type) is dequantised on load only: load the file with "
                  "gguf_load(path, device, true); its grid lookups have no tensor-op form in tg yet");
  throw Error("[ggml_dequantize] unknown type '" + type + "' (f32, f16, bf16, f64, i8, i16, i32, i64, q1_0, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, mxfp4)");
}

namespace {

// ---- writing

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad(size_t align) { b.resize((b.size() + align - 1) / align * align, 0); }
};

void write_value(Writer& w, const GGUFValue& v, const std::string& key) {
  auto u = [&] { return std::holds_alternative<uint64_t>(v.value) ? std::get<uint64_t>(v.value) : uint64_t(v.as_int()); };
  switch (v.type) {
    case VT::UINT8: w.put(uint8_t(u())); break;
    case VT::INT8: w.put(int8_t(v.as_int())); break;
    case VT::UINT16: w.put(uint16_t(u())); break;
    case VT::INT16: w.put(int16_t(v.as_int())); break;
    case VT::UINT32: w.put(uint32_t(u())); break;
    case VT::INT32: w.put(int32_t(v.as_int())); break;
    case VT::UINT64: w.put(u()); break;
    case VT::INT64: w.put(v.as_int()); break;
    case VT::FLOAT32: w.put(float(v.as_double())); break;
    case VT::FLOAT64: w.put(v.as_double()); break;
    case VT::BOOL: w.put(uint8_t(v.as_int() != 0)); break;
    case VT::STRING: w.str(v.as_string()); break;
    case VT::ARRAY: {
      w.put(uint32_t(v.elem_type));
      w.put(uint64_t(v.as_array().size()));
      for (const GGUFValue& e : v.as_array()) {
        if (e.type != v.elem_type)
          throw Error(std::string("[gguf_save] array '") + key + "' holds a " + value_type_name(e.type) + " among " +
                      value_type_name(v.elem_type) + " elements");
        write_value(w, e, key);
      }
      break;
    }
    default: throw Error("[gguf_save] '" + key + "' has unknown value type " + std::to_string(uint32_t(v.type)));
  }
}

void put_f16(Writer& w, float x) { w.put(float_to_half_bits(x)); }

// ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = round(x / d)
void quantize_q8_0(Writer& w, const float* x, size_t n) {
  for (size_t i = 0; i < n; i += 32, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    float d = amax / 127, id = d != 0 ? 1 / d : 0;
    put_f16(w, d);
    for (int j = 0; j < 32; j++) w.put(int8_t(std::roundf(x[j] * id)));
  }
}

// ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = min(15, int(x / d + 8.5))
void quantize_q4_0(Writer& w, const float* x, size_t n) {
  for (size_t i = 0; i < n; i += 32, x += 32) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
    float d = max / -8, id = d != 0 ? 1 / d : 0;
    put_f16(w, d);
    for (int j = 0; j < 16; j++) {
      int lo = std::min(15, int(int8_t(x[j] * id + 8.5f))), hi = std::min(15, int(int8_t(x[16 + j] * id + 8.5f)));
      w.put(uint8_t(lo | (hi << 4)));
    }
  }
}

}  // namespace

void gguf_save(const std::string& path, const std::map<std::string, GGUFValue>& metadata,
               const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& types) {
  constexpr size_t kAlign = 32;
  if (metadata.count("general.alignment"))
    throw Error("[gguf_save] " + path + ": general.alignment is set by the writer (32), not by the metadata");
  for (const auto& [name, type] : types)
    if (!tensors.count(name)) throw Error("[gguf_save] " + path + ": a type is given for '" + name + "', which is not a tensor");
  Writer head, data;
  for (char ch : {'G', 'G', 'U', 'F'}) head.put(uint8_t(ch));
  head.put(uint32_t(3));
  head.put(uint64_t(tensors.size()));
  head.put(uint64_t(metadata.size() + 1));
  head.str("general.alignment");
  head.put(uint32_t(VT::UINT32));
  head.put(uint32_t(kAlign));
  for (const auto& [key, v] : metadata) {
    head.str(key);
    head.put(uint32_t(v.type));
    write_value(head, v, key);
  }
  for (const auto& [name, t] : tensors) {
    auto it = types.find(name);
    std::string type = it == types.end() ? "f32" : it->second;
    uint32_t code = type == "f32" ? 0 : type == "f16" ? 1 : type == "q4_0" ? 2 : type == "q8_0" ? 8 : ~0u;
    uint32_t raw_code = ~0u;  // a uint8 tensor of blocks, written as it is
    for (uint32_t c = 2; c < 42 && t.dtype() == dtypes::uint8; c++)
      if (ggml_type(c).name && ggml_type(c).block > 1 && type == ggml_type(c).name) raw_code = c;
    for (uint32_t c = 24; c <= 28; c++)
      if (type == ggml_type(c).name) {  // ints and f64: the tensor's own elements, in its dtype
        if (t.dtype() != element_dtype(c))
          throw Error("[gguf_save] " + path + ": tensor '" + name + "' is " + t.dtype().name() + "; type " + type +
                      " stores " + element_dtype(c).name() + " tensors");
        raw_code = c;
      }
    if (raw_code != ~0u) {
      GgmlType gt = ggml_type(raw_code);
      if (gt.block == 1) {
        if (t.ndim() > 4)
          throw Error("[gguf_save] " + path + ": tensor '" + name + "' has " + std::to_string(t.ndim()) + " dims, GGUF allows 4");
        Tensor c = (get_device(t.device()).runs_kernels() ? t : t.to(default_device())).contiguous();
        std::vector<uint8_t> bytes(size_t(t.numel()) * gt.bytes);
        auto copy = [&](auto v) { std::memcpy(bytes.data(), v.data(), bytes.size()); };
        switch (raw_code) {
          case 24: copy(c.to_vector<int8_t>()); break;
          case 25: copy(c.to_vector<int16_t>()); break;
          case 26: copy(c.to_vector<int32_t>()); break;
          case 27: copy(c.to_vector<int64_t>()); break;
          default: copy(c.to_vector<double>()); break;
        }
        head.str(name);
        head.put(uint32_t(t.ndim()));
        for (auto d = t.shape().rbegin(); d != t.shape().rend(); ++d) head.put(uint64_t(*d));
        head.put(raw_code);
        head.put(uint64_t(data.b.size()));
        data.b.insert(data.b.end(), bytes.begin(), bytes.end());
        data.pad(kAlign);
        continue;
      }
      if (t.ndim() < 2 || t.shape().back() != int64_t(gt.bytes) || t.ndim() > 5)
        throw Error("[gguf_save] " + path + ": tensor '" + name + "' is uint8 " + shape_str(t.shape()) + ": " + type +
                    " blocks must be (..., blocks, " + std::to_string(gt.bytes) + ") with at most 4 element dims");
      Shape es(t.shape().begin(), t.shape().end() - 1);
      es.back() *= int64_t(gt.block);
      std::vector<uint8_t> bytes = (get_device(t.device()).runs_kernels() ? t : t.to(default_device())).contiguous().to_vector<uint8_t>();
      head.str(name);
      head.put(uint32_t(es.size()));
      for (auto d = es.rbegin(); d != es.rend(); ++d) head.put(uint64_t(*d));
      head.put(raw_code);
      head.put(uint64_t(data.b.size()));
      data.b.insert(data.b.end(), bytes.begin(), bytes.end());
      data.pad(kAlign);
      continue;
    }
    if (code == ~0u)
      throw Error("[gguf_save] " + path + ": tensor '" + name + "' has type '" + type +
                  "'; the writer stores f32, f16, q8_0 and q4_0 (and blocks of the other quantised types as uint8 tensors)");
    const Shape& shape = t.shape();
    if (shape.size() > 4) throw Error("[gguf_save] " + path + ": tensor '" + name + "' has " + std::to_string(shape.size()) + " dims, GGUF allows 4");
    int64_t last = shape.empty() ? 1 : shape.back();
    if (code >= 2 && last % 32 != 0)
      throw Error("[gguf_save] " + path + ": tensor '" + name + "' " + shape_str(shape) + " cannot be stored as " + type +
                  ": its last dim must be a multiple of 32 (the block size)");
    std::vector<float> x = t.cast(dtypes::float32).contiguous().to_vector<float>();
    head.str(name);
    head.put(uint32_t(shape.size()));
    for (auto d = shape.rbegin(); d != shape.rend(); ++d) head.put(uint64_t(*d));
    head.put(code);
    head.put(uint64_t(data.b.size()));
    switch (code) {
      case 0: for (float v : x) data.put(v); break;
      case 1: for (float v : x) put_f16(data, v); break;
      case 2: quantize_q4_0(data, x.data(), x.size()); break;
      case 8: quantize_q8_0(data, x.data(), x.size()); break;
    }
    data.pad(kAlign);
  }
  head.pad(kAlign);
  write_file_atomic(path, "gguf_save", [&](const std::function<void(const void*, size_t)>& put) {
    put(head.b.data(), head.b.size());
    put(data.b.data(), data.b.size());
  });
}

GGUFValue GGUFValue::u32(uint32_t v) { return GGUFValue{VT::UINT32, VT::UINT8, uint64_t(v)}; }
GGUFValue GGUFValue::i32(int32_t v) { return GGUFValue{VT::INT32, VT::UINT8, int64_t(v)}; }
GGUFValue GGUFValue::u64(uint64_t v) { return GGUFValue{VT::UINT64, VT::UINT8, v}; }
GGUFValue GGUFValue::f32(float v) { return GGUFValue{VT::FLOAT32, VT::UINT8, double(v)}; }
GGUFValue GGUFValue::boolean(bool v) { return GGUFValue{VT::BOOL, VT::UINT8, v}; }
GGUFValue GGUFValue::str(std::string v) { return GGUFValue{VT::STRING, VT::UINT8, std::move(v)}; }
GGUFValue GGUFValue::strings(const std::vector<std::string>& v) {
  std::vector<GGUFValue> a;
  for (const auto& s : v) a.push_back(str(s));
  return GGUFValue{VT::ARRAY, VT::STRING, std::move(a)};
}
GGUFValue GGUFValue::floats(const std::vector<float>& v) {
  std::vector<GGUFValue> a;
  for (float x : v) a.push_back(f32(x));
  return GGUFValue{VT::ARRAY, VT::FLOAT32, std::move(a)};
}
GGUFValue GGUFValue::ints(const std::vector<int32_t>& v) {
  std::vector<GGUFValue> a;
  for (int32_t x : v) a.push_back(i32(x));
  return GGUFValue{VT::ARRAY, VT::INT32, std::move(a)};
}

int64_t GGUFValue::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > uint64_t(INT64_MAX)) throw Error("[gguf] value " + std::to_string(*u) + " does not fit an int64");
    return int64_t(*u);
  }
  if (auto* i = std::get_if<int64_t>(&value)) return *i;
  if (auto* b = std::get_if<bool>(&value)) return *b;
  throw Error(std::string("[gguf] a ") + value_type_name(type) + " value is not an integer");
}

double GGUFValue::as_double() const {
  if (auto* d = std::get_if<double>(&value)) return *d;
  if (auto* u = std::get_if<uint64_t>(&value)) return double(*u);
  if (auto* i = std::get_if<int64_t>(&value)) return double(*i);
  if (auto* b = std::get_if<bool>(&value)) return *b;
  throw Error(std::string("[gguf] a ") + value_type_name(type) + " value is not a number");
}

const std::string& GGUFValue::as_string() const {
  if (auto* s = std::get_if<std::string>(&value)) return *s;
  throw Error(std::string("[gguf] a ") + value_type_name(type) + " value is not a string");
}

const std::vector<GGUFValue>& GGUFValue::as_array() const {
  if (auto* a = std::get_if<std::vector<GGUFValue>>(&value)) return *a;
  throw Error(std::string("[gguf] a ") + value_type_name(type) + " value is not an array");
}

GGUFFile gguf_load(const std::string& path, const std::string& device, bool dequantise) {
  Bytes b = map_file(path, "gguf_load");
  GGUFFile out = parse(b, path, device, dequantise);
  out.mapped = {b.p, b.n};
  return out;
}

GGUFFile gguf_load_bytes(const uint8_t* data, size_t size, const std::string& name, const std::string& device, bool dequantise) {
  bool disk = !device.empty() && !get_device(device).runs_kernels();
  return parse(disk ? copy_bytes(data, size) : Bytes{data, size, nullptr}, name, device, dequantise);  // DISK views a copy
}

}  // namespace tg::nn
