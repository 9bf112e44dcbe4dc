// The safetensors file layer: round trips, the on-disk layout checked against the format spec
// with an independent parser, read_box against slicing, and every rejected file and write.
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/checkpoint/safetensors.h"
#include "tests/support/temp_dir.h"

namespace mih::safetensors {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Matcher;
using ::testing::Not;

std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = mih::testing::temp_dir("safetensors");
  return dir;
}

// Matches a callable that throws mih::Error with `code` and a what() matching `message`.
auto ThrowsError(Code code, const Matcher<std::string>& message) {
  return ::testing::Throws<Error>(
      AllOf(::testing::Property(&Error::code, code),
            ::testing::ResultOf([](const Error& e) { return std::string(e.what()); }, message)));
}

template <class T>
std::vector<T> iota_vector(size_t n, T start = T{}) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

template <class T>
TensorView view(std::string name, std::string dtype, std::vector<int64_t> shape, const std::vector<T>& data) {
  return {std::move(name), std::move(dtype), std::move(shape), data.data(), data.size() * sizeof(T)};
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file built by hand: the 8-byte little-endian length, `header` as is, `data_bytes` bytes.
std::filesystem::path write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  auto path = temp_dir() / name;
  uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out << header << std::string(data_bytes, '\x5a');
  return path;
}

template <class T>
std::vector<T> read_all(const Reader& reader, const std::string& name) {
  std::vector<T> out(reader.info(name).nbytes() / sizeof(T));
  reader.read(name, out.data());
  return out;
}

TEST(SafetensorsTest, DtypeSizes) {
  EXPECT_EQ(dtype_size("F64"), 8u);
  EXPECT_EQ(dtype_size("F32"), 4u);
  EXPECT_EQ(dtype_size("F16"), 2u);
  EXPECT_EQ(dtype_size("BF16"), 2u);
  EXPECT_EQ(dtype_size("I64"), 8u);
  EXPECT_EQ(dtype_size("I32"), 4u);
  EXPECT_EQ(dtype_size("I16"), 2u);
  EXPECT_EQ(dtype_size("I8"), 1u);
  EXPECT_EQ(dtype_size("U8"), 1u);
  EXPECT_EQ(dtype_size("BOOL"), 1u);
  EXPECT_THAT([] { dtype_size("f32"); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr("got 'f32'"), HasSubstr("F64, F32, F16, BF16"))));
}

