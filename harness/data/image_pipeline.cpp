// ImagePipeline: images decoded with stb_image and resized with ATen, or drawn procedurally.
#include "harness/data/image_pipeline.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <stb/stb_image.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/data/data_files.h"

namespace mih::data {

namespace fs = std::filesystem;

namespace internal {

struct ImageFile {
  fs::path path;
  int width = 0;
  int height = 0;
};

struct ImageSet {
  fs::path root;
  std::vector<ImageFile> files;
  at::Tensor pixels;  // [N, C, H, W] float32 in [0, 1]
};

}  // namespace internal

namespace {

using internal::ImageSet;

constexpr std::string_view kImageFix =
    "pass a directory of PNG/JPEG/PPM images, or an empty directory option for procedural images";

// The extensions stb_image decodes (stb_image.h, "Supported formats" at the top of the file).
bool is_image_file(const fs::path& path) {
  static const std::vector<std::string> kExtensions = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga",
                                                       ".psd", ".hdr", ".pic",  ".ppm", ".pgm", ".pnm"};
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::find(kExtensions.begin(), kExtensions.end(), ext) != kExtensions.end();
}

// Same generator as the text pipeline's document order (splitmix64, Vigna's constants).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 53 bits.
float uniform(uint64_t& state) { return static_cast<float>(static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53); }

// Binary PNM (P5 grey, P6 RGB; netpbm.sourceforge.net/doc/pgm.html, ppm.html) into
// [h, w, channels] float32 in [0, 1]: samples / maxval. Parsed here rather than by stb_image,
// whose PNM loader (Debian's 2022-09 snapshot) returns uninitialised pixels for a truncated
// file instead of failing, and ignores maxval.
at::Tensor decode_pnm(const fs::path& path, std::string_view bytes, int channels, internal::ImageFile& info) {
  size_t pos = 2;
  auto fail = [&](const std::string& why) {
    MIH_THROW(Code::kFailedPrecondition, "cannot decode image '", path.string(), "': PNM: ", why,
              "; fix or remove the file, or ", kImageFix);
  };
  // A header field: whitespace and '#' comments, then a decimal number.
  auto field = [&](const char* name) -> int64_t {
    for (;;) {
      while (pos < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[pos]))) ++pos;
      if (pos < bytes.size() && bytes[pos] == '#') {
        while (pos < bytes.size() && bytes[pos] != '\n') ++pos;
        continue;
      }
      break;
    }
    int64_t value = 0;
    const size_t start = pos;
    while (pos < bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[pos])) && pos - start < 9) {
      value = value * 10 + (bytes[pos++] - '0');
    }
    if (pos == start) fail(mih::internal::str("expected the ", name, " at byte ", start));
    return value;
  };
  const int file_channels = bytes[1] == '5' ? 1 : 3;
  const int64_t w = field("width"), h = field("height"), maxval = field("maxval");
  if (w < 1 || h < 1) fail(mih::internal::str("empty image ", w, "x", h));
  if (maxval < 1 || maxval > 65535) fail(mih::internal::str("maxval must be in [1, 65535], got ", maxval));
  if (pos >= bytes.size() || !std::isspace(static_cast<unsigned char>(bytes[pos]))) fail("no whitespace after maxval");
  ++pos;
  const int64_t sample_bytes = maxval > 255 ? 2 : 1;
  const int64_t samples = w * h * file_channels;
  const auto available = static_cast<int64_t>(bytes.size() - pos);
  if (available < samples * sample_bytes) {
    fail(mih::internal::str("truncated: ", w, "x", h, "x", file_channels, " samples of ", sample_bytes,
                            " byte(s) need ", samples * sample_bytes, " bytes of pixels, got ", available));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + pos);
  auto sample = [&](int64_t i) {
    const int v = sample_bytes == 2 ? (p[2 * i] << 8 | p[2 * i + 1]) : p[i];  // big-endian
    return std::min(1.0f, static_cast<float>(v) / static_cast<float>(maxval));
  };
  auto hwc = at::empty({h, w, channels}, at::kFloat);
  float* out = hwc.data_ptr<float>();
  for (int64_t i = 0; i < w * h; ++i) {
    float rgb[3];
    for (int c = 0; c < 3; ++c) rgb[c] = sample(i * file_channels + (file_channels == 1 ? 0 : c));
    // Grey from RGB with stb_image's weights (stbi__compute_y: 77, 150, 29 / 256, ~BT.601).
    const float grey = file_channels == 1 ? rgb[0] : (77 * rgb[0] + 150 * rgb[1] + 29 * rgb[2]) / 256;
    float* px = out + i * channels;
    switch (channels) {
      case 1: px[0] = grey; break;
      case 2: px[0] = grey; px[1] = 1; break;
      default:
        for (int c = 0; c < 3; ++c) px[c] = rgb[c];
        if (channels == 4) px[3] = 1;
    }
  }
  info.width = static_cast<int>(w);
  info.height = static_cast<int>(h);
  return hwc.permute({2, 0, 1}).contiguous();
}

