// The evidence contract's validation: the manifest's path patterns, valijson (a well-kept
// draft-07 validator, Debian's libvalijson-dev) over nlohmann values, and the CSV header.
#include "harness/contract/contract.h"

#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>

#include <nlohmann/json.hpp>

#define VALIJSON_USE_EXCEPTIONS 1
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include "harness/contract/case_outcome.h"
#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"

namespace mih::contract {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxFiles = 200000;
constexpr uintmax_t kMaxJsonBytes = uintmax_t{1} << 30;

struct Entry {
  std::string path;    // the manifest's pattern
  std::string format;  // json, jsonl, csv, text, binary, opaque
  std::string schema;  // file name, for json and jsonl
  std::vector<std::string> columns;
  std::regex re;
};

struct Contract {
  std::vector<Entry> entries;
  std::vector<std::string> nested;  // "before_save"
  std::map<std::string, std::unique_ptr<valijson::Schema>> schemas;
};

std::string regex_escape(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : s) {
    if (special.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

const json& compiled_json(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, json> parsed;
  std::lock_guard<std::mutex> lock(mu);
  auto it = parsed.find(name);
  if (it != parsed.end()) return it->second;
  const auto& files = compiled_files();
  auto f = files.find(name);
  MIH_CHECK_CODE(f != files.end(), Code::kInternal, "the evidence contract names schema ", name,
                 ", which is not compiled in (schemas/evidence/v1)");
  return parsed.emplace(name, json::parse(f->second)).first->second;
}

const Contract& compiled_contract() {
  static const Contract* contract = [] {
    auto* c = new Contract;
    const json& manifest = compiled_json("contract.json");
    MIH_CHECK_CODE(manifest.value("contract", "") == kName && manifest.value("version", 0) == kVersion, Code::kInternal,
                   "the compiled contract.json is not ", kName, " version ", kVersion);
    std::map<std::string, std::string> placeholders;
    for (const auto& [k, v] : manifest.at("placeholders").items()) placeholders[k] = v.get<std::string>();
    for (const json& e : manifest.at("files")) {
      Entry entry;
      entry.path = e.at("path").get<std::string>();
      entry.format = e.at("format").get<std::string>();
      entry.schema = e.value("schema", "");
      if (e.contains("columns")) entry.columns = e.at("columns").get<std::vector<std::string>>();
      // The pattern: literal text, each <placeholder> its expression, "**" any path below.
      std::string re;
      for (size_t i = 0; i < entry.path.size();) {
        if (entry.path[i] == '<') {
          const size_t end = entry.path.find('>', i);
          const std::string name = entry.path.substr(i, end - i + 1);
          MIH_CHECK_CODE(placeholders.count(name), Code::kInternal, "contract.json: unknown placeholder ", name);
          re += "(?:" + placeholders[name] + ")";
          i = end + 1;
        } else if (entry.path.compare(i, 2, "**") == 0) {
          re += ".+";
          i += 2;
        } else {
          re += regex_escape(std::string(1, entry.path[i]));
          ++i;
        }
      }
      entry.re = std::regex(re, std::regex::ECMAScript | std::regex::optimize);
      if (!entry.schema.empty() && !c->schemas.count(entry.schema)) {
        auto schema = std::make_unique<valijson::Schema>();
        valijson::SchemaParser parser;  // draft-07
        const json& doc = compiled_json(entry.schema);
        valijson::adapters::NlohmannJsonAdapter adapter(doc);
        parser.populateSchema(adapter, *schema);
        c->schemas.emplace(entry.schema, std::move(schema));
      }
      c->entries.push_back(std::move(entry));
    }
    for (const json& n : manifest.at("nested")) c->nested.push_back(n.get<std::string>());
    return c;
  }();
  return *contract;
}

const Entry* entry_of(const Contract& c, const std::string& relative) {
  for (const Entry& e : c.entries) {
    if (std::regex_match(relative, e.re)) return &e;
  }
  return nullptr;
}

// valijson's context ["<root>", "[errors]", "[0]", "[code]"] as "errors[0].code".
std::string field_of(const std::vector<std::string>& context) {
  std::string out;
  for (size_t i = 1; i < context.size(); ++i) {
    std::string part = context[i];
    if (part.size() >= 2 && part.front() == '[' && part.back() == ']') part = part.substr(1, part.size() - 2);
    const bool index = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (index) {
      out += "[" + part + "]";
    } else {
      out += (out.empty() ? "" : ".") + part;
    }
  }
  return out;
}

// Strings longer than this are refused before any schema rule sees them: valijson matches
// patterns with std::regex, whose backtracking recurses once per character (a 50k-character
// string under a `*` pattern overflowed an 8 MiB stack).
constexpr size_t kMaxString = 256 * 1024;
// Values holding a string longer than this are validated on a thread with a stack of
// kValidationStack bytes (reserved, committed only as it is used).
constexpr size_t kLongString = 2048;
constexpr size_t kValidationStack = size_t{512} << 20;

// The longest string in `value` (keys included) and where it is ("a.b[3]"), iteratively.
size_t longest_string(const json& value, std::string* where) {
  size_t longest = 0;
  std::vector<std::pair<const json*, std::string>> stack = {{&value, ""}};
  while (!stack.empty()) {
    auto [v, path] = stack.back();
    stack.pop_back();
    if (v->is_string()) {
      const size_t n = v->get_ref<const std::string&>().size();
      if (n > longest) longest = n, *where = path;
    } else if (v->is_object()) {
      for (const auto& [k, child] : v->items()) {
        if (k.size() > longest) longest = k.size(), *where = path;
        stack.emplace_back(&child, path.empty() ? k : path + "." + k);
      }
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) stack.emplace_back(&(*v)[i], path + "[" + std::to_string(i) + "]");
    }
  }
  return longest;
}

// Runs `fn` on a thread with a `stack`-byte stack and waits for it; an exception it throws is
// rethrown here.
void with_stack(size_t stack, const std::function<void()>& fn) {
  struct Job {
    const std::function<void()>* fn;
    std::exception_ptr error;
  } job{&fn, nullptr};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack);
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr,
      [](void* p) -> void* {
        auto* j = static_cast<Job*>(p);
        try {
          (*j->fn)();
        } catch (...) {
          j->error = std::current_exception();
        }
        return nullptr;
      },
      &job);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    fn();  // no thread to be had: the caller's stack, as before
    return;
  }
  pthread_join(thread, nullptr);
  if (job.error) std::rethrow_exception(job.error);
}

