#pragma once
// Sha256: incremental SHA-256 (FIPS 180-4), used to check downloaded files
// against the hashes Hugging Face publishes for LFS files.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe::model {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex_digest();

  static std::string of(const std::string& bytes);

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed
};

}  // namespace troupe::model
