// Sha256 over OpenSSL EVP (see sha256.h).
#include "harness/base/sha256.h"

#include <openssl/evp.h>

#include "harness/base/error.h"

namespace mih {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  MIH_INTERNAL_ASSERT(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
                      "OpenSSL could not start a SHA-256 digest");
}

Sha256::~Sha256() = default;

Sha256& Sha256::update(const void* data, size_t bytes) {
  MIH_INTERNAL_ASSERT(EVP_DigestUpdate(ctx_->md, data, bytes) == 1, "OpenSSL SHA-256 update failed");
  return *this;
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  MIH_INTERNAL_ASSERT(EVP_DigestFinal_ex(ctx_->md, digest, &n) == 1, "OpenSSL SHA-256 final failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) { return Sha256().update(bytes).hex_digest(); }

}  // namespace mih
