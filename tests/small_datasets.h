// Small stand-ins for the datasets, written by tests about plumbing rather than accuracy: reading
// 70,000 Fashion-MNIST images and evaluating 10,000 would take most of such a test's time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace memplan::testing {

// Fashion-MNIST's IDX files (28 x 28 images, 10 classes, labels i % 10) with `train` training
// and `test` test images of scrambled pixels, in the folder `dir` (created).
inline void write_small_fashion_mnist(const std::filesystem::path& dir, std::uint32_t train, std::uint32_t test) {
  auto be32 = [](std::ofstream& f, std::uint32_t v) {
    const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                                static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
    f.write(reinterpret_cast<const char*>(b), 4);
  };
  std::filesystem::create_directories(dir);
  for (const auto& [prefix, count] : {std::pair<const char*, std::uint32_t>{"train", train}, {"t10k", test}}) {
    std::ofstream images(dir / (std::string(prefix) + "-images-idx3-ubyte"), std::ios::binary);
    be32(images, 0x00000803);
    be32(images, count);
    be32(images, 28);
    be32(images, 28);
    for (std::uint32_t i = 0; i < count * 28 * 28; ++i) images.put(static_cast<char>((i * 2654435761u) >> 24));
    std::ofstream labels(dir / (std::string(prefix) + "-labels-idx1-ubyte"), std::ios::binary);
    be32(labels, 0x00000801);
    be32(labels, count);
    for (std::uint32_t i = 0; i < count; ++i) labels.put(static_cast<char>(i % 10));
  }
}

}  // namespace memplan::testing