TEST(SafetensorsTest, RoundTripsDtypesShapesAndMetadata) {
  auto f32 = iota_vector<float>(6, 0.5f);
  auto f64 = iota_vector<double>(4, -2.0);
  auto bf16 = iota_vector<uint16_t>(6, 0x3f80);
  auto f16 = iota_vector<uint16_t>(2, 0x3c00);
  std::vector<int64_t> scalar = {-1234567890123};
  std::vector<int32_t> i32 = {1, -2, 3};
  std::vector<int16_t> i16 = {-7, 7};
  std::vector<int8_t> i8 = {-128, 127, 0, 1};
  std::vector<uint8_t> empty;
  std::vector<uint8_t> flags = {1, 0, 1};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "7"}};
  auto path = temp_dir() / "round_trip" / "model.safetensors";
  write_file(path,
             {view("layers.0.w", "F32", {2, 3}, f32), view("f64", "F64", {4}, f64), view("bf16", "BF16", {3, 1, 2}, bf16),
              view("f16", "F16", {2}, f16), view("scalar", "I64", {}, scalar), view("i32", "I32", {3}, i32),
              view("i16", "I16", {1, 2}, i16), view("i8", "I8", {2, 2}, i8), view("empty", "U8", {0, 5}, empty),
              view("flags", "BOOL", {3}, flags)},
             metadata);

  Reader reader(path);
  EXPECT_EQ(reader.path(), path);
  EXPECT_THAT(reader.names(),
              ElementsAre("layers.0.w", "f64", "bf16", "f16", "scalar", "i32", "i16", "i8", "empty", "flags"));
  EXPECT_EQ(reader.metadata(), metadata);
  EXPECT_EQ(reader.data_start() % 8, 0u);
  EXPECT_TRUE(reader.contains("scalar"));
  EXPECT_FALSE(reader.contains("missing"));

  const TensorInfo& w = reader.info("layers.0.w");
  EXPECT_EQ(w.dtype, "F32");
  EXPECT_THAT(w.shape, ElementsAre(2, 3));
  EXPECT_EQ(w.begin, 0u);
  EXPECT_EQ(w.end, 24u);
  EXPECT_EQ(w.numel(), 6);
  EXPECT_EQ(reader.info("scalar").shape.size(), 0u);
  EXPECT_EQ(reader.info("scalar").numel(), 1);
  EXPECT_EQ(reader.info("empty").numel(), 0);
  EXPECT_EQ(reader.info("empty").nbytes(), 0u);
  EXPECT_THAT(reader.info("empty").shape, ElementsAre(0, 5));

  EXPECT_EQ(read_all<float>(reader, "layers.0.w"), f32);
  EXPECT_EQ(read_all<double>(reader, "f64"), f64);
  EXPECT_EQ(read_all<uint16_t>(reader, "bf16"), bf16);
  EXPECT_EQ(read_all<uint16_t>(reader, "f16"), f16);
  EXPECT_EQ(read_all<int64_t>(reader, "scalar"), scalar);
  EXPECT_EQ(read_all<int32_t>(reader, "i32"), i32);
  EXPECT_EQ(read_all<int16_t>(reader, "i16"), i16);
  EXPECT_EQ(read_all<int8_t>(reader, "i8"), i8);
  EXPECT_EQ(read_all<uint8_t>(reader, "empty"), empty);
  EXPECT_EQ(read_all<uint8_t>(reader, "flags"), flags);
}

TEST(SafetensorsTest, NoTensorsAndNoMetadata) {
  auto path = temp_dir() / "nothing.safetensors";
  write_file(path, {});
  EXPECT_EQ(file_bytes(path), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  Reader reader(path);
  EXPECT_TRUE(reader.names().empty());
  EXPECT_TRUE(reader.metadata().empty());
}

// Parses the file per the format spec (huggingface/safetensors README, "Format") without our
// Reader, so that what we write is what any safetensors reader expects.
TEST(SafetensorsTest, LayoutFollowsTheFormatSpec) {
  auto a = iota_vector<float>(12, 1.0f);
  std::vector<int64_t> b = {42};
  std::vector<uint16_t> c = {1, 2, 3};  // 6 bytes: the next tensor starts unaligned, as the spec allows
  std::vector<uint8_t> d;
  auto path = temp_dir() / "layout.safetensors";
  write_file(path, {view("a", "F32", {3, 4}, a), view("b", "I64", {}, b), view("c", "BF16", {3}, c),
                    view("d", "U8", {0}, d)},
             {{"format", "pt"}});

  const std::string bytes = file_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "the data section must start 8-aligned";
  ASSERT_LE(8 + n, bytes.size());
  const std::string header_text = bytes.substr(8, n);
  EXPECT_EQ(header_text.front(), '{');
  const size_t close = header_text.find_last_of('}');
  EXPECT_EQ(header_text.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces";

  const auto header = nlohmann::json::parse(header_text);
  ASSERT_TRUE(header.is_object());
  EXPECT_EQ(header.size(), 5u);
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"format", "pt"}}));
  EXPECT_EQ(header["a"], nlohmann::json::parse(R"({"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]})"));
  EXPECT_EQ(header["b"], nlohmann::json::parse(R"({"dtype": "I64", "shape": [], "data_offsets": [48, 56]})"));
  EXPECT_EQ(header["c"], nlohmann::json::parse(R"({"dtype": "BF16", "shape": [3], "data_offsets": [56, 62]})"));
  EXPECT_EQ(header["d"], nlohmann::json::parse(R"({"dtype": "U8", "shape": [0], "data_offsets": [62, 62]})"));
  EXPECT_EQ(bytes.size(), 8 + n + 62);

  const char* data = bytes.data() + 8 + n;
  EXPECT_EQ(std::memcmp(data, a.data(), 48), 0);
  EXPECT_EQ(std::memcmp(data + 48, b.data(), 8), 0);
  EXPECT_EQ(std::memcmp(data + 56, c.data(), 6), 0);
}