std::vector<Problem> validate_with(const Contract& c, const Entry& e, const std::string& relative, const json& value,
                                   int line) {
  std::vector<Problem> out;
  std::string where;
  const size_t longest = longest_string(value, &where);
  if (longest > kMaxString) {
    out.push_back({relative, (line > 0 ? "line " + std::to_string(line) + (where.empty() ? "" : ": ") : "") + where,
                   "a string of " + std::to_string(longest) + " characters; evidence holds none longer than " +
                       std::to_string(kMaxString)});
    return out;
  }
  valijson::Validator validator;  // strong types: 1 is not "1", 1.5 is no integer
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter target(value);
  const valijson::Schema& schema = *c.schemas.at(e.schema);
  bool valid = false;
  try {
    if (longest > kLongString) {
      with_stack(kValidationStack, [&] { valid = validator.validate(schema, target, &results); });
    } else {
      valid = validator.validate(schema, target, &results);
    }
  } catch (const std::exception& ex) {
    out.push_back({relative, line > 0 ? "line " + std::to_string(line) : "", std::string("cannot be validated: ") + ex.what()});
    return out;
  }
  if (valid) return out;
  // The most specific error: the deepest context (anyOf and its children report at once).
  valijson::ValidationResults::Error best, error;
  size_t depth = 0;
  while (results.popError(error)) {
    if (error.context.size() > depth || best.description.empty()) {
      if (error.context.size() >= depth) {
        depth = error.context.size();
        best = error;
      }
    }
  }
  std::string field = field_of(best.context);
  if (line > 0) field = "line " + std::to_string(line) + (field.empty() ? "" : ": " + field);
  std::string message = best.description;
  if (!message.empty() && message.back() == '.') message.pop_back();
  // What the value there is, for the reader of the message (valijson names only the rule).
  const json* at = &value;
  for (size_t i = 1; at && i < best.context.size(); ++i) {
    std::string part = best.context[i];
    if (part.size() >= 2 && part.front() == '[' && part.back() == ']') part = part.substr(1, part.size() - 2);
    if (at->is_object()) {
      at = at->contains(part) ? &(*at)[part] : nullptr;
    } else if (at->is_array() && !part.empty() && part.size() < 10 &&
               std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t index = std::stoul(part);
      at = index < at->size() ? &(*at)[index] : nullptr;
    } else {
      at = nullptr;
    }
  }
  if (at && message.find("Missing required property") == std::string::npos) {
    message += at->is_null() ? std::string(" (the value is null)")
                             : " (the value is " + std::string(at->type_name()) + " " + json_summary(*at, 80) + ")";
  }
  out.push_back({relative, field, message});
  return out;
}