// Decodes one file into [C, h, w] float32 in [0, 1].
at::Tensor decode(const fs::path& path, int channels, internal::ImageFile& info) {
  std::string bytes;
  MIH_CHECK_CODE(read_file(path, &bytes), Code::kFailedPrecondition, "cannot read image '", path.string(), "': ",
                 std::strerror(errno), "; make it readable or ", kImageFix);
  if (bytes.size() >= 2 && bytes[0] == 'P' && (bytes[1] == '5' || bytes[1] == '6')) {
    return decode_pnm(path, bytes, channels, info);
  }
  MIH_CHECK_CODE(bytes.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), Code::kFailedPrecondition,
                 "image '", path.string(), "' is too large for stb_image (", bytes.size(), " bytes)");
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  int w = 0, h = 0, file_channels = 0;
  at::Tensor hwc;
  auto fail = [&]() {
    const char* reason = stbi_failure_reason();
    MIH_THROW(Code::kFailedPrecondition, "cannot decode image '", path.string(), "': stb_image: ",
              reason ? reason : "unknown error", "; fix or remove the file, or ", kImageFix);
  };
  if (stbi_is_hdr_from_memory(data, len)) {
    float* p = stbi_loadf_from_memory(data, len, &w, &h, &file_channels, channels);
    if (!p) fail();
    hwc = at::from_blob(p, {h, w, channels}, at::kFloat).clamp(0, 1);
    stbi_image_free(p);
  } else if (stbi_is_16_bit_from_memory(data, len)) {
    stbi_us* p = stbi_load_16_from_memory(data, len, &w, &h, &file_channels, channels);
    if (!p) fail();
    hwc = at::empty({h, w, channels}, at::kFloat);  // ATen 1.13 has no uint16 dtype
    float* out = hwc.data_ptr<float>();
    for (int64_t i = 0; i < hwc.numel(); ++i) out[i] = static_cast<float>(p[i]) / 65535.0f;
    stbi_image_free(p);
  } else {
    stbi_uc* p = stbi_load_from_memory(data, len, &w, &h, &file_channels, channels);
    if (!p) fail();
    hwc = at::from_blob(p, {h, w, channels}, at::kByte).to(at::kFloat).div(255.0);
    stbi_image_free(p);
  }
  info.width = w;
  info.height = h;
  return hwc.permute({2, 0, 1}).contiguous();
}

std::shared_ptr<const ImageSet> load_images(const ImagePipelineOptions& options) {
  auto set = std::make_shared<ImageSet>();
  set->root = options.directory();
  const int64_t side = options.image_size();
  std::vector<at::Tensor> images;
  std::vector<fs::path> skipped;
  for (const auto& path : list_data_files(options.directory(), kImageFix)) {
    if (!is_image_file(path)) {
      skipped.push_back(path);
      continue;
    }
    internal::ImageFile info{path, 0, 0};
    at::Tensor chw = decode(path, static_cast<int>(options.channels()), info);
    if (chw.size(1) != side || chw.size(2) != side) {
      chw = at::upsample_bilinear2d(chw.unsqueeze(0), {side, side}, /*align_corners=*/false).squeeze(0).clamp(0, 1);
    }
    images.push_back(chw);
    set->files.push_back(std::move(info));
  }
  MIH_CHECK_CODE(!images.empty(), Code::kFailedPrecondition, "image directory '", options.directory().string(),
                 "' holds no image file (.png, .jpg, .jpeg, .bmp, .gif, .tga, .psd, .hdr, .pic, .ppm, .pgm, .pnm)",
                 skipped.empty() ? std::string()
                                 : mih::internal::str("; ignored ", skipped.size(), " other file(s), e.g. '",
                                                 skipped.front().string(), "'"),
                 "; ", kImageFix);
  set->pixels = at::stack(images).contiguous();
  return set;
}

