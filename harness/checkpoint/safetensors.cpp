// write_file and Reader: the safetensors header as nlohmann JSON, data through write/pread.
#include "harness/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/safe_open.h"
#include "harness/base/strings.h"

namespace mih::safetensors {
namespace {

struct DtypeEntry {
  std::string_view name;
  size_t size;
};

constexpr std::array<DtypeEntry, 15> kDtypes = {{
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
}};

// 0 when unknown.
size_t find_dtype_size(std::string_view dtype) {
  for (const auto& d : kDtypes) {
    if (d.name == dtype) return d.size;
  }
  return 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return "[" + join(shape, ", ") + "]";
}

// prod(shape) * element_size, or false on overflow of uint64 (or a negative dim).
bool checked_nbytes(const std::vector<int64_t>& shape, size_t element_size, uint64_t* nbytes) {
  uint64_t n = element_size;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(dim), &n)) return false;
  }
  *nbytes = n;
  return true;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Returns close()'s result; a failed close of a written file can mean lost data.
  int reset() {
    int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Returns 0 or the errno of the failed write.
int write_all(int fd, const void* data, size_t nbytes) {
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    // Linux writes at most ~2 GiB per call; ask for 1 GiB at a time.
    ssize_t n = ::write(fd, p, std::min<size_t>(nbytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    p += n;
    nbytes -= static_cast<size_t>(n);
  }
  return 0;
}

// A name from the header as shown in a message: at most 200 bytes of it.
std::string shown(const std::string& name) {
  if (name.size() <= 200) return name;
  size_t cut = 200;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return name.substr(0, cut) + "...";
}

// The header, read by nlohmann's SAX parser straight into its entries: no DOM (one pass,
// linear in the header; an ordered DOM inserts each key in linear time, and a million empty
// tensors, 66 MB, took an hour), nesting at most 3 levels (header -> entry -> shape), at most
// kMaxTensors entries, each violation thrown where it is read. Rejects a repeated key in any
// object: a DOM keeps the last one silently, which would hide a second entry for a tensor.
class HeaderParser final : public nlohmann::json_sax<nlohmann::json> {
 public:
  struct Entry {
    std::string name;
    TensorInfo info;
    size_t order;
  };

  HeaderParser(const std::string& where, std::map<std::string, std::string>* metadata)
      : where_(where), metadata_(metadata) {}

  std::vector<Entry>& entries() { return entries_; }
  bool done() const { return in_ == In::kDone; }

  bool null() override { return scalar(nullptr); }
  bool boolean(bool v) override { return scalar(v); }
  bool number_integer(number_integer_t v) override { return scalar(v); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return scalar(v); }
  bool string(string_t& v) override { return scalar(std::move(v)); }
  bool binary(binary_t& /*v*/) override { return refuse("binary"); }  // never in JSON text

  bool start_object(std::size_t /*elements*/) override {
    if (in_ == In::kNothing) {
      in_ = In::kHeader;
    } else if (in_ == In::kHeader && key_ == "__metadata__") {
      in_ = In::kMetadata;
    } else if (in_ == In::kHeader) {
      in_ = In::kEntry;
      fields_ = nlohmann::json::object();
    } else {
      return refuse("object");
    }
    return true;
  }

  bool start_array(std::size_t /*elements*/) override {
    if (in_ != In::kEntry || (field_ != "shape" && field_ != "data_offsets")) return refuse("array");
    in_ = In::kList;
    list_ = nlohmann::json::array();
    return true;
  }

  bool key(string_t& key) override {
    if (in_ == In::kHeader) {
      MIH_CHECK(keys_.insert(key).second, where_, "header repeats the key '", shown(key),
                "'; each tensor (and \"__metadata__\") must appear once");
      MIH_CHECK(key == "__metadata__" || ++tensors_ <= kMaxTensors, where_, "header lists more than ", kMaxTensors,
                " tensors, the most mih reads from one file (more than any open checkpoint holds in one file): "
                "a corrupt or hostile file");
      key_ = std::move(key);
    } else if (in_ == In::kMetadata) {
      MIH_CHECK(!metadata_->count(key), where_, "header repeats the key '", shown(key),
                "' in \"__metadata__\"; each key must appear once");
      field_ = std::move(key);
    } else {
      MIH_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", at(), "unexpected field '", shown(key),
                "'; expected only \"dtype\", \"shape\", \"data_offsets\"");
      MIH_CHECK(!fields_.contains(key), where_, "header repeats the key '", key, "' in tensor '", shown(key_),
                "'; each field must appear once");
      field_ = std::move(key);
    }
    return true;
  }

  bool end_object() override {
    if (in_ == In::kEntry) {
      finish_entry();
      in_ = In::kHeader;
    } else if (in_ == In::kMetadata) {
      in_ = In::kHeader;
    } else {
      in_ = In::kDone;
    }
    return true;
  }

  bool end_array() override {
    fields_[field_] = std::move(list_);
    in_ = In::kEntry;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) override {
    MIH_THROW(Code::kInvalidSpec, where_, "header is not valid JSON: ", json_error_text(e));
  }

 private:
  enum class In { kNothing, kHeader, kMetadata, kEntry, kList, kDone };

  std::string at() const { return where_ + "tensor '" + shown(key_) + "': "; }

  bool scalar(nlohmann::json value) {
    if (in_ == In::kEntry) {
      fields_[field_] = std::move(value);
    } else if (in_ == In::kList) {
      MIH_CHECK(list_.size() < kMaxDims, at(), field_, " has more than ", kMaxDims,
                " values; a tensor has at most that many dims");
      list_.push_back(std::move(value));
    } else if (in_ == In::kMetadata) {
      MIH_CHECK(value.is_string(), where_, "\"__metadata__\" value of '", shown(field_), "' expected a string, got ",
                value.type_name(), " ", json_summary(value));
      metadata_->emplace(field_, value.get<std::string>());
    } else {
      return refuse(value.type_name());
    }
    return true;
  }

  // A value where the format has none of its kind.
  bool refuse(const char* kind) {
    switch (in_) {
      case In::kNothing:
        MIH_THROW(Code::kInvalidSpec, where_, "header expected a JSON object, got ", kind);
      case In::kHeader:
        MIH_CHECK(key_ != "__metadata__", where_, "\"__metadata__\" expected an object of strings, got ", kind);
        MIH_THROW(Code::kInvalidSpec, at(), "expected an object with \"dtype\", \"shape\", \"data_offsets\", got ", kind);
      case In::kMetadata:
        MIH_THROW(Code::kInvalidSpec, where_, "\"__metadata__\" value of '", shown(field_), "' expected a string, got ",
                  kind);
      case In::kEntry:
        MIH_CHECK(field_ != "dtype", at(), "dtype expected a string, got ", kind);
        MIH_CHECK(field_ != "shape", at(), "shape expected an array of integers, got ", kind);
        MIH_THROW(Code::kInvalidSpec, at(), "data_offsets expected [begin, end] of non-negative integers, got ", kind);
      default:
        MIH_THROW(Code::kInvalidSpec, at(), field_, " expected an array of integers, got an array holding an ", kind);
    }
  }

  void finish_entry() {
    const std::string at = this->at();
    const nlohmann::json& value = fields_;
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      MIH_CHECK(value.contains(field), at, "missing field '", field, "'");
    }
    Entry e{key_, {}, entries_.size()};
    const auto& dtype = value["dtype"];
    MIH_CHECK(dtype.is_string(), at, "dtype expected a string, got ", json_summary(dtype));
    e.info.dtype = dtype.get<std::string>();
    const size_t element_size = find_dtype_size(e.info.dtype);
    MIH_CHECK(element_size != 0, at, "dtype expected one of ", valid_dtypes(), ", got '", shown(e.info.dtype), "'");

    const auto& shape = value["shape"];
    MIH_CHECK(shape.is_array(), at, "shape expected an array of integers, got ", json_summary(shape));
    for (size_t d = 0; d < shape.size(); ++d) {
      const auto& dim = shape[d];
      MIH_CHECK(dim.is_number_integer(), at, "shape expected an array of integers, got ", json_summary(shape));
      MIH_CHECK(!dim.is_number_unsigned() || dim.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), at, "shape ",
                json_summary(shape), ": dim ", d, " does not fit in int64");
      MIH_CHECK(dim.get<int64_t>() >= 0, at, "shape ", json_summary(shape), ": expected dims >= 0, got ",
                dim.get<int64_t>(), " at dim ", d);
      e.info.shape.push_back(dim.get<int64_t>());
    }

    const auto& offsets = value["data_offsets"];
    MIH_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                  offsets[1].is_number_unsigned(),
              at, "data_offsets expected [begin, end] of non-negative integers, got ", json_summary(offsets));
    e.info.begin = offsets[0].get<uint64_t>();
    e.info.end = offsets[1].get<uint64_t>();
    MIH_CHECK(e.info.begin <= e.info.end, at, "data_offsets expected begin <= end, got [", e.info.begin, ", ",
              e.info.end, "]");
    uint64_t expected = 0;
    MIH_CHECK(checked_nbytes(e.info.shape, element_size, &expected), at, "shape ", shape_str(e.info.shape),
              " overflows 64-bit byte counts");
    MIH_CHECK(e.info.nbytes() == expected, at, "data_offsets [", e.info.begin, ", ", e.info.end, ") span ",
              e.info.nbytes(), " bytes, expected prod(shape ", shape_str(e.info.shape), ") * ", element_size, " (",
              e.info.dtype, ") = ", expected);
    entries_.push_back(std::move(e));
  }

  const std::string& where_;
  std::map<std::string, std::string>* metadata_;
  In in_ = In::kNothing;
  std::string key_;        // the header key whose value is being read: a tensor's name or "__metadata__"
  std::string field_;      // the key being read in an entry or in "__metadata__"
  nlohmann::json fields_;  // the entry's fields as read
  nlohmann::json list_;    // the shape or data_offsets being read
  std::unordered_set<std::string> keys_;
  size_t tensors_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace

