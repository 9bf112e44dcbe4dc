// Hugging Face checkpoint directories (see hf_checkpoint.h).
#include "harness/checkpoint/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/owned_files.h"

namespace mih::hf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndex = layout::kHfIndex;

// A Git LFS pointer file (what a clone without `git lfs pull` holds in place of the weights).
// `file` was resolved as a regular file; open_regular_file keeps a FIFO put in its place
// meanwhile from blocking the read.
bool is_lfs_pointer(const fs::path& file) {
  const int fd = open_regular_file(file);
  if (fd < 0) return false;  // the Reader then names the problem
  char head[40] = {};
  ssize_t n;
  do {
    n = ::read(fd, head, sizeof head);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n > 0 && std::string(head, static_cast<size_t>(n)).rfind("version https://git-lfs", 0) == 0;
}

// Whether the normalized absolute `path` is `root` or lies below it (component by component:
// /a/bc is not below /a/b).
bool is_within(const fs::path& path, const fs::path& root) {
  return std::mismatch(root.begin(), root.end(), path.begin(), path.end()).first == root.end();
}

const char* file_kind(fs::file_type type) {
  switch (type) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

// Where the files of checkpoint directory `dir` may really be: its real path and, when it is a
// snapshot of the Hugging Face cache (.../models--org--name/snapshots/<revision>, whose files
// are symlinks to ../../blobs/<sha256>), that repository's blobs directory.
std::vector<fs::path> checkpoint_roots(const fs::path& dir) {
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "checkpoint directory ", dir.string(), " cannot be resolved: ",
                 ec.message());
  std::vector<fs::path> roots = {real};
  if (real.parent_path().filename() == layout::kHfSnapshotsDir) roots.push_back(real.parent_path().parent_path() / layout::kHfBlobsDir);
  return roots;
}

// Whether the directory has an entry `name` (a dangling symlink or a loop counts: resolve
// then says what is wrong with it).
bool has_entry(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  return fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found && !ec;
}

// The file `name` of checkpoint directory `dir` as it is read: every symlink resolved, the
// result inside the directory (checkpoint_roots) and a regular file; `what` names it in
// messages. The lexical check comes first, so '..' never reaches the filesystem.
// Throws: mih::Error{kInvalidSpec} naming the file and what is wrong with it.
fs::path resolve_inside(const fs::path& dir, const std::vector<fs::path>& roots, const std::string& name,
                        const std::string& what) {
  const fs::path rel = name;
  bool lexical = !name.empty() && rel.is_relative();
  for (const auto& part : rel) lexical = lexical && part != "..";
  MIH_CHECK(lexical, "checkpoint ", dir.string(), ": ", what, " is '", name,
            "'; a file of a checkpoint lies inside its directory (no absolute path, no '..')");
  std::error_code ec;
  const fs::path real = fs::canonical(dir / rel, ec);
  MIH_CHECK(!ec, "checkpoint ", dir.string(), ": ", what, " cannot be resolved: ", ec.message(),
            " (a dangling symlink or a symlink loop?)");
  const bool inside = std::any_of(roots.begin(), roots.end(), [&](const fs::path& r) { return is_within(real, r); });
  MIH_CHECK(inside, "checkpoint ", dir.string(), ": ", what, " resolves to ", real.string(),
            ", outside the checkpoint directory ", roots.front().string(),
            "; mih reads only the files inside it (copy the file into the directory)");
  const fs::file_type type = fs::status(real, ec).type();
  MIH_CHECK(!ec && type == fs::file_type::regular, "checkpoint ", dir.string(), ": ", what, " is ",
            ec ? ec.message() : file_kind(type), ", not a regular file; give the file itself");
  return real;
}

AssetFile asset(const std::string& rel, const fs::path& real) {
  AssetFile a;
  a.path = rel;
  std::error_code ec;
  a.bytes = fs::file_size(real, ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot read the size of ", real.string(), ": ", ec.message());
  a.sha256 = file_sha256(real);
  a.resolved = real;
  return a;
}

}  // namespace

std::string file_sha256(const fs::path& file) { return sha256_of_file(file); }

const TensorEntry* Checkpoint::find(const std::string& key) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), key,
                             [](const TensorEntry& e, const std::string& k) { return e.key < k; });
  return it != tensors.end() && it->key == key ? &*it : nullptr;
}

nlohmann::json Checkpoint::to_json() const {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& e : tensors) t[e.key] = {{"dtype", e.dtype}, {"shape", e.shape}, {"file", e.file}};
  nlohmann::json f = nlohmann::json::array();
  for (const auto& a : files) f.push_back({{"path", a.path}, {"bytes", a.bytes}, {"sha256", a.sha256}});
  return {{"dir", dir.string()}, {"sharded", sharded}, {"config", config}, {"tensors", t}, {"files", f}};
}