// parse_json_strict's message without the `where` it starts with (the problem names the file).
std::string without_prefix(std::string message, const std::string& where) {
  if (message.rfind(where, 0) == 0) {
    message.erase(0, where.size());
    if (message.rfind(": ", 0) == 0) message.erase(0, 2);
    if (message.rfind(" ", 0) == 0) message.erase(0, 1);
  }
  return message;
}

// Splits one CSV line (RFC 4180 quotes) into fields.
std::vector<std::string> csv_fields(std::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        out.back() += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

// The problems of the file being checked, capped at max_problems for the whole validation.
struct FileProblems {
  Validation& v;
  const std::string& relative;
  size_t max_problems;

  bool full() const { return v.problems.size() >= max_problems; }
  void add(std::string field, std::string message) {
    if (!full()) v.problems.push_back({relative, std::move(field), std::move(message)});
  }
  void add_all(std::vector<Problem> found) {
    for (Problem& p : found) {
      if (!full()) v.problems.push_back(std::move(p));
    }
  }
};

// The file's text, or nullopt with its problem added: too large, unreadable, or not text.
std::optional<std::string> evidence_text(const fs::path& file, FileProblems& out) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  if (ec || size > kMaxJsonBytes) {
    out.add("", ec ? "cannot be sized (" + ec.message() + ")" : "is larger than 1 GiB: no evidence file mih writes is");
    return std::nullopt;
  }
  std::string text;
  if (!read_file(file, &text)) {
    out.add("", "cannot be read");
    return std::nullopt;
  }
  // A NUL byte would end the parse early and pass what follows it unread.
  if (text.find('\0') != std::string::npos) {
    out.add("", "holds a NUL byte at offset " + std::to_string(text.find('\0')) + ": it is not JSON, JSONL or CSV text");
    return std::nullopt;
  }
  return text;
}

// environment.json's stamp: false (with the problem added) when it names another version of
// this contract or a writer with a control character; otherwise records the writer.
bool check_stamp(const json& value, FileProblems& out) {
  if (!value.is_object() || !value.contains(kStampKey) || !value[kStampKey].is_object()) return true;
  const json& s = value[kStampKey];
  // Another version of this contract (an integer other than ours) is said as such; any
  // other shape of the stamp is the schema's to name.
  if (s.contains("contract") && s["contract"] == kName && s.contains("version") &&
      s["version"].is_number_integer() && s["version"] != kVersion) {
    out.add(std::string(kStampKey) + ".version",
            "the evidence follows " + std::string(kName) + " version " + json_summary(s["version"]) +
                "; this mih reads version " + std::to_string(kVersion) + ": check it with a mih of that contract");
    return false;
  }
  if (s.contains("writer") && s["writer"].is_string()) {
    const std::string writer = s["writer"].get<std::string>();
    // Printed in every verdict that names it: one line of text.
    if (std::any_of(writer.begin(), writer.end(), [](unsigned char ch) { return ch < 0x20 || ch == 0x7f; })) {
      out.add(std::string(kStampKey) + ".writer", "holds a control character: a writer is named on one line of text");
      return false;
    }
    out.v.writer = writer;
  }
  return true;
}

void check_json(const Contract& c, const Entry& e, const std::string& pattern_path, const std::string& text,
                FileProblems& out) {
  json value;
  try {
    value = parse_json_strict(text, out.relative);
  } catch (const Error& err) {
    out.add("", without_prefix(err.message(), out.relative));
    return;
  }
  ++out.v.values;
  if (pattern_path == layout::kEnvironment && !check_stamp(value, out)) return;
  out.add_all(validate_with(c, e, out.relative, value, 0));
}

