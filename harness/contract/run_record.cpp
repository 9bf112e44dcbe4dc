// run.json read typed (see run_record.h).
#include "harness/contract/run_record.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih::contract {
namespace {

using nlohmann::json;

struct Reader {
  const std::string& file;

  void expect(bool ok, const std::string& field, const char* type, const json& got) const {
    MIH_CHECK_CODE(ok, Code::kFailedPrecondition, file, ": ", field, " must be ", type, ", got ", json_summary(got, 200),
                   "; it is not the run.json `mih test` writes: rerun the matrix with `mih test --evidence-root`, or "
                   "remove the file to check the root by its cases");
  }

  static bool strings(const json& j, std::initializer_list<const char*> fields) {
    if (!j.is_object()) return false;
    for (const char* f : fields) {
      if (!j.contains(f) || !j[f].is_string()) return false;
    }
    return true;
  }

  std::vector<RunRegistration> registrations(const json& list) const {
    expect(list.is_array(), "'registrations'", "an array", list);
    std::vector<RunRegistration> out;
    for (const json& r : list) {
      expect(strings(r, {"prefix", "spec", "matrix", "training_backend"}), "each of 'registrations'",
             "an object with 'prefix', 'spec', 'matrix' and 'training_backend' strings", r);
      out.push_back({r["prefix"].get<std::string>(), r["spec"].get<std::string>(), r["matrix"].get<std::string>(),
                     r["training_backend"].get<std::string>()});
    }
    return out;
  }

  std::map<std::string, RunInitSource> init_from(const json& sources) const {
    expect(sources.is_object(), "'init_from'", "an object", sources);
    std::map<std::string, RunInitSource> out;
    for (const auto& [spec, source] : sources.items()) {
      expect(strings(source, {"dir", "sha256"}), "'init_from." + spec + "'", "an object whose 'dir' and 'sha256' are strings",
             source);
      out[spec] = {source["dir"].get<std::string>(), source["sha256"].get<std::string>()};
    }
    return out;
  }
};

}  // namespace

RunRecord parse_run_record(const json& value, const std::string& file) {
  const Reader read{file};
  read.expect(value.is_object(), "the record", "a JSON object", value);
  RunRecord out;
  if (value.contains("matrix")) {
    read.expect(value["matrix"].is_string(), "'matrix'", "a string", value["matrix"]);
    out.matrix = value["matrix"].get<std::string>();
  }
  if (value.contains("registrations")) out.registrations = read.registrations(value["registrations"]);
  if (value.contains("init_from")) out.init_from = read.init_from(value["init_from"]);
  return out;
}

RunRecord read_run_record(const std::filesystem::path& file) {
  const json value = with_context("reading " + file.string(), [&] { return read_json_file(file); });
  return parse_run_record(value, file.string());
}

}  // namespace mih::contract
