// The image pipeline: procedural images (determinism, shape, range), a directory of PPM, PGM
// and PNG files written here decoded and resized (solid colours stay solid, bilinear against
// values worked out by hand), cycling, and every rejected directory.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <stb/stb_image_write.h>

#include "harness/base/error.h"
#include "harness/data/image_pipeline.h"
#include "tests/support/temp_dir.h"

namespace mih::data {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Matcher;

// Matches a callable that throws mih::Error with `code` and a what() matching `message`.
auto ThrowsError(Code code, const Matcher<std::string>& message) {
  return ::testing::Throws<Error>(
      AllOf(::testing::Property(&Error::code, code),
            ::testing::ResultOf([](const Error& e) { return std::string(e.what()); }, message)));
}

void write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Binary PNM (P6 colour, P5 grey) of a solid colour, 8 bits per sample.
std::string solid_pnm(int width, int height, std::vector<unsigned char> colour) {
  std::string out = (colour.size() == 3 ? "P6\n" : "P5\n") + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
  for (int i = 0; i < width * height; ++i) out.append(colour.begin(), colour.end());
  return out;
}

void write_solid_png(const fs::path& path, int width, int height, std::vector<unsigned char> rgb) {
  std::vector<unsigned char> pixels;
  for (int i = 0; i < width * height; ++i) pixels.insert(pixels.end(), rgb.begin(), rgb.end());
  ASSERT_NE(stbi_write_png(path.c_str(), width, height, 3, pixels.data(), width * 3), 0) << path;
}

// Expects every pixel of image [C, H, W] to be `colour` / 255 per channel.
void expect_solid(const at::Tensor& image, const std::vector<double>& colour) {
  ASSERT_EQ(image.size(0), static_cast<int64_t>(colour.size()));
  for (int64_t c = 0; c < image.size(0); ++c) {
    const double want = colour[c] / 255.0;
    EXPECT_NEAR(image[c].min().item<double>(), want, 1e-6) << "channel " << c;
    EXPECT_NEAR(image[c].max().item<double>(), want, 1e-6) << "channel " << c;
  }
}

// a_orange.ppm 4x4, b_blue.png 8x6, c_grey.pgm 5x5, notes.txt (ignored).
fs::path image_dir() {
  static const fs::path dir = [] {
    auto d = mih::testing::temp_dir("images");
    write(d / "a_orange.ppm", solid_pnm(4, 4, {200, 100, 50}));
    write_solid_png(d / "b_blue.png", 8, 6, {10, 20, 250});
    write(d / "sub" / "c_grey.pgm", solid_pnm(5, 5, {128}));
    write(d / "notes.txt", "not an image");
    return d;
  }();
  return dir;
}

TEST(ImagePipelineTest, ProceduralImagesAreDeterministicAndInRange) {
  ImagePipeline a{ImagePipelineOptions()}, b{ImagePipelineOptions()};
  at::Tensor images = a.images(3);
  EXPECT_THAT(images.sizes(), ElementsAre(8, 3, 32, 32));
  EXPECT_EQ(images.scalar_type(), at::kFloat);
  EXPECT_GE(images.min().item<float>(), 0.0f);
  EXPECT_LE(images.max().item<float>(), 1.0f);
  EXPECT_TRUE(images.equal(b.images(3)));
  EXPECT_FALSE(images.equal(a.images(4)));
  EXPECT_FALSE(images.equal(ImagePipeline(ImagePipelineOptions().seed(1)).images(3)));
  EXPECT_FALSE(images[0].equal(images[1]));
  for (int64_t r = 0; r < 8; ++r) EXPECT_GT(images[r].std().item<float>(), 0.01f) << "row " << r;
  EXPECT_EQ(a.num_images(), 0);
  EXPECT_TRUE(a.describe().at("directory").is_null());
}

TEST(ImagePipelineTest, ProceduralImagesFollowTheOptions) {
  ImagePipeline grey(ImagePipelineOptions().channels(1).image_size(16).global_batch(2));
  EXPECT_THAT(grey.images(0).sizes(), ElementsAre(2, 1, 16, 16));
  // A row depends on (seed, step, row) only, not on the batch size.
  ImagePipeline big(ImagePipelineOptions().global_batch(8)), small(ImagePipelineOptions().global_batch(2));
  EXPECT_TRUE(small.images(5).equal(big.images(5).narrow(0, 0, 2)));
}

TEST(ImagePipelineTest, DecodesAndResizesSolidImages) {
  ImagePipeline pipeline(ImagePipelineOptions(image_dir()).image_size(16).global_batch(4));
  EXPECT_EQ(pipeline.num_images(), 3);
  at::Tensor images = pipeline.images(0);
  ASSERT_THAT(images.sizes(), ElementsAre(4, 3, 16, 16));
  EXPECT_EQ(images.scalar_type(), at::kFloat);
  expect_solid(images[0], {200, 100, 50});
  expect_solid(images[1], {10, 20, 250});
  expect_solid(images[2], {128, 128, 128});  // grey expanded to RGB by stb
  expect_solid(images[3], {200, 100, 50});   // cycled: image 3 mod 3
  auto d = pipeline.describe();
  EXPECT_EQ(d.at("images"), 3);
  ASSERT_EQ(d.at("files").size(), 3u);
  EXPECT_EQ(d.at("files")[1].at("width"), 8);
  EXPECT_EQ(d.at("files")[1].at("height"), 6);
  EXPECT_THAT(d.at("files")[2].at("path").get<std::string>(), HasSubstr("c_grey.pgm"));
}

TEST(ImagePipelineTest, CyclesImagesInPathOrderPerStep) {
  ImagePipeline pipeline(ImagePipelineOptions(image_dir()).image_size(8).global_batch(4).channels(1));
  at::Tensor step1 = pipeline.images(1);  // images 4..7 mod 3 = 1, 2, 0, 1
  ImagePipeline single(ImagePipelineOptions(image_dir()).image_size(8).global_batch(1).channels(1));
  EXPECT_TRUE(step1[0].equal(single.images(1)[0]));
  EXPECT_TRUE(step1[1].equal(single.images(2)[0]));
  EXPECT_TRUE(step1[2].equal(single.images(0)[0]));
  EXPECT_TRUE(step1[3].equal(single.images(1)[0]));
  EXPECT_TRUE(step1.equal(ImagePipeline(ImagePipelineOptions(image_dir()).image_size(8).global_batch(4).channels(1))
                              .images(1)));
}

TEST(ImagePipelineTest, ResizesBilinearlyWithHalfPixelCentres) {
  // A 2x1 grey image [0, 255] widened to 4: output x samples source x = (x + 0.5) / 2 - 0.5
  // = -0.25, 0.25, 0.75, 1.25, clamped to the edges: 0, 0.25, 0.75, 1 (align_corners=false,
  // as torch.nn.functional.interpolate).
  auto dir = mih::testing::temp_dir("ramp");
  write(dir / "ramp.pgm", std::string("P5\n2 1\n255\n") + '\0' + '\xff');
  ImagePipeline pipeline(ImagePipelineOptions(dir).image_size(4).channels(1).global_batch(1));
  at::Tensor image = pipeline.images(0)[0][0];
  at::Tensor expected = at::tensor({0.0f, 0.25f, 0.75f, 1.0f}).expand({4, 4});
  EXPECT_LE((image - expected).abs().max().item<float>(), 1e-6f) << image;
}

TEST(ImagePipelineTest, OptionsRoundTripThroughJson) {
  auto options = ImagePipelineOptions(image_dir()).image_size(64).channels(1).seed(3);
  nlohmann::json j = options;
  EXPECT_EQ(nlohmann::json(j.get<ImagePipelineOptions>()), j);
  EXPECT_EQ(::testing::PrintToString(options), j.dump());
  EXPECT_THAT(([] { nlohmann::json({{"size", 3}}).get<ImagePipelineOptions>(); }),
              ThrowsError(Code::kInvalidSpec, HasSubstr("unknown field 'size'")));
}

TEST(ImagePipelineTest, RejectsBadOptions) {
  EXPECT_THAT([] { ImagePipeline(ImagePipelineOptions().channels(5)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'channels' must be 1, 2, 3 or 4, got 5")));
  EXPECT_THAT([] { ImagePipeline(ImagePipelineOptions().image_size(0)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'image_size' must be >= 1, got 0")));
  EXPECT_THAT([] { ImagePipeline(ImagePipelineOptions()).images(-1); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("step must be >= 0")));
}

TEST(ImagePipelineTest, RejectsMissingDirectory) {
  auto missing = mih::testing::temp_dir("missing_images") / "nope";
  EXPECT_THAT([&] { ImagePipeline{ImagePipelineOptions(missing)}; },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr("'" + missing.string() + "' does not exist"),
                                                           HasSubstr("procedural images"))));
}

TEST(ImagePipelineTest, RejectsDirectoryWithoutImages) {
  auto dir = mih::testing::temp_dir("no_images");
  write(dir / "readme.txt", "text");
  EXPECT_THAT([&] { ImagePipeline{ImagePipelineOptions(dir)}; },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr("holds no image file"), HasSubstr("readme.txt"))));
}

TEST(ImagePipelineTest, NamesTheFileThatFailsToDecode) {
  auto dir = mih::testing::temp_dir("corrupt_images");
  write(dir / "a_good.ppm", solid_pnm(2, 2, {1, 2, 3}));
  write(dir / "b_corrupt.png", "\x89PNG\r\n\x1a\n this is not a png");
  EXPECT_THAT([&] { ImagePipeline{ImagePipelineOptions(dir)}; },
              ThrowsError(Code::kFailedPrecondition,
                          AllOf(HasSubstr("cannot decode image '" + (dir / "b_corrupt.png").string() + "'"),
                                HasSubstr("stb_image: "))));
  auto truncated = mih::testing::temp_dir("truncated_images");
  write(truncated / "short.ppm", "P6\n4 4\n255\nabc");
  EXPECT_THAT([&] { ImagePipeline{ImagePipelineOptions(truncated)}; },
              ThrowsError(Code::kFailedPrecondition,
                          AllOf(HasSubstr("cannot decode image '" + (truncated / "short.ppm").string() + "'"),
                                HasSubstr("truncated"), HasSubstr("need 48 bytes of pixels, got 3"))));
}

TEST(ImagePipelineTest, ScalesPnmSamplesByMaxval) {
  // A 16-bit PGM (maxval 1000, big-endian samples 500) with a comment, and an 8-bit PPM with
  // maxval 15: both are samples / maxval.
  auto dir = mih::testing::temp_dir("maxval");
  std::string wide = "P5\n# made by hand\n2 2\n1000\n";
  for (int i = 0; i < 4; ++i) wide += std::string{'\x01', '\xf4'};
  write(dir / "a_wide.pgm", wide);
  write(dir / "b_low.ppm", "P6 1 1 15\n" + std::string{'\x0f', '\x00', '\x05'});
  ImagePipeline pipeline(ImagePipelineOptions(dir).image_size(2).global_batch(2));
  at::Tensor images = pipeline.images(0);
  expect_solid(images[0], {127.5, 127.5, 127.5});
  expect_solid(images[1], {255, 0, 85});
}

}  // namespace
}  // namespace mih::data