TEST(SafetensorsTest, ReaderAcceptsKeysInAnyOrderAndUnpaddedHeaders) {
  // Data order is e, a, z, y while the keys come z, __metadata__, y, a, e; the header is not padded.
  const std::string header =
      R"({"z": {"shape": [2], "dtype": "I16", "data_offsets": [4, 8]}, "__metadata__": {"k": "v"},)"
      R"( "y": {"data_offsets": [8, 8], "dtype": "F32", "shape": [2, 0]},)"
      R"( "a": {"dtype": "U8", "data_offsets": [0, 4], "shape": [4]}, "e": {"dtype": "F64", "shape": [0], "data_offsets": [0, 0]}})";
  ASSERT_NE(header.size() % 8, 0u);
  auto path = write_raw("any_order.safetensors", header, 8);
  Reader reader(path);
  EXPECT_THAT(reader.names(), ElementsAre("e", "a", "z", "y"));
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"k", "v"}}));
  EXPECT_EQ(reader.data_start(), 8 + header.size());
  EXPECT_EQ(read_all<int16_t>(reader, "z"), (std::vector<int16_t>{0x5a5a, 0x5a5a}));
}

// Row-major slice of `data` (shape `shape`) over the box, the reference for read_box.
template <class T>
std::vector<T> slice(const std::vector<T>& data, const std::vector<int64_t>& shape, const std::vector<int64_t>& offset,
                     const std::vector<int64_t>& lengths) {
  std::vector<T> out;
  int64_t count = 1;
  for (int64_t len : lengths) count *= len;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      flat += (offset[d] + rest % lengths[d]) * stride;
      rest /= lengths[d];
      stride *= shape[d];
    }
    out.push_back(data[static_cast<size_t>(flat)]);
  }
  return out;
}

TEST(SafetensorsTest, ReadBoxMatchesSlicing) {
  const std::vector<int64_t> shape3 = {4, 5, 6};
  auto t3 = iota_vector<float>(120, 0.0f);
  const std::vector<int64_t> shape4 = {2, 3, 4, 5};
  auto t4 = iota_vector<int16_t>(120, -60);
  auto t1 = iota_vector<double>(9, 0.25);
  std::vector<int32_t> t0 = {77};
  std::vector<uint8_t> tz;
  auto path = temp_dir() / "boxes.safetensors";
  write_file(path, {view("pad", "U8", {3}, std::vector<uint8_t>{9, 9, 9}), view("t3", "F32", shape3, t3),
                    view("t4", "I16", shape4, t4), view("t1", "F64", {9}, t1), view("t0", "I32", {}, t0),
                    view("tz", "U8", {3, 0}, tz)});
  Reader reader(path);

  struct Box {
    std::vector<int64_t> offset, lengths;
  };
  const std::vector<Box> boxes3 = {
      {{0, 0, 0}, {4, 5, 6}},  // full: one run
      {{2, 3, 4}, {1, 1, 1}},  // single element
      {{1, 2, 1}, {2, 3, 4}},  // interior: runs of 4 elements
      {{1, 0, 0}, {2, 5, 6}},  // full inner dims: one run
      {{0, 1, 0}, {4, 2, 6}},  // full last dim: runs of 12 elements
      {{3, 4, 5}, {1, 1, 1}},  // last element
      {{0, 0, 5}, {4, 5, 1}},  // a column
      {{1, 0, 0}, {2, 3, 6}},  // a leading-edge partial dim stops the merge: runs of 18 elements
      {{0, 0, 0}, {2, 2, 3}},  // the corner: runs of 3 elements
  };
  for (const Box& box : boxes3) {
    SCOPED_TRACE(::testing::PrintToString(box.offset) + " + " + ::testing::PrintToString(box.lengths));
    auto expected = slice(t3, shape3, box.offset, box.lengths);
    std::vector<float> got(expected.size(), -1.0f);
    reader.read_box("t3", box.offset, box.lengths, got.data());
    EXPECT_EQ(got, expected);
  }
  for (const Box& box : std::vector<Box>{{{1, 0, 1, 0}, {1, 3, 2, 5}}, {{0, 1, 0, 2}, {2, 2, 4, 3}}}) {
    auto expected = slice(t4, shape4, box.offset, box.lengths);
    std::vector<int16_t> got(expected.size());
    reader.read_box("t4", box.offset, box.lengths, got.data());
    EXPECT_EQ(got, expected);
  }
  std::vector<double> got1(4);
  reader.read_box("t1", {5}, {4}, got1.data());
  EXPECT_EQ(got1, slice(t1, {9}, {5}, {4}));

  int32_t scalar = 0;
  reader.read_box("t0", {}, {}, &scalar);
  EXPECT_EQ(scalar, 77);

  // An empty box reads nothing: the sentinel stays.
  float sentinel = -1.0f;
  reader.read_box("t3", {1, 2, 3}, {2, 0, 1}, &sentinel);
  reader.read_box("t3", {4, 5, 6}, {0, 0, 0}, &sentinel);
  reader.read_box("tz", {1, 0}, {2, 0}, &sentinel);
  EXPECT_EQ(sentinel, -1.0f);
}