// One CSV line against the contract's columns (line 1, kept in `header`) or the header's width;
// false when the header is not the contract's (the rest is not read).
bool check_csv_line(const Entry& e, std::string_view row, int line, std::vector<std::string>& header,
                    FileProblems& out) {
  if (!row.empty() && row.back() == '\r') row.remove_suffix(1);  // RFC 4180's CRLF
  const std::vector<std::string> fields = csv_fields(row);
  if (line == 1) {
    header = fields;
    if (fields != e.columns) {
      std::string want;
      for (const auto& col : e.columns) want += (want.empty() ? "" : ",") + col;
      out.add("line 1", "the header is not the contract's columns " + want);
      return false;
    }
  } else if (fields.size() != header.size()) {
    out.add("line " + std::to_string(line),
            std::to_string(fields.size()) + " fields, the header has " + std::to_string(header.size()));
  }
  return true;
}

void check_jsonl_line(const Contract& c, const Entry& e, std::string_view row, int line, FileProblems& out) {
  const std::string where = out.relative + " line " + std::to_string(line);
  json value;
  try {
    value = parse_json_strict(std::string(row), where);
  } catch (const Error& err) {
    out.add("line " + std::to_string(line), without_prefix(err.message(), where));
    return;
  }
  ++out.v.values;
  out.add_all(validate_with(c, e, out.relative, value, line));
}

// A JSONL or CSV file, line by line; every line ends with a newline.
void check_lines(const Contract& c, const Entry& e, const std::string& text, FileProblems& out) {
  size_t start = 0;
  int line = 1;
  std::vector<std::string> header;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos && !out.full(); start = end + 1, ++line) {
    const std::string_view row = std::string_view(text).substr(start, end - start);
    if (e.format == "csv") {
      if (!check_csv_line(e, row, line, header, out)) return;
    } else {
      check_jsonl_line(c, e, row, line, out);
    }
  }
  if (start != text.size()) out.add("line " + std::to_string(line), "the last line has no newline: the file was truncated or edited");
  if (e.format == "csv" && line == 1 && start == text.size()) out.add("", "is empty: the contract's header is missing");
}

void check_file(const Contract& c, const fs::path& dir, const std::string& relative, const std::string& pattern_path,
                Validation& v, size_t max_problems) {
  FileProblems out{v, relative, max_problems};
  const Entry* e = entry_of(c, pattern_path);
  if (!e) {
    out.add("", std::string("no entry of the evidence contract (") + kName + " version " + std::to_string(kVersion) +
                    ") names this file; a writer's own files go under " + kExtraDir + "/");
    return;
  }
  if (e->format != "json" && e->format != "jsonl" && e->format != "csv") return;
  const std::optional<std::string> text = evidence_text(dir / relative, out);
  if (!text) return;
  if (e->format == "json") {
    check_json(c, *e, pattern_path, *text, out);
  } else {
    check_lines(c, *e, *text, out);
  }
}

// `relative` as the contract's patterns name it: a nested case directory's (before_save/) own.
std::string contract_path(const Contract& c, const std::string& relative) {
  std::string out = relative;
  for (const std::string& nested : c.nested) {
    if (out.rfind(nested + "/", 0) == 0) out = out.substr(nested.size() + 1);
  }
  return out;
}

}  // namespace

json stamp(const std::string& writer) { return {{"contract", kName}, {"version", kVersion}, {"writer", writer}}; }

std::string Problem::text() const {
  // A file name is the directory's, not ours: a newline or an escape sequence in it must not
  // forge a line of the report or reach the terminal.
  std::string name;
  for (unsigned char ch : file) {
    if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      name += buf;
    } else {
      name += static_cast<char>(ch);
    }
  }
  return name + (field.empty() ? std::string() : ": field " + field) + ": " + message;
}

