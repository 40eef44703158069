#pragma once
// State: a module's tensors by name, safetensors files (save, load as views of the mapped file on the DISK device)
// and GGUF files (metadata and tensors: quantised blocks dequantised to float32 at load, or kept as the file stores
// them and dequantised by tensor ops, ggml_dequantize, inside the kernels that read them).
// Loaders check every size and offset against the file before reading or allocating: a truncated or corrupt file
// is a tg::Error naming the file and what is wrong. Each loader also reads bytes in memory (the fuzz targets do).
// Thread-safety: functions share no state.
#include "tg/config.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "tg/nn/nn.hpp"
#include "tg/tensor.hpp"

namespace tg::nn {

// ---- module state (tinygrad's nn.state names)

/** Every tensor of a module (parameters and buffers) by dotted name; the same as m.state_dict(). */
std::map<std::string, Tensor> get_state_dict(Module& m);
/** Every tensor of a module, parameters and buffers, in name order (tinygrad's get_parameters). */
std::vector<Tensor> get_parameters(Module& m);
/** m.load_state_dict(sd, strict): a missing, unexpected or mis-shaped key is an error naming it (strict). */
void load_state_dict(Module& m, const std::map<std::string, Tensor>& sd, bool strict = true);

// ---- safetensors

/** Write tensors to a .safetensors file (realising them; views and DISK tensors are fine); keys sorted, 8-byte
 *  aligned header; written to PATH.tmp and renamed. */
void safe_save(const std::map<std::string, Tensor>& tensors, const std::string& path,
               const std::map<std::string, std::string>& metadata = {});
/** Read every tensor of a .safetensors file.
 *  device "DISK": the file is mapped read-only and each tensor is a view of it on the DISK device (nothing is
 *  copied at load; bytes are copied when a tensor is moved with .to() or read back with to_vector; kernels cannot
 *  run on DISK, so move a tensor before computing with it). The mapping lives while any of these tensors does.
 *  device "" (the default device) or another name: each tensor is copied from the mapping onto that device. */
std::map<std::string, Tensor> safe_load(const std::string& path, const std::string& device = "");
/** The same for a safetensors image in memory (`name` stands for the file in errors); the bytes are copied
 *  first, so DISK tensors view that copy. */
std::map<std::string, Tensor> safe_load_bytes(const uint8_t* data, size_t size, const std::string& name,
                                              const std::string& device = "");
/** The metadata map (__metadata__) of a .safetensors file; a non-string value is an error. */
std::map<std::string, std::string> safe_metadata(const std::string& path);

// ---- PyTorch checkpoints (tinygrad's nn.state.torch_load)

/** Read the tensors of a file torch.save (or libtorch's torch::pickle_save) wrote: the zip format (ARCHIVE/data.pkl
 *  and the storages ARCHIVE/data/KEY) or the legacy format of torch < 1.6. Storages of float32, float16, bfloat16,
 *  float64, int64, int32, int16, int8, uint8 and bool; views (offsets, any non-negative strides) read what torch
 *  reads, and tensors sharing a storage each get their values (an expanded, stride-0 dim stays a lazy expand; a
 *  view with overlapping strides may read at most its storage's element count plus 2^24). The result is flat: a tensor's name is its path
 *  through the pickled dicts (keys) and lists/tuples (indices) joined by '.', so a state_dict keeps its names and
 *  {"model": sd, "epoch": 3} gives "model.<name>"; values that are not tensors are skipped (a top-level tensor is
 *  named ""). Each tensor is copied onto `device` ("" = the default); onto a DISK device it is a view of the file instead,
 *  as safe_load's: one DISK buffer per storage over the mapped bytes, the tensor's offset and strides as movement ops
 *  over it (a view with overlapping strides, or whose strides' grid reaches past its storage, is gathered into a
 *  DISK buffer of its own); torch_load_bytes' DISK tensors view a copy of the bytes. Every size, offset and pickle opcode is
 *  checked: a truncated or corrupt file, an unsupported opcode or torch object (quantised, sparse tensors), or a
 *  view that reads past its storage is a tg::Error naming the file and what was expected. */
std::map<std::string, Tensor> torch_load(const std::string& path, const std::string& device = "");
/** The same for a file's bytes in memory (`name` stands for the file in errors). */
std::map<std::string, Tensor> torch_load_bytes(const uint8_t* data, size_t size, const std::string& name,
                                               const std::string& device = "");

// ---- GGUF (llama.cpp's format, versions 2 and 3)

/** One GGUF metadata value: its GGUF type and the value (integers widened to int64/uint64, floats to double;
 *  arrays hold their elements, all of `elem_type`). */
struct GGUFValue {
  /// GGUF's value types, numbered as in the file format
  enum class Type : uint32_t { UINT8 = 0, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 };
  /// the type stored in the file (ARRAY: see elem_type)
  Type type = Type::UINT8;
  Type elem_type = Type::UINT8;  ///< arrays only
  /// the value: unsigned or signed integer, double, bool, string, or the array's elements
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GGUFValue>> value;
  /** The value as an integer (any integer or bool type); otherwise a tg::Error naming the type. */
  int64_t as_int() const;
  /** The value as a double (any numeric type). */
  double as_double() const;
  /// the value of a STRING; otherwise a tg::Error naming the type
  const std::string& as_string() const;
  /// the elements of an ARRAY; otherwise a tg::Error naming the type
  const std::vector<GGUFValue>& as_array() const;