TEST(SafetensorsTest, ReadBoxRejectsBoxesOutsideTheShape) {
  auto t = iota_vector<float>(6);
  auto path = temp_dir() / "box_errors.safetensors";
  write_file(path, {view("w", "F32", {2, 3}, t)});
  Reader reader(path);
  float out[6];
  const auto names_both = AllOf(HasSubstr(path.string()), HasSubstr("tensor 'w'"));
  EXPECT_THAT([&] { reader.read_box("w", {0}, {2}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box rank expected 2"))));
  EXPECT_THAT([&] { reader.read_box("w", {0, 0}, {2}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box rank expected 2"))));
  EXPECT_THAT([&] { reader.read_box("w", {1, 1}, {2, 1}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box dim 0 [1, 1 + 2) is outside [0, 2)"))));
  EXPECT_THAT([&] { reader.read_box("w", {0, -1}, {1, 1}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box dim 1"))));
  EXPECT_THAT([&] { reader.read_box("w", {0, 0}, {1, -1}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box dim 1"))));
  EXPECT_THAT([&] { reader.read_box("w", {0, 4}, {1, 0}, out); },
              ThrowsError(Code::kInvalidSpec, AllOf(names_both, HasSubstr("box dim 1 [4, 4 + 0) is outside [0, 3)"))));
}

TEST(SafetensorsTest, AbsentTensorNamesFileAndTensor) {
  auto t = iota_vector<float>(2);
  auto path = temp_dir() / "absent.safetensors";
  write_file(path, {view("w", "F32", {2}, t)});
  Reader reader(path);
  const auto message = AllOf(HasSubstr(path.string()), HasSubstr("no tensor 'bias'"));
  EXPECT_THAT([&] { reader.info("bias"); }, ThrowsError(Code::kInvalidSpec, message));
  float out[2];
  EXPECT_THAT([&] { reader.read("bias", out); }, ThrowsError(Code::kInvalidSpec, message));
  EXPECT_THAT([&] { reader.read_box("bias", {0}, {1}, out); }, ThrowsError(Code::kInvalidSpec, message));
}

TEST(SafetensorsTest, MissingFileIsFailedPrecondition) {
  auto path = temp_dir() / "does_not_exist.safetensors";
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kFailedPrecondition,
                          AllOf(HasSubstr(path.string()), HasSubstr("No such file or directory"))));
}

TEST(SafetensorsTest, TruncatedFileNamesTheTensorAndTheMissingBytes) {
  auto a = iota_vector<int32_t>(4), b = iota_vector<int32_t>(4), c = iota_vector<int32_t>(4);
  auto path = temp_dir() / "truncated.safetensors";
  write_file(path, {view("a", "I32", {4}, a), view("b", "I32", {2, 2}, b), view("c", "I32", {4}, c)});
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 20);  // data section: 28 of 48 bytes, b ends at 32
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec,
                          AllOf(HasSubstr(path.string()), HasSubstr("truncated"), HasSubstr("tensor 'b'"),
                                HasSubstr("[16, 32)"), HasSubstr("lacks 20 bytes"))));
  std::filesystem::resize_file(path, size - 1);
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr("tensor 'c'"), HasSubstr("lacks 1 bytes"))));
}

TEST(SafetensorsTest, RejectsFilesShorterThanTheLengthField) {
  auto path = temp_dir() / "short.safetensors";
  std::ofstream(path, std::ios::binary) << "abcde";
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(path.string()), HasSubstr("expected at least 8 bytes (the header length), got 5 bytes"))));
}

TEST(SafetensorsTest, RejectsCorruptHeaderLength) {
  auto t = iota_vector<float>(4);
  auto path = temp_dir() / "bad_length.safetensors";
  auto corrupt = [&](uint64_t n) {
    write_file(path, {view("w", "F32", {4}, t)});
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.write(reinterpret_cast<const char*>(&n), sizeof(n));
  };
  // The length is never printed: the first 8 bytes of a file that is no safetensors file
  // (a symlink to a secret) would be echoed as an integer.
  corrupt(1000);
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(path.string()),
                                                    HasSubstr("header length (the first 8 bytes) expected at most the "
                                                              "file size"),
                                                    HasSubstr("got more"), Not(HasSubstr("1000")))));
  corrupt(uint64_t{1} << 40);
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(path.string()), HasSubstr("at most 104857600 bytes"),
                                                    Not(HasSubstr(std::to_string(uint64_t{1} << 40))))));
  // A length that ends inside the JSON cuts the object short.
  corrupt(20);
  EXPECT_THAT([&] { Reader reader(path); }, ThrowsError(Code::kInvalidSpec, HasSubstr("not valid JSON")));
}