namespace {

// A local directory, named in valid UTF-8 (the evidence names it in JSON): mih never downloads.
void check_checkpoint_dir(const fs::path& dir) {
  const std::string text = dir.string();
  for (const char* scheme : {"http://", "https://", "hf://"}) {
    MIH_CHECK(text.rfind(scheme, 0) != 0, "checkpoint '", text, "' is a URL: mih never downloads; fetch it yourself "
              "(e.g. `huggingface-cli download <repo> --local-dir DIR`) and give the local directory");
  }
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::type_error&) {
    MIH_THROW(Code::kInvalidSpec, "checkpoint directory '", text, "': its path is not valid UTF-8; rename it or "
              "reach it through a symlink whose path is");
  }
  std::error_code ec;
  MIH_CHECK_CODE(fs::is_directory(dir, ec), Code::kFailedPrecondition, "checkpoint directory ", text,
                 " does not exist or is not a directory");
}

// config.json, the architecture a Hugging Face checkpoint carries, into `c`.
void read_config(const fs::path& dir, const std::vector<fs::path>& roots, Checkpoint& c) {
  MIH_CHECK(has_entry(dir, layout::kHfConfig), "checkpoint directory ", dir.string(), " has no config.json: a Hugging "
            "Face checkpoint carries its architecture there");
  const fs::path config = resolve_inside(dir, roots, layout::kHfConfig, layout::kHfConfig);
  std::string config_text;
  MIH_CHECK_CODE(read_file(config, &config_text), Code::kFailedPrecondition, "cannot read ",
                 (dir / layout::kHfConfig).string());
  c.config = parse_json_strict(config_text, (dir / layout::kHfConfig).string());
  MIH_CHECK(c.config.is_object(), (dir / layout::kHfConfig).string(), ": expected a JSON object, got ", c.config.type_name());
  c.files.push_back(asset(layout::kHfConfig, config));
}

// A sharded checkpoint's index: key -> shard into `weight_map`, each shard inside the directory
// and present, every weights file in the directory named; returns the shards.
std::vector<std::string> indexed_shards(const fs::path& dir, const std::vector<fs::path>& roots, Checkpoint& c,
                                        std::map<std::string, std::string>& weight_map) {
  const std::string text = dir.string();
  const fs::path index_file = resolve_inside(dir, roots, kIndex, kIndex);
  std::string index_text;
  MIH_CHECK_CODE(read_file(index_file, &index_text), Code::kFailedPrecondition, "cannot read ",
                 (dir / kIndex).string());
  const nlohmann::json index = parse_json_strict(index_text, (dir / kIndex).string());
  MIH_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
            (dir / kIndex).string(), " has no \"weight_map\" object (Hugging Face's sharded-checkpoint index maps "
            "each key to its shard)");
  for (const auto& [key, shard] : index["weight_map"].items()) {
    MIH_CHECK(shard.is_string(), (dir / kIndex).string(), ": the shard of '", key, "' must be a file name, got ",
              json_summary(shard));
    const fs::path name = shard.get<std::string>();
    bool inside = !name.empty() && name.is_relative();
    for (const auto& part : name) inside = inside && part != "..";
    MIH_CHECK(inside, (dir / kIndex).string(), ": the shard of '", key, "' is ", json_summary(shard),
              "; a shard is a file inside the checkpoint directory (no absolute path, no '..')");
    weight_map[key] = name.string();
  }
  std::set<std::string> named;
  for (const auto& [key, shard] : weight_map) {
    if (named.insert(shard).second) {
      MIH_CHECK(has_entry(dir, shard), "checkpoint ", text, ": the shard ", shard, " named by ", kIndex,
                " (for '", key, "' and others) is missing");
    }
  }
  // A weights file the index does not name would be ignored by every loader: almost always a
  // shard left out of the index or left behind by an earlier save.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool weights = name == layout::kHfWeights ||
                         (name.rfind(layout::kHfShardPrefix, 0) == 0 && e.path().extension() == ".safetensors");
    MIH_CHECK(!weights || named.count(name), "checkpoint ", text, ": ", name, " is not named by ", kIndex,
              "; loaders ignore it, so its tensors are not part of the checkpoint: add it to the index's "
              "weight_map or remove it");
  }
  c.files.push_back(asset(kIndex, index_file));
  return {named.begin(), named.end()};
}

