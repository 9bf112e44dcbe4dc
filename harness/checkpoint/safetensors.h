// The safetensors file format, torch-free: the file layer of a distributed checkpoint. Each
// rank writes its shards with write_file; a Reader opens any safetensors file (ours or one
// written by the Python/Rust library) and reads whole tensors or boxes of them with pread.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mih::safetensors {

// The format stores little-endian bytes and we copy them verbatim.
static_assert(std::endian::native == std::endian::little, "mih::safetensors assumes a little-endian host");

// Format (https://github.com/huggingface/safetensors, README "Format"):
//   [8 bytes]  N, an unsigned little-endian 64-bit integer: the size of the header in bytes
//   [N bytes]  a UTF-8 JSON object, may be padded with trailing spaces (0x20):
//              {"__metadata__": {"k": "v", ...},            (optional, string -> string)
//               "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   [rest]     the data section: each tensor's row-major bytes at [begin, end) relative to
//              the start of the data section (8 + N); the entries cover it exactly, with no
//              gap and no overlap. Header keys may appear in any order.

/// Largest header a Reader accepts, in bytes (a guard against a corrupt length field).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

/// Most tensors one header may list (2^16): a Hugging Face shard holds a few thousand at
/// most (a 5 GB shard of 65,536 tensors would average 80 KB a tensor). A header listing more
/// is refused as corrupt or hostile: a million empty tensors fit in kMaxHeaderBytes, and
/// every tensor costs the inventory, the diff and the evidence of `mih inspect` their entries.
/// The header is read in one linear pass (a SAX parse, no JSON tree).
inline constexpr size_t kMaxTensors = size_t{1} << 16;

/// Most dims one tensor's shape may have (NumPy 2's NPY_MAXDIMS).
inline constexpr size_t kMaxDims = 64;

/// Element size in bytes of a safetensors dtype name: "F64", "F32", "F16", "BF16", "I64",
/// "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2".
/// Throws: mih::Error{kInvalidSpec} naming the dtype and listing the valid ones.
size_t dtype_size(std::string_view dtype);

/// The valid dtype names, comma-separated, for error messages.
std::string valid_dtypes();

/// One tensor to write: `nbytes` bytes of row-major contiguous data at `data` (not owned;
/// may be null when nbytes == 0). `shape` {} is a 0-dim tensor (one element).
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// Writes a safetensors file atomically: a temp file in the same directory, the bytes
/// streamed from the views (no copy of the data), fsync, then rename over `path`; missing
/// parent directories are created. Layout: the 8-byte little-endian header length N, N bytes
/// of compact JSON padded with spaces to a multiple of 8 (so the data section starts
/// 8-aligned), then the tensors' bytes in the given order. The header holds "__metadata__"
/// first (omitted when `metadata` is empty), then one entry per tensor in the given order.
/// Throws: mih::Error{kInvalidSpec} for an empty or duplicate name, the name "__metadata__",
///   an unknown dtype, a negative dim, nbytes != prod(shape) * dtype_size(dtype), null data
///   with nbytes > 0, or a name/metadata string that is not valid UTF-8;
///   mih::Error{kFailedPrecondition} naming the path and the OS error when the directory
///   can't be created or the file written.
void write_file(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                const std::map<std::string, std::string>& metadata = {});

/// Where one tensor lives in a file.
struct TensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;  ///< {} for a 0-dim tensor
  uint64_t begin = 0;          ///< byte offset within the data section
  uint64_t end = 0;            ///< one past the last byte; end - begin = numel() * dtype_size(dtype)

  /// Product of the dims (1 for a 0-dim tensor).
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

/// An open safetensors file: the header is parsed and validated at construction, data is
/// read on demand with pread. The file descriptor stays open for the Reader's lifetime, so
/// the file may be renamed or unlinked meanwhile. Const methods are safe to call from several
/// threads at once. Move-only.
class Reader {
 public:
  /// Opens `path` and validates the whole header against the file size, in time linear in
  /// the header. Never blocks on a FIFO or a device (open_regular_file) and never quotes the
  /// bytes of a file that is not a safetensors file.
  /// Throws: mih::Error{kFailedPrecondition} naming the path and the OS error if the file
  ///   can't be opened or stat'ed;
  ///   mih::Error{kInvalidSpec}, the message naming the file (and the tensor when one is at
  ///   fault), if it is not a regular file (a FIFO, a device, a directory); the file is
  ///   shorter than 8 bytes; the header length exceeds the file or kMaxHeaderBytes; the
  ///   header is not a JSON object, repeats a key, nests deeper than the format (an entry's
  ///   shape), or lists more than kMaxTensors tensors; an entry lacks a field, has an extra
  ///   one or an unknown dtype; a shape has more than kMaxDims dims or a negative one;
  ///   data_offsets are not [begin <= end] or end - begin != prod(shape) * dtype size; two
  ///   entries overlap; the
  ///   entries leave a gap or trailing bytes in the data section; the data section is short
  ///   (naming the first tensor whose bytes are missing and how many bytes the file lacks);
  ///   "__metadata__" is not an object of strings.
  explicit Reader(std::filesystem::path path);
  ~Reader();
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&& other) noexcept;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Tensor names in data order (by data_offsets; ties, i.e. empty tensors, in header order).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) > 0; }
  /// Throws: mih::Error{kInvalidSpec} naming the file and the tensor if it is absent.
  const TensorInfo& info(const std::string& name) const;
  /// The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// File offset of the data section in bytes: 8 + N.
  uint64_t data_start() const { return data_start_; }

  /// Reads the whole tensor into `dst`, which must hold info(name).nbytes() bytes.
  /// Throws: mih::Error{kInvalidSpec} if the tensor is absent; mih::Error{kFailedPrecondition}
  ///   naming the file and tensor on an I/O error or a short read (the file shrank).
  void read(const std::string& name, void* dst) const;

  /// Reads the box [offset, offset + lengths) (per dim) of the tensor into `dst` as a
  /// contiguous row-major block of prod(lengths) * dtype size bytes. Only the needed bytes
  /// are read: the trailing dims the box covers fully are merged with the innermost partial
  /// dim into one run, one pread per run. A 0-dim tensor takes empty offset/lengths; a box
  /// with a zero length reads nothing.
  /// Throws: mih::Error{kInvalidSpec} naming the file and tensor if the tensor is absent,
  ///   offset/lengths rank differs from the tensor's, or the box is outside the shape (with
  ///   the dim and the arithmetic); mih::Error{kFailedPrecondition} on an I/O error or short read.
  void read_box(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& lengths,
                void* dst) const;

 private:
  void pread_exact(const std::string& name, uint64_t file_offset, size_t nbytes, void* dst) const;

  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// The tensor names of a checkpoint directory in Hugging Face layout, sorted:
/// model.safetensors.index.json's "weight_map" keys when the index exists (the shards are not
/// opened: this is a key listing), else model.safetensors's names when it exists (the other
/// safetensors files beside it, e.g. an export's batch, are not weights), else the names of
/// every *.safetensors file in it.
/// Throws: mih::Error{kFailedPrecondition} naming the directory when it does not exist or
///   holds neither; kInvalidSpec naming the file when the index is not JSON or has no
///   weight_map object; as Reader for a malformed safetensors file.
std::vector<std::string> checkpoint_keys(const std::filesystem::path& dir);

}  // namespace mih::safetensors
