// SHA-256 through OpenSSL's EVP interface (FIPS 180-4), incremental: the digest of a
// sequence of updates equals the digest of their concatenation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace mih {

class Sha256 {
 public:
  /// Throws: mih::Error{kInternal} if OpenSSL cannot make a SHA-256 context.
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& update(const void* data, size_t bytes);
  Sha256& update(std::string_view bytes) { return update(bytes.data(), bytes.size()); }
  /// Hashes `value` as its 8 little-endian bytes (the byte order of the machines we run on).
  Sha256& update_int(int64_t value) { return update(&value, sizeof value); }
  /// The digest as 64 lower-case hex digits. The object cannot be updated afterwards.
  std::string hex_digest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

/// SHA-256 of `bytes` as 64 lower-case hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace mih
