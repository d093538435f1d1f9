// SHA-256 (FIPS 180-4), used to fingerprint parameters: equal digests mean bitwise-equal weights.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace memplan {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const std::byte> data);
  void update(const void* data, std::size_t size) {
    update(std::span<const std::byte>(static_cast<const std::byte*>(data), size));
  }
  std::array<std::uint8_t, 32> finish();
  std::string finish_hex();

 private:
  void compress(const std::uint8_t* block);
  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const void* data, std::size_t size);

}  // namespace memplan