// As Hugging Face's loaders: one file named model.safetensors (other safetensors files in the
// directory, e.g. mih export's batch and reference, are not weights).
void check_single_file(const fs::path& dir) {
  std::vector<std::string> others;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != layout::kHfWeights && (e.path().extension() == ".safetensors" || e.path().extension() == ".bin")) {
      others.push_back(name);
    }
  }
  std::sort(others.begin(), others.end());
  std::string listed;
  for (const auto& o : others) listed += " " + o;
  MIH_CHECK_CODE(has_entry(dir, layout::kHfWeights), Code::kFailedPrecondition, "checkpoint directory ", dir.string(),
                 " has neither model.safetensors nor ", kIndex,
                 others.empty() ? std::string()
                                : " (it holds" + listed + "; mih reads the Hugging Face layout's safetensors only, "
                                  "never a pickle: convert .bin files with the safetensors library)");
}

// The tensors of each shard (each key in one shard, the one the index places it in).
void read_shard_entries(const fs::path& dir, const std::vector<fs::path>& roots, const std::vector<std::string>& shards,
                        const std::map<std::string, std::string>& weight_map, Checkpoint& c) {
  const std::string text = dir.string();
  std::map<std::string, TensorEntry> entries;
  for (const auto& shard : shards) {
    const fs::path file = resolve_inside(dir, roots, shard, c.sharded ? "the shard " + shard : shard);
    MIH_CHECK(!is_lfs_pointer(file), "checkpoint ", text, ": ", shard, " is a Git LFS pointer, not the "
              "weights; run `git lfs pull` in ", text, " (mih never downloads)");
    const safetensors::Reader reader(file);
    for (const auto& key : reader.names()) {
      const safetensors::TensorInfo& info = reader.info(key);
      if (c.sharded) {
        auto it = weight_map.find(key);
        MIH_CHECK(it != weight_map.end() && it->second == shard, "checkpoint ", text, ": ", shard, " holds '", key,
                  "', which ", kIndex, it == weight_map.end() ? " does not list" : " places in " + it->second);
      }
      auto [slot, fresh] = entries.emplace(key, TensorEntry{key, info.dtype, info.shape, shard});
      MIH_CHECK(fresh, "checkpoint ", text, ": '", key, "' is in both ", slot->second.file, " and ", shard);
    }
    c.files.push_back(asset(shard, file));
  }
  for (const auto& [key, shard] : weight_map) {
    MIH_CHECK(entries.count(key), "checkpoint ", text, ": ", kIndex, " places '", key, "' in ", shard,
              ", which does not hold it");
  }
  for (auto& [key, e] : entries) c.tensors.push_back(std::move(e));
}

}  // namespace

Checkpoint read_checkpoint(const fs::path& dir) {
  check_checkpoint_dir(dir);
  // Every file read is resolved inside the directory first: a symlink out of it (to another
  // model's weights, to /etc/shadow) is refused before a byte of it is read.
  const std::vector<fs::path> roots = checkpoint_roots(dir);
  Checkpoint c;
  c.dir = dir;
  read_config(dir, roots, c);
  // key -> shard, from the index or from the files themselves.
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;
  if (has_entry(dir, kIndex)) {
    c.sharded = true;
    shards = indexed_shards(dir, roots, c, weight_map);
  } else {
    check_single_file(dir);
    shards.push_back(layout::kHfWeights);
  }
  read_shard_entries(dir, roots, shards, weight_map, c);
  std::sort(c.files.begin(), c.files.end(), [](const AssetFile& a, const AssetFile& b) { return a.path < b.path; });
  return c;
}

std::vector<std::string> write_weights(const fs::path& dir, const std::vector<safetensors::TensorView>& tensors,
                                       uint64_t max_shard_bytes) {
  MIH_CHECK(max_shard_bytes > 0, "write_weights: the shard size must be > 0 bytes");
  std::vector<std::vector<safetensors::TensorView>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    if (in_shard > 0 && in_shard + t.nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.nbytes;
    total += t.nbytes;
  }
  // Weights files of an earlier write (another shard count) would contradict this one.
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name == kIndex || name == layout::kHfWeights ||
          (name.rfind(layout::kHfShardPrefix, 0) == 0 && e.path().extension() == ".safetensors")) {
        fs::remove(e.path(), ec);
      }
    }
  }
  if (shards.size() == 1) {
    safetensors::write_file(dir / layout::kHfWeights, tensors, {{"format", "pt"}});
    return {layout::kHfWeights};
  }
  std::vector<std::string> written;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = layout::hf_shard(i + 1, shards.size());
    safetensors::write_file(dir / name, shards[i], {{"format", "pt"}});
    for (const auto& t : shards[i]) weight_map[t.name] = name;
    written.push_back(name);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / kIndex, index.dump(2) + "\n");
  written.push_back(kIndex);
  return written;
}

}  // namespace mih::hf
