#pragma once
// State: saving and loading named tensors as safetensors files.
// Loading maps the file with mmap and copies each tensor's bytes straight into its buffer (no deserialisation
// layer); the JSON header is parsed with nlohmann::json.
// Thread-safety: functions share no state.
#include <map>
#include <string>

#include "tg/tensor.hpp"

namespace tg::nn {

/** Write tensors to a .safetensors file (realising them); keys sorted, offsets 8-byte aligned. */
void safe_save(const std::map<std::string, Tensor>& tensors, const std::string& path,
               const std::map<std::string, std::string>& metadata = {});
/** Read every tensor of a .safetensors file. A truncated or inconsistent file throws tg::Error naming the file
 *  and the tensor. */
std::map<std::string, Tensor> safe_load(const std::string& path, const std::string& device = "");
/** The metadata map (__metadata__) of a .safetensors file. */
std::map<std::string, std::string> safe_metadata(const std::string& path);

}  // namespace tg::nn