Validation validate_case_dir(const fs::path& dir, bool require_stamp, size_t max_problems) {
  std::error_code ec;
  MIH_CHECK_CODE(fs::is_directory(dir, ec), Code::kFailedPrecondition, dir.string(), " is not a case directory");
  const Contract& c = compiled_contract();
  Validation v;
  bool environment = false;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (v.problems.size() >= max_problems) break;
    const fs::directory_entry& entry = *it;
    // Lexical: fs::relative would resolve a symlink to its target.
    const std::string relative = entry.path().lexically_relative(dir).generic_string();
    if (++v.files > static_cast<int>(kMaxFiles)) {
      v.problems.push_back({"", "", "holds more than " + std::to_string(kMaxFiles) + " files: no case directory does"});
      break;
    }
    if (entry.is_symlink(ec)) {
      v.problems.push_back({relative, "", "is a symlink: evidence files are regular files inside the case directory"});
      continue;
    }
    if (entry.is_directory(ec)) {
      --v.files;
      if (relative == kExtraDir) it.disable_recursion_pending();
      // A directory where the contract names a file (a metrics.jsonl/ folder) is not that file.
      if (const Entry* e = entry_of(c, contract_path(c, relative)); e && e->format != "opaque") {
        v.problems.push_back({relative, "", "is a directory: the evidence contract names a " + e->format + " file here"});
        it.disable_recursion_pending();
      }
      continue;
    }
    if (!entry.is_regular_file(ec)) {
      v.problems.push_back({relative, "", "is not a regular file"});
      continue;
    }
    const std::string pattern_path = contract_path(c, relative);
    if (pattern_path.rfind(std::string(kExtraDir) + "/", 0) == 0) continue;
    if (pattern_path == layout::kEnvironment && relative == pattern_path) environment = true;
    check_file(c, dir, relative, pattern_path, v, max_problems);
  }
  if (ec && v.problems.size() < max_problems) v.problems.push_back({"", "", "cannot be listed (" + ec.message() + ")"});
  if (!environment && require_stamp && v.problems.size() < max_problems) {
    v.problems.push_back({layout::kEnvironment, "",
                          std::string("is missing: it names the writer and the contract (") + kStampKey + ")"});
  } else if (environment && v.writer.empty() && v.problems.size() < max_problems) {
    bool reported = false;
    for (const Problem& p : v.problems) reported = reported || p.file == layout::kEnvironment;
    if (!reported) v.problems.push_back({layout::kEnvironment, kStampKey, "is missing: the writer and contract are unknown"});
  }
  return v;
}

std::vector<fs::path> case_dirs(const fs::path& evidence) {
  auto holds_case = [](const fs::path& dir) {
    std::error_code ec;
    return fs::is_directory(dir, ec) &&
           (fs::exists(dir / layout::kEnvironment, ec) || fs::exists(dir / layout::kCaseRecord, ec));
  };
  // The directory named is taken as given; below it, a symlink is never followed.
  auto is_case = [&](const fs::path& dir) {
    std::error_code ec;
    return !fs::is_symlink(dir, ec) && holds_case(dir);
  };
  if (holds_case(evidence)) return {evidence};
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& child : fs::directory_iterator(evidence, ec)) {
    if (!child.is_directory(ec) || child.is_symlink(ec)) continue;
    if (is_case(child.path())) {
      out.push_back(child.path());
      continue;
    }
    for (const auto& c : fs::directory_iterator(child.path(), ec)) {
      if (is_case(c.path())) out.push_back(c.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool case_trained(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / layout::kCaseRecord, ec)) return true;
  try {
    return has_verdict(read_case_record(dir / layout::kCaseRecord).outcome);
  } catch (const Error&) {
    return true;
  }
}

Validation require_valid_case_dir(const fs::path& dir, const std::string& advice) {
  Validation v = validate_case_dir(dir, case_trained(dir));
  MIH_CHECK_CODE(v.ok(), Code::kFailedPrecondition, "evidence ", dir.string(), " does not follow the evidence contract (",
                 kName, " version ", kVersion, ", docs/evidence.md)",
                 v.writer.empty() ? std::string() : " although " + v.writer + " wrote it", ":", summary(v), "\n  ", advice);
  return v;
}

std::vector<Problem> validate_value(const std::string& relative, const json& value, int line) {
  const Contract& c = compiled_contract();
  const Entry* e = entry_of(c, contract_path(c, relative));
  MIH_CHECK(e && !e->schema.empty(), "no entry of the evidence contract with a schema names ", relative);
  return validate_with(c, *e, relative, value, line);
}

std::string summary(const Validation& v, size_t max_lines) {
  std::string out;
  for (size_t i = 0; i < v.problems.size() && i < max_lines; ++i) out += "\n  " + v.problems[i].text();
  if (v.problems.size() > max_lines) out += "\n  ... and " + std::to_string(v.problems.size() - max_lines) + " more";
  return out;
}

}  // namespace mih::contract