// One procedural image [C, side, side]: gradient between two colours, a rectangle, a disc.
void draw(uint64_t seed, int64_t step, int64_t row, int64_t channels, int64_t side, float* out) {
  uint64_t state = seed;
  state = splitmix64(state) ^ static_cast<uint64_t>(step);
  state = splitmix64(state) ^ static_cast<uint64_t>(row);
  auto colour = [&] {
    std::vector<float> c(static_cast<size_t>(channels));
    for (auto& v : c) v = uniform(state);
    return c;
  };
  const std::vector<float> from = colour(), to = colour(), rect = colour(), disc = colour();
  const float angle = uniform(state) * 6.2831853f;
  const float dx = std::cos(angle), dy = std::sin(angle);
  float rx0 = uniform(state), rx1 = uniform(state), ry0 = uniform(state), ry1 = uniform(state);
  if (rx0 > rx1) std::swap(rx0, rx1);
  if (ry0 > ry1) std::swap(ry0, ry1);
  const float cx = uniform(state), cy = uniform(state), radius = 0.1f + 0.3f * uniform(state);
  const auto plane = side * side;
  for (int64_t y = 0; y < side; ++y) {
    for (int64_t x = 0; x < side; ++x) {
      const float u = (static_cast<float>(x) + 0.5f) / static_cast<float>(side);
      const float v = (static_cast<float>(y) + 0.5f) / static_cast<float>(side);
      const float t = std::clamp((u - 0.5f) * dx + (v - 0.5f) * dy + 0.5f, 0.0f, 1.0f);
      const bool in_disc = (u - cx) * (u - cx) + (v - cy) * (v - cy) <= radius * radius;
      const bool in_rect = u >= rx0 && u <= rx1 && v >= ry0 && v <= ry1;
      for (int64_t c = 0; c < channels; ++c) {
        float value = from[c] * (1 - t) + to[c] * t;
        if (in_rect) value = rect[c];
        if (in_disc) value = disc[c];
        out[c * plane + y * side + x] = std::clamp(value, 0.0f, 1.0f);
      }
    }
  }
}

}  // namespace

void to_json(nlohmann::json& j, const ImagePipelineOptions& o) {
  j = {{"directory", o.directory().string()},
       {"image_size", o.image_size()},
       {"channels", o.channels()},
       {"global_batch", o.global_batch()},
       {"seed", o.seed()}};
}

void from_json(const nlohmann::json& j, ImagePipelineOptions& o) {
  check_known_fields(j, "image pipeline options", {"directory", "image_size", "channels", "global_batch", "seed"});
  ImagePipelineOptions d;
  o.directory(j.contains("directory") ? fs::path(j.at("directory").get<std::string>()) : d.directory());
  o.image_size(j.value("image_size", d.image_size()));
  o.channels(j.value("channels", d.channels()));
  o.global_batch(j.value("global_batch", d.global_batch()));
  o.seed(j.value("seed", d.seed()));
}

void PrintTo(const ImagePipelineOptions& o, std::ostream* os) { *os << nlohmann::json(o).dump(); }

ImagePipeline::ImagePipeline(ImagePipelineOptions options) : options_(std::move(options)) {
  MIH_CHECK(options_.image_size() >= 1, "image pipeline: 'image_size' must be >= 1, got ", options_.image_size());
  MIH_CHECK(options_.global_batch() >= 1, "image pipeline: 'global_batch' must be >= 1, got ",
            options_.global_batch());
  MIH_CHECK(options_.channels() >= 1 && options_.channels() <= 4,
            "image pipeline: 'channels' must be 1, 2, 3 or 4, got ", options_.channels());
  if (!options_.directory().empty()) set_ = load_images(options_);
}

at::Tensor ImagePipeline::images(int64_t step) const {
  const int64_t b = options_.global_batch();
  MIH_CHECK(step >= 0, "image pipeline: step must be >= 0, got ", step);
  MIH_CHECK(step < std::numeric_limits<int64_t>::max() / b - 1, "image pipeline: step ", step,
            " overflows the image index (global_batch ", b, ")");
  if (set_) {
    const int64_t n = set_->pixels.size(0);
    auto index = at::empty({b}, at::kLong);
    int64_t* idx = index.data_ptr<int64_t>();
    for (int64_t r = 0; r < b; ++r) idx[r] = (step * b + r) % n;
    return set_->pixels.index_select(0, index);
  }
  const int64_t c = options_.channels(), side = options_.image_size();
  auto out = at::empty({b, c, side, side}, at::kFloat);
  float* data = out.data_ptr<float>();
  for (int64_t r = 0; r < b; ++r) draw(options_.seed(), step, r, c, side, data + r * c * side * side);
  return out;
}

int64_t ImagePipeline::num_images() const { return set_ ? set_->pixels.size(0) : 0; }

nlohmann::json ImagePipeline::describe() const {
  auto files = nlohmann::json::array();
  if (set_) {
    for (const auto& f : set_->files) files.push_back({{"path", f.path.string()}, {"width", f.width}, {"height", f.height}});
  }
  return {{"directory", set_ ? nlohmann::json(set_->root.string()) : nlohmann::json(nullptr)},
          {"files", std::move(files)},
          {"images", num_images()},
          {"options", options_}};
}

}  // namespace mih::data
