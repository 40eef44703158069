#pragma once
// Datasets from local files: the IDX format (MNIST, Fashion-MNIST), gzip or plain.
// Thread-safety: the loaders share no state.
#include "tg/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

#include "tg/tensor.hpp"

namespace tg::nn {

/** Train and test splits as tensors, like tinygrad's nn.datasets.mnist(). */
struct Dataset {
  /// images (N, 1, 28, 28) uint8 and labels (N,) int32 of the training and test splits
  ///@{
  Tensor X_train, Y_train, X_test, Y_test;
  ///@}
};

/** One IDX file (gzip-compressed or not) as a tensor of its dtype and shape (ubyte -> uint8, ...).
 *  A truncated or malformed file throws tg::Error naming the file and what is wrong. */
Tensor load_idx(const std::string& path, const std::string& device = "");
/** The same for an IDX image in memory (gzip-compressed or not); `name` stands for the file in errors. */
Tensor load_idx_bytes(const uint8_t* data, size_t size, const std::string& name, const std::string& device = "");

/** MNIST from a folder holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]: images (N,1,28,28) uint8,
 *  labels (N,) uint8. The folder defaults to $TG_MNIST_DIR, else data/mnist (what scripts/datasets makes). */
Dataset mnist(const std::string& dir = "", const std::string& device = "");
/** Fashion-MNIST, the same layout, from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist). */
Dataset fashion_mnist(const std::string& dir = "/usr/share/datasets/fashion-mnist", const std::string& device = "");

}  // namespace tg::nn