std::string valid_dtypes() {
  std::string out = join(kDtypes, ", ", [](const auto& d) { return std::string(d.name); });
  return out;
}

size_t dtype_size(std::string_view dtype) {
  size_t size = find_dtype_size(dtype);
  MIH_CHECK(size != 0, "safetensors dtype: expected one of ", valid_dtypes(), ", got '", dtype, "'");
  return size;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

void write_file(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                const std::map<std::string, std::string>& metadata) {
  const std::string where = "cannot write safetensors file '" + path.string() + "': ";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    MIH_CHECK(!t.name.empty(), where, "tensor #", i, ": expected a non-empty name, got ''");
    MIH_CHECK(t.name != "__metadata__", where, "tensor #", i,
              ": the name '__metadata__' is reserved for the header's metadata; rename the tensor");
    MIH_CHECK(seen.insert(t.name).second, where, "duplicate tensor name '", t.name, "' (tensor #", i,
              "); each name must appear once");
    size_t element_size = find_dtype_size(t.dtype);
    MIH_CHECK(element_size != 0, where, "tensor '", t.name, "': dtype expected one of ", valid_dtypes(), ", got '",
              t.dtype, "'");
    for (size_t d = 0; d < t.shape.size(); ++d) {
      MIH_CHECK(t.shape[d] >= 0, where, "tensor '", t.name, "': shape ", shape_str(t.shape),
                ": expected dims >= 0, got ", t.shape[d], " at dim ", d);
    }
    uint64_t expected = 0;
    MIH_CHECK(checked_nbytes(t.shape, element_size, &expected), where, "tensor '", t.name, "': shape ",
              shape_str(t.shape), " overflows 64-bit byte counts");
    MIH_CHECK(t.nbytes == expected, where, "tensor '", t.name, "': nbytes expected prod(shape ", shape_str(t.shape),
              ") * ", element_size, " (", t.dtype, ") = ", expected, ", got ", t.nbytes);
    MIH_CHECK(t.data != nullptr || t.nbytes == 0, where, "tensor '", t.name, "': data is null but nbytes is ",
              t.nbytes);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, where, "tensor names and metadata must be valid UTF-8: ", e.what());
  }
  // Pad with spaces so the data section starts 8-aligned (the format allows trailing spaces).
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_len = text.size();

  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, where, "cannot create directory '", path.parent_path().string(),
                 "': ", ec.message());
  // A new file under a name nobody can guess, never through a link: the directory may be one
  // another user can write (issue 53). Random: several threads may write next to each other.
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." + unguessable_suffix();
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  MIH_CHECK_CODE(fd.get() >= 0, Code::kFailedPrecondition, where, "cannot create ", tmp, ": ", std::strerror(errno));
  auto fail = [&](int err, const char* step) {
    fd.reset();
    ::unlink(tmp.c_str());
    MIH_THROW(Code::kFailedPrecondition, where, step, ": ", std::strerror(err),
              err == EFBIG ? ": the file size limit (ulimit -f, RLIMIT_FSIZE) is reached: raise it (ulimit -f unlimited)"
                           : "");
  };
  if (int err = write_all(fd.get(), &header_len, sizeof(header_len))) fail(err, "write");
  if (int err = write_all(fd.get(), text.data(), text.size())) fail(err, "write");
  for (const TensorView& t : tensors) {
    if (int err = write_all(fd.get(), t.data, t.nbytes)) fail(err, "write");
  }
  if (::fsync(fd.get()) != 0) fail(errno, "fsync");
  if (fd.reset() != 0) fail(errno, "close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(errno, "rename");
  // Persist the rename itself; best effort (some filesystems refuse fsync on a directory).
  Fd dir(::open(path.has_parent_path() ? path.parent_path().c_str() : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
}

Reader::Reader(std::filesystem::path path) : path_(std::move(path)) {
  std::string why;
  bool special = false;
  fd_ = open_regular_file(path_, &why, &special);  // a FIFO would block a plain open forever
  MIH_CHECK(fd_ >= 0 || !special, "invalid safetensors file '", path_.string(), "': ", why,
            "; give the file itself");
  MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot open safetensors file '", path_.string(), "': ", why);
  const std::string where = "invalid safetensors file '" + path_.string() + "': ";
  try {
    struct stat st {};
    MIH_CHECK_CODE(::fstat(fd_, &st) == 0, Code::kFailedPrecondition, "cannot stat safetensors file '",
                   path_.string(), "': ", std::strerror(errno));
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    MIH_CHECK(file_size >= 8, where, "expected at least 8 bytes (the header length), got ", file_size, " bytes");
    uint64_t header_len = 0;
    pread_exact("", 0, sizeof(header_len), &header_len);
    // The length itself is never printed: these 8 bytes may be the start of any file.
    MIH_CHECK(header_len <= kMaxHeaderBytes, where, "header length (the first 8 bytes) expected at most ",
              kMaxHeaderBytes, " bytes, got more: not a safetensors file, or its length field is corrupt");
    MIH_CHECK(header_len <= file_size - 8, where, "header length (the first 8 bytes) expected at most the file size ",
              file_size, " - 8 = ", file_size - 8, " bytes, got more: the file is truncated, not a safetensors file, "
              "or its length field is corrupt");
    std::string text(header_len, '\0');
    pread_exact("", 8, text.size(), text.data());
    data_start_ = 8 + header_len;
    const uint64_t data_size = file_size - data_start_;

    HeaderParser parser(where, &metadata_);
    nlohmann::json::sax_parse(text, &parser);
    MIH_INTERNAL_ASSERT(parser.done(), "the header parser stopped before the end of the header");
    using Entry = HeaderParser::Entry;
    std::vector<Entry>& entries = parser.entries();

    // Header keys may come in any order; coverage is checked in data order.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.info.begin, a.info.end, a.order) < std::tie(b.info.begin, b.info.end, b.order);
    });
    uint64_t covered = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries) {
      MIH_CHECK(e.info.begin >= covered, where, "tensor '", e.name, "' data_offsets [", e.info.begin, ", ",
                e.info.end, ") overlap tensor '", prev ? prev->name : "", "' [", prev ? prev->info.begin : 0, ", ",
                covered, ")");
      MIH_CHECK(e.info.begin == covered, where, "data bytes [", covered, ", ", e.info.begin,
                ") belong to no tensor (a gap before tensor '", e.name, "'); entries must cover the data section");
      covered = e.info.end;
      prev = &e;
    }
    if (covered > data_size) {
      const Entry& first_missing =
          *std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.info.end > data_size; });
      MIH_THROW(Code::kInvalidSpec, where, "file is truncated: tensor '", first_missing.name, "' needs data bytes [",
                first_missing.info.begin, ", ", first_missing.info.end, ") but the data section has ", data_size,
                " bytes; the file lacks ", covered - data_size, " bytes (expected size ", data_start_ + covered,
                ", got ", file_size, ")");
    }
    MIH_CHECK(covered == data_size, where, "data section has ", data_size, " bytes but the tensors cover ", covered,
              "; the last ", data_size - covered, " bytes belong to no tensor");
    for (Entry& e : entries) {
      names_.push_back(e.name);
      infos_.emplace(std::move(e.name), std::move(e.info));
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

Reader::Reader(Reader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      names_(std::move(other.names_)),
      infos_(std::move(other.infos_)),
      metadata_(std::move(other.metadata_)) {}

Reader& Reader::operator=(Reader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    names_ = std::move(other.names_);
    infos_ = std::move(other.infos_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const TensorInfo& Reader::info(const std::string& name) const {
  auto it = infos_.find(name);
  MIH_CHECK(it != infos_.end(), "safetensors file '", path_.string(), "' has no tensor '", name, "' (it has ",
            names_.size(), " tensors)");
  return it->second;
}

void Reader::pread_exact(const std::string& name, uint64_t file_offset, size_t nbytes, void* dst) const {
  char* p = static_cast<char*>(dst);
  while (nbytes > 0) {
    ssize_t n = ::pread(fd_, p, std::min<size_t>(nbytes, size_t{1} << 30), static_cast<off_t>(file_offset));
    if (n < 0 && errno == EINTR) continue;
    const std::string what = name.empty() ? std::string("the header") : "tensor '" + name + "'";
    MIH_CHECK_CODE(n >= 0, Code::kFailedPrecondition, "cannot read ", what, " of safetensors file '", path_.string(),
                   "' at byte ", file_offset, ": ", std::strerror(errno));
    MIH_CHECK_CODE(n > 0, Code::kFailedPrecondition, "short read of ", what, " of safetensors file '",
                   path_.string(), "': end of file at byte ", file_offset, " with ", nbytes,
                   " bytes still to read (did the file shrink?)");
    p += n;
    nbytes -= static_cast<size_t>(n);
    file_offset += static_cast<uint64_t>(n);
  }
}

void Reader::read(const std::string& name, void* dst) const {
  const TensorInfo& t = info(name);
  pread_exact(name, data_start_ + t.begin, t.nbytes(), dst);
}

void Reader::read_box(const std::string& name, const std::vector<int64_t>& offset,
                      const std::vector<int64_t>& lengths, void* dst) const {
  const TensorInfo& t = info(name);
  const size_t rank = t.shape.size();
  const std::string at = "safetensors file '" + path_.string() + "' tensor '" + name + "' of shape " +
                         shape_str(t.shape) + ": ";
  MIH_CHECK(offset.size() == rank && lengths.size() == rank, at, "box rank expected ", rank, ", got offset ",
            shape_str(offset), " and lengths ", shape_str(lengths));
  for (size_t d = 0; d < rank; ++d) {
    MIH_CHECK(offset[d] >= 0 && lengths[d] >= 0 && offset[d] <= t.shape[d] && lengths[d] <= t.shape[d] - offset[d],
              at, "box dim ", d, " [", offset[d], ", ", offset[d], " + ", lengths[d], ") is outside [0, ", t.shape[d],
              ")");
    if (lengths[d] == 0) return;
  }
  const uint64_t element_size = find_dtype_size(t.dtype);
  const uint64_t base = data_start_ + t.begin;
  if (rank == 0) {
    pread_exact(name, base, element_size, dst);
    return;
  }
  std::vector<uint64_t> stride(rank, 1);  // in elements
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * static_cast<uint64_t>(t.shape[d]);
  // Dims inside k are covered fully, so dim k's span of the box is one contiguous run.
  size_t k = rank - 1;
  while (k > 0 && offset[k] == 0 && lengths[k] == t.shape[k]) --k;
  const uint64_t run_bytes = static_cast<uint64_t>(lengths[k]) * stride[k] * element_size;
  std::vector<int64_t> index(k, 0);  // position in the box along the outer dims [0, k)
  char* out = static_cast<char*>(dst);
  while (true) {
    uint64_t element = static_cast<uint64_t>(offset[k]) * stride[k];
    for (size_t d = 0; d < k; ++d) element += static_cast<uint64_t>(offset[d] + index[d]) * stride[d];
    pread_exact(name, base + element * element_size, run_bytes, out);
    out += run_bytes;
    size_t d = k;
    while (d > 0 && ++index[d - 1] == lengths[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace mih::safetensors

namespace mih::safetensors {

std::vector<std::string> checkpoint_keys(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  MIH_CHECK_CODE(fs::is_directory(dir), Code::kFailedPrecondition, "source checkpoint directory ", dir.string(),
                 " does not exist: give a directory with model.safetensors or model.safetensors.index.json "
                 "(CheckpointSpec::source)");
  std::vector<std::string> keys;
  const fs::path index = dir / layout::kHfIndex;
  if (fs::exists(index)) {
    const nlohmann::json j = read_json_file(index);
    MIH_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
              " has no \"weight_map\" object (Hugging Face's sharded-checkpoint index maps each key to its shard)");
    for (const auto& [key, shard] : j["weight_map"].items()) keys.push_back(key);
  } else if (fs::exists(dir / layout::kHfWeights)) {
    // Hugging Face's single-file layout: the other safetensors files of the directory (e.g.
    // mih export's batch and reference) are not weights.
    const Reader r(dir / layout::kHfWeights);
    keys = r.names();
  } else {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    }
    MIH_CHECK_CODE(!files.empty(), Code::kFailedPrecondition, "source checkpoint directory ", dir.string(),
                   " holds neither model.safetensors.index.json nor a *.safetensors file");
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const Reader r(f);
      keys.insert(keys.end(), r.names().begin(), r.names().end());
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace mih::safetensors