  /// Values to write (gguf_save): the GGUF type is the one named.
  static GGUFValue u32(uint32_t v);
  /// an INT32 value
  static GGUFValue i32(int32_t v);
  /// a UINT64 value
  static GGUFValue u64(uint64_t v);
  /// a FLOAT32 value
  static GGUFValue f32(float v);
  /// a BOOL value
  static GGUFValue boolean(bool v);
  /// a STRING value
  static GGUFValue str(std::string v);
  /// an ARRAY of STRING
  static GGUFValue strings(const std::vector<std::string>& v);
  /// an ARRAY of FLOAT32
  static GGUFValue floats(const std::vector<float>& v);
  /// an ARRAY of INT32
  static GGUFValue ints(const std::vector<int32_t>& v);
};

/** A GGUF file's contents: version, metadata by key, tensors by name, each tensor's GGML type name as stored
 *  ("q4_0", ...) and its element shape (GGUF dims reversed, so the first GGUF dimension is the last, contiguous one).
 *  Dequantised (the default), a tensor is float32 of that shape. Kept as stored: f32, f16 and bf16 tensors have
 *  that shape in their own dtype; a quantised one is uint8 (..., blocks per row, bytes per block), the file's
 *  blocks (q4_0 (..., n/32, 18), q8_0 (..., n/32, 34), q6_K (..., n/256, 210), ...), for ggml_dequantize. */
struct GGUFFile {
  /// the GGUF format version, as stored in the header
  uint32_t version = 0;
  /// key-value metadata ("general.architecture", "llama.block_count", ...)
  std::map<std::string, GGUFValue> metadata;
  /// tensors by name, dequantised or as stored (see above)
  std::map<std::string, Tensor> tensors;
  /// each tensor's GGML type name as stored ("f32", "q4_0", ...)
  std::map<std::string, std::string> tensor_types;
  /// each tensor's element shape (GGUF dims reversed)
  std::map<std::string, Shape> shapes;
  /// the file's private mapping, which tensors kept as stored on a host device view (gguf_load; empty otherwise):
  /// its clean pages can be dropped (madvise) and are read again from the file if touched
  std::span<const uint8_t> mapped;
};

/** Load a GGUF file (v2 or v3; alignment from general.alignment, default 32). The types tinygrad's gguf_load reads
 *  are read: f32, f16, bf16, f64, i8, i16, i32, i64, q1_0, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K,
 *  q6_K, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_nl, iq4_xs and mxfp4; another type is an error
 *  naming it and the tensor. dequantise: each tensor is dequantised on the host to float32 with ggml's formulas
 *  (dequantize_row_*), then placed on `device`; the integer types and f64 keep their dtype (int8 ... int64, float64).
 *  dequantise = false: each tensor keeps the file's bytes (see GGUFFile); on "DISK" the tensors view the mapped
 *  file (nothing is copied; the mapping lives while any of them does), on another device they are copied there. */
GGUFFile gguf_load(const std::string& path, const std::string& device = "", bool dequantise = true);
/** The same for a GGUF image in memory (`name` stands for the file in errors; DISK tensors view a copy). */
GGUFFile gguf_load_bytes(const uint8_t* data, size_t size, const std::string& name, const std::string& device = "",
                         bool dequantise = true);
/** A tensor as gguf_load(..., dequantise = false) keeps it, of GGML type `type`, dequantised to float32 by lazy
 *  tensor ops (bitcast of the f16 scales, nibble and bit unpacking, scale and offset), so that the dequantisation
 *  fuses into the kernel that reads it (a matmul reads the file's bytes, never a float32 copy). Its values equal
 *  the host dequantisation's exactly. The integer types and f64 are cast to float32. The lattice-grid types (iq1_s,
 *  iq1_m, iq2_*, iq3_*) are dequantised on load only: here they are a tg::Error saying so, as are a wrong dtype or
 *  block size and an unknown type. */
Tensor ggml_dequantize(const Tensor& raw, const std::string& type);
/** The rows of a q8_0 or q4_0 weight that a decode matvec's register tile on `device` ("": the default) takes at once,
 *  from its machine model: half the vector registers hold the tile's int32 accumulators, a row's being the block
 *  part one accumulation chain sums (q8_0: the 32 codes, q4_0: one nibble half of 16) in at most two vectors of
 *  vector_bits / 32 lanes, and at most 16 rows (the heuristic's largest amount): AVX-512 q8_0 8, q4_0 16; AVX2 4
 *  and 4. 0 (no interleaving) for another type, a device that is not a serial x86 CPU with AVX-512 or AVX2, or
 *  INTERLEAVE_ROWS=0. */
int64_t ggml_tile_rows(const std::string& type, const std::string& device = "");
/** The rows a LLaMA's q8_0 or q4_0 decode weights are interleaved by on `device` (Llama::from_gguf): ggml_tile_rows
 *  where that layout reads faster than the file's on this machine, else 0. Measured once per machine model, type and
 *  rows (a product over weights twice the last-level cache, both layouts, about a second) and kept in the disk cache;
 *  INTERLEAVE_ROWS=1 interleaves without measuring, INTERLEAVE_ROWS=0 never. `DEBUG=1` prints the measurement. */
int64_t ggml_decode_interleave(const std::string& type, const std::string& device = "");
/** A copy of a weight's blocks raw (N, blocks, bytes) stored row-interleaved, as llama.cpp repacks for its CPU
 *  kernels: (ceil(N / rows), blocks, rows, bytes), the `rows` rows' blocks of one column next to each other (rows
 *  past N are zero), so a tile of that many rows reads one sequential stream instead of `rows` interleaved ones.
 *  Lazy: realise it, then read it through ggml_interleaved_view. rows < 1 or a raw that is not (N, blocks, bytes)
 *  uint8 is a tg::Error. */
Tensor ggml_interleave_rows(const Tensor& raw, int64_t rows);
/** The (n, blocks, bytes) view of ggml_interleave_rows' copy `stored` (the weight's first n rows): what
 *  ggml_dequantize reads, every kernel addressing the interleaved bytes. A stored tensor of another rank or n past its
 *  rows is a tg::Error. */
Tensor ggml_interleaved_view(const Tensor& stored, int64_t n);
/** Write a GGUF v3 file (all or nothing, as safe_save): the metadata, then each tensor (realised, read back as
 *  float32; GGUF dims are its shape reversed) stored as the GGML type `types` names for it: "f32" (the default),
 *  "f16", "q8_0" or "q4_0", quantised with ggml's reference formulas (quantize_row_*_ref). A uint8 tensor of a
 *  quantised type's block shape (..., blocks, bytes per block, as gguf_load keeps it) is written as it is, for any
 *  type gguf_load reads (q1_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, the iq types, mxfp4 too); "i8", "i16",
 *  "i32", "i64" and "f64" store a tensor of that dtype as it is. A quantised tensor's last dim must be a multiple of
 *  32; an unknown type, a dtype that does not match, or metadata that sets general.alignment, is a tg::Error. */
void gguf_save(const std::string& path, const std::map<std::string, GGUFValue>& metadata,
               const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& types = {});

}  // namespace tg::nn