TEST(SafetensorsTest, RejectsHeadersThatAreNotAJsonObject) {
  auto bad = write_raw("bad_json.safetensors", R"({"w": {"dtype": "F32",)", 0);
  EXPECT_THAT([&] { Reader reader(bad); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(bad.string()), HasSubstr("header is not valid JSON"))));
  auto array = write_raw("array.safetensors", "[1, 2]  ", 0);
  EXPECT_THAT([&] { Reader reader(array); },
              ThrowsError(Code::kInvalidSpec,
                          AllOf(HasSubstr(array.string()), HasSubstr("header expected a JSON object, got array"))));
}

TEST(SafetensorsTest, RejectsMalformedEntries) {
  struct Case {
    std::string label, header;
    size_t data_bytes;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"missing field", R"({"w": {"dtype": "F32", "shape": [1]}})", 4, {"tensor 'w'", "missing field 'data_offsets'"}},
      {"extra field",
       R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "stride": [1]}})",
       4,
       {"tensor 'w'", "unexpected field 'stride'"}},
      {"entry not an object", R"({"w": [0, 4]})", 4, {"tensor 'w'", "expected an object"}},
      {"unknown dtype",
       R"({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})",
       16,
       {"tensor 'w'", "got 'F128'", "BF16"}},
      {"negative dim",
       R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})",
       0,
       {"tensor 'w'", "expected dims >= 0, got -1 at dim 1"}},
      {"fractional dim",
       R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})",
       4,
       {"tensor 'w'", "shape expected an array of integers"}},
      {"offsets not matching shape",
       R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
       20,
       {"tensor 'w'", "span 20 bytes, expected prod(shape [2, 3]) * 4 (F32) = 24"}},
      {"end before begin",
       R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})",
       4,
       {"tensor 'w'", "begin <= end"}},
      {"negative offset",
       R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})",
       1,
       {"tensor 'w'", "non-negative integers"}},
      {"metadata value not a string",
       R"({"__metadata__": {"step": 7}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})",
       1,
       {"\"__metadata__\" value of 'step' expected a string, got number 7"}},
      {"metadata not an object", R"({"__metadata__": "pt"})", 0, {"\"__metadata__\" expected an object"}},
      {"duplicate tensor",
       R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       2,
       {"repeats the key 'w'"}},
      {"overlap",
       R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})",
       12,
       {"tensor 'b' data_offsets [4, 12) overlap tensor 'a' [0, 8)"}},
      {"empty tensor inside another",
       R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}})",
       8,
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"gap",
       R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}})",
       12,
       {"data bytes [4, 8) belong to no tensor", "before tensor 'b'"}},
      {"trailing bytes",
       R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
       6,
       {"data section has 6 bytes but the tensors cover 4"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.label);
    auto path = write_raw("malformed_" + std::to_string(i) + ".safetensors", c.header, c.data_bytes);
    std::vector<Matcher<std::string>> parts = {HasSubstr(path.string())};
    for (const auto& part : c.message) parts.push_back(HasSubstr(part));
    EXPECT_THAT([&] { Reader reader(path); }, ThrowsError(Code::kInvalidSpec, ::testing::AllOfArray(parts)));
  }
}

