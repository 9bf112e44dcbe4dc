// The image data pipeline: the pixel_values of each step's global batch, decoded from a
// directory of images (PNG, JPEG, BMP, GIF, TGA, PSD, HDR, PIC through stb_image; binary
// PPM/PGM parsed here) or drawn procedurally. Like the text pipeline, a batch is a pure function of (options, step).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/arg.h>

namespace mih::data {

/// Options of an ImagePipeline.
struct ImagePipelineOptions {
  ImagePipelineOptions() = default;
  explicit ImagePipelineOptions(std::filesystem::path directory) : directory_(std::move(directory)) {}

  /// Directory of images, read recursively (symlinks followed); empty = procedural images.
  /// Default empty.
  TORCH_ARG(std::filesystem::path, directory);
  /// H = W: the side, in pixels, every image is resized to; the model's patch size must
  /// divide it. Default 32.
  TORCH_ARG(int64_t, image_size) = 32;
  /// C: 1 (grey), 2 (grey, alpha), 3 (RGB) or 4 (RGBA); stb converts every file to it.
  /// Default 3.
  TORCH_ARG(int64_t, channels) = 3;
  /// B: images per step (the global batch). Default 8.
  TORCH_ARG(int64_t, global_batch) = 8;
  /// Seed of the procedural images (unused with a directory). Default 0.
  TORCH_ARG(uint64_t, seed) = 0;
};

void to_json(nlohmann::json& j, const ImagePipelineOptions& o);
/// Throws: mih::Error{kInvalidSpec} for a field that is not one of the options.
void from_json(const nlohmann::json& j, ImagePipelineOptions& o);
/// gtest printer: the options as JSON.
void PrintTo(const ImagePipelineOptions& o, std::ostream* os);

namespace internal {
struct ImageSet;
}

/// Images for the global batch of each step.
///
/// With a directory: every file under it with an image extension (.png, .jpg, .jpeg, .bmp,
/// .gif, .tga, .psd, .hdr, .pic, .ppm, .pgm, .pnm; any case) is decoded once at construction:
/// binary PNM (P5, P6) by mih (samples / maxval, 8 or 16 bit, a truncated file rejected),
/// everything else by stb_image (8-bit: v / 255; 16-bit: v / 65535; HDR: clamped). Each is
/// converted to C channels (grey replicated to RGB, RGB to grey with stb's weights, alpha 1
/// added) and resized to image_size x image_size with bilinear interpolation
/// (at::upsample_bilinear2d, align_corners = false, as torch.nn.functional.interpolate). Row r
/// of step k is image (k * B + r) mod N of the N images in path order. Other files are ignored.
/// Without one: row r of step k is a procedural image drawn from splitmix64 seeded by
/// (seed, k, r): a linear colour gradient in a random direction with a random filled
/// rectangle and disc on it; the same on every platform.
///
/// Copies share the decoded images (immutable), so copies are cheap and thread-safe.
class ImagePipeline {
 public:
  /// Decodes the directory, if any.
  /// Throws: mih::Error{kInvalidSpec} for image_size or global_batch < 1, or channels not
  ///   in 1..4; mih::Error{kFailedPrecondition} naming the path when the directory is missing,
  ///   is not a directory, holds no image file, or a file cannot be read or decoded (with
  ///   stb_image's reason).
  explicit ImagePipeline(ImagePipelineOptions options = {});

  /// pixel_values of step `step` (0-based), a pure function of (options, step).
  /// Shape: [B, C, H, W] float32 in [0, 1] on the CPU, H = W = image_size.
  /// Throws: mih::Error{kInvalidSpec} for step < 0.
  at::Tensor images(int64_t step) const;

  const ImagePipelineOptions& options() const { return options_; }
  /// Decoded images (0 for procedural ones).
  int64_t num_images() const;
  /// Evidence: {"directory" (null when procedural), "files": [{"path", "width", "height"}],
  /// "images", "options"}.
  nlohmann::json describe() const;

 private:
  ImagePipelineOptions options_;
  std::shared_ptr<const internal::ImageSet> set_;
};

}  // namespace mih::data
