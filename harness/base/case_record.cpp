// The record of a case's run as a type (case_record.h).
#include "harness/base/case_record.h"

#include <utility>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"

namespace mih {

using nlohmann::json;

namespace {

json null_if_empty(const std::string& s) { return s.empty() ? json() : json(s); }

// Field `name` of the record as a T; a missing or mistyped field is an error naming it.
template <class T>
T field(const json& j, const char* name) {
  MIH_CHECK(j.contains(name), "case record: field '", name, "' is missing");
  try {
    return j.at(name).get<T>();
  } catch (const json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, "case record: field '", name, "' is ", json_summary(j.at(name)), ": ",
              json_error_text(e));
  } catch (const Error& e) {
    MIH_THROW(Code::kInvalidSpec, "case record: field '", name, "': ", e.message());
  }
}

std::string string_or_null(const json& j, const char* name) {
  MIH_CHECK(j.contains(name), "case record: field '", name, "' is missing");
  return j.at(name).is_null() ? std::string() : field<std::string>(j, name);
}

}  // namespace

void to_json(json& j, const CaseRecord& r) {
  j = {{"spec", r.spec},
       {"case", r.case_name},
       {"kind", spec::case_kind_name(r.kind)},
       {"group", r.group},
       {"world_size", r.world_size},
       {"config", r.config},
       {"compare_to", r.compare_to},
       {"matrix", r.matrix},
       {"training_backend", r.training_backend},
       {"fingerprint", r.fingerprint},
       {"fault", r.fault},
       {"init_from", null_if_empty(r.init_from)},
       {"init_from_sha256", null_if_empty(r.init_from_sha256)},
       {"seconds", r.seconds},
       {"launch_seconds", r.launch_seconds},
       {"timing",
        {{"process_start_s", r.timing.process_start_s},
         {"rendezvous_s", r.timing.rendezvous_s},
         {"training_s", r.timing.training_s},
         {"checks_s", r.timing.checks_s},
         {"other_s", r.timing.other_s}}},
       {"started_by", r.started_by},
       {"state", r.state},
       {"outcome", outcome_name(r.outcome)},
       {"error", r.error},
       {"files", r.files}};
  if (r.fault_reached) j["fault_reached"] = *r.fault_reached;
}

void from_json(const json& j, CaseRecord& r) {
  try {
    check_known_fields(j, "case record",
                       {"spec", "case", "kind", "group", "world_size", "config", "compare_to", "matrix",
                        "training_backend", "fingerprint", "fault", "init_from", "init_from_sha256", "fault_reached",
                        "seconds", "launch_seconds", "timing", "started_by", "state", "outcome", "error", "files"});
    CaseRecord out;
    out.spec = field<std::string>(j, "spec");
    out.case_name = field<std::string>(j, "case");
    out.kind = spec::parse_case_kind(field<std::string>(j, "kind"));
    out.group = field<std::string>(j, "group");
    out.world_size = field<int64_t>(j, "world_size");
    out.config = field<ParallelConfig>(j, "config");
    out.compare_to = field<std::string>(j, "compare_to");
    out.matrix = field<std::string>(j, "matrix");
    out.training_backend = field<std::string>(j, "training_backend");
    out.fingerprint = field<std::string>(j, "fingerprint");
    out.fault = field<std::string>(j, "fault");
    out.init_from = string_or_null(j, "init_from");
    out.init_from_sha256 = string_or_null(j, "init_from_sha256");
    if (j.contains("fault_reached")) out.fault_reached = field<bool>(j, "fault_reached");
    out.seconds = field<double>(j, "seconds");
    out.launch_seconds = field<std::vector<double>>(j, "launch_seconds");
    MIH_CHECK(j.contains("timing"), "case record: field 'timing' is missing");
    const json& t = j.at("timing");
    check_known_fields(t, "case record: timing", {"process_start_s", "rendezvous_s", "training_s", "checks_s", "other_s"});
    out.timing = {field<double>(t, "process_start_s"), field<double>(t, "rendezvous_s"),
                  field<double>(t, "training_s"), field<double>(t, "checks_s"), field<double>(t, "other_s")};
    out.started_by = field<std::map<std::string, std::vector<std::string>>>(j, "started_by");
    out.state = field<std::string>(j, "state");
    out.outcome = parse_outcome(field<std::string>(j, "outcome"), "case record: outcome");
    out.error = field<std::string>(j, "error");
    out.files = field<std::map<std::string, std::string>>(j, "files");
    // The digests name files of the case directory: a path that leaves it is no evidence file.
    for (const auto& [relative, digest] : out.files) {
      const std::filesystem::path p(relative);
      bool inside = !relative.empty() && p.is_relative();
      for (const auto& part : p) inside = inside && part != "..";
      MIH_CHECK(inside, "case record: files: '", relative.substr(0, 200),
                "' is not a path inside the case directory (absolute, empty or with '..')");
      MIH_CHECK(digest.size() == 64 && digest.find_first_not_of("0123456789abcdef") == std::string::npos,
                "case record: files: the digest of '", relative.substr(0, 200), "' is not a SHA-256 in hex");
    }
    MIH_CHECK(out.world_size == out.config.world_size(), "case record: world_size ", out.world_size,
              " is not that of its config (", out.config.world_size(), ")");
    r = std::move(out);
  } catch (const json::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, "case record: ", json_error_text(e));
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message());
  }
}

CaseRecord read_case_record(const std::filesystem::path& file) {
  json j;
  try {
    j = read_json_file(file);
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message(), ": not a case record this mih can read; rerun the case");
  }
  MIH_CHECK_CODE(j.is_object(), Code::kFailedPrecondition, "evidence file ", file.string(), " is not a JSON object (",
                 j.type_name(), "): it is not a case record mih wrote (edited or foreign); rerun the case");
  try {
    return j.get<CaseRecord>();
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, "evidence file ", file.string(), ": ", e.message(),
              ": it is not a case record this mih wrote (edited, damaged or of another tool); rerun the case");
  }
}

}  // namespace mih