TEST(SafetensorsTest, RefusesAFifoWithoutWaitingForAWriter) {
  auto path = temp_dir() / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << std::strerror(errno);
  // A plain open blocks until a writer comes; none ever does here.
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(path.string()), HasSubstr("FIFO"))));
  EXPECT_THAT([&] { Reader reader(temp_dir()); }, ThrowsError(Code::kInvalidSpec, HasSubstr("a directory")));
}

TEST(SafetensorsTest, RefusesNestingDeeperThanTheFormatAtOnce) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"__metadata__\": {\"format\": " + deep + "}}", "\"__metadata__\" value of 'format' expected a string, got array"},
      {"{\"w\": {\"dtype\": \"F32\", \"shape\": " + deep + ", \"data_offsets\": [0, 0]}}",
       "shape expected an array of integers, got an array holding an array"},
      {"{\"w\": {\"dtype\": " + deep + "}}", "dtype expected a string, got array"},
      {"{\"w\": " + deep + "}", "expected an object with"},
      {deep, "header expected a JSON object, got array"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].second);
    auto path = write_raw("deep_" + std::to_string(i) + ".safetensors", cases[i].first, 0);
    EXPECT_THAT([&] { Reader reader(path); }, ThrowsError(Code::kInvalidSpec, HasSubstr(cases[i].second)));
  }
}

TEST(SafetensorsTest, BoundsTheTensorsAndDimsOfAHeader) {
  std::string header = "{";
  for (size_t i = 0; i <= kMaxTensors; ++i) {
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  auto many = write_raw("many.safetensors", header + "}", 0);
  EXPECT_THAT([&] { Reader reader(many); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("header lists more than 65536 tensors")));
  // At the bound the header is read whole, in linear time (an ordered JSON tree took minutes).
  header.resize(header.rfind(",\"t"));
  auto bound = write_raw("bound.safetensors", header + "}", 0);
  Reader reader(bound);
  EXPECT_EQ(reader.names().size(), kMaxTensors);
  std::string dims = "[1";
  for (size_t d = 1; d <= kMaxDims; ++d) dims += ",1";
  auto rank = write_raw("rank.safetensors", "{\"w\":{\"dtype\":\"U8\",\"shape\":" + dims + "],\"data_offsets\":[0,1]}}", 1);
  EXPECT_THAT([&] { Reader r(rank); }, ThrowsError(Code::kInvalidSpec, HasSubstr("shape has more than 64 values")));
}

TEST(SafetensorsTest, ParseErrorsQuoteNoBytesOfTheFile) {
  auto path = write_raw("not_json.safetensors", "rootsecret:x:0:0", 0);
  EXPECT_THAT([&] { Reader reader(path); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr("header is not valid JSON"), Not(HasSubstr("last read")),
                                                    Not(HasSubstr("rootsecret")), Not(HasSubstr("'ro")))));
}

TEST(SafetensorsTest, WriteRejectsBadTensors) {
  auto t = iota_vector<float>(6);
  auto path = temp_dir() / "rejected" / "x.safetensors";
  auto rejects = [&](std::vector<TensorView> tensors, std::map<std::string, std::string> metadata,
                     const Matcher<std::string>& message) {
    EXPECT_THAT([&] { write_file(path, tensors, metadata); },
                ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr(path.string()), message)));
  };
  rejects({view("w", "F32", {6}, t), view("w", "F32", {2, 3}, t)}, {}, HasSubstr("duplicate tensor name 'w'"));
  rejects({view("", "F32", {6}, t)}, {}, HasSubstr("expected a non-empty name"));
  rejects({view("__metadata__", "F32", {6}, t)}, {}, HasSubstr("'__metadata__' is reserved"));
  rejects({view("w", "F32", {2, 2}, t)}, {},
          HasSubstr("tensor 'w': nbytes expected prod(shape [2, 2]) * 4 (F32) = 16, got 24"));
  rejects({view("w", "F16", {6}, t)}, {}, HasSubstr("= 12, got 24"));
  rejects({view("w", "FP32", {6}, t)}, {}, AllOf(HasSubstr("tensor 'w'"), HasSubstr("got 'FP32'")));
  rejects({view("w", "F32", {-6}, t)}, {}, HasSubstr("expected dims >= 0, got -6 at dim 0"));
  rejects({{"w", "F32", {6}, nullptr, 24}}, {}, HasSubstr("data is null"));
  rejects({view("w\xff", "F32", {6}, t)}, {}, HasSubstr("valid UTF-8"));
  EXPECT_FALSE(std::filesystem::exists(path.parent_path())) << "nothing is created for a rejected write";
}

TEST(SafetensorsTest, UnwritableDirectoryIsFailedPrecondition) {
  auto file = temp_dir() / "a_regular_file";
  std::ofstream(file) << "x";
  auto path = file / "sub" / "x.safetensors";
  auto t = iota_vector<float>(2);
  EXPECT_THAT([&] { write_file(path, {view("w", "F32", {2}, t)}); },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr(path.string()), HasSubstr("Not a directory"))));
}

TEST(SafetensorsTest, WriteReplacesAtomicallyAndOpenReadersKeepTheirFile) {
  auto dir = temp_dir() / "replace";
  auto path = dir / "x.safetensors";
  std::vector<int32_t> first = {1, 2}, second = {3, 4, 5};
  write_file(path, {view("w", "I32", {2}, first)});
  Reader old_reader(path);
  write_file(path, {view("w", "I32", {3}, second)}, {{"v", "2"}});
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename(), "x.safetensors") << "no temp file left behind";
  }
  EXPECT_EQ(read_all<int32_t>(old_reader, "w"), first);
  Reader new_reader(path);
  EXPECT_EQ(read_all<int32_t>(new_reader, "w"), second);
  EXPECT_EQ(new_reader.metadata().at("v"), "2");
}

TEST(SafetensorsTest, ReaderIsMovable) {
  std::vector<int32_t> data = {1, 2, 3};
  auto path = temp_dir() / "movable.safetensors";
  write_file(path, {view("w", "I32", {3}, data)});
  Reader a(path);
  Reader b(std::move(a));
  EXPECT_EQ(read_all<int32_t>(b, "w"), data);
  Reader c(path);
  c = std::move(b);
  EXPECT_EQ(read_all<int32_t>(c, "w"), data);
}

}  // namespace
}  // namespace mih::safetensors
