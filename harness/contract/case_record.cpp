// The record of a case's run as a type (case_record.h).
#include "harness/contract/case_record.h"

#include <limits>
#include <utility>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_field_internal.h"
#include "harness/base/json_fields.h"

namespace mih {

using nlohmann::json;

namespace {

json null_if_empty(const std::string& s) { return s.empty() ? json() : json(s); }

template <class T>
T field(const json& j, const char* name) {
  return internal::field<T>(j, name, "case record");
}

// An integer field: a float (1.7), a boolean or a string is an error, never a conversion.
int64_t integer(const json& j, const char* name) {
  MIH_CHECK(j.contains(name), "case record: field '", name, "' is missing");
  return json_int(j, name, 0, "case record", 0, int64_t{1} << 20);
}

// A non-negative number of seconds.
double seconds_field(const json& j, const char* name) {
  const double s = field<double>(j, name);
  MIH_CHECK(s >= 0, "case record: field '", name, "' is ", s, " seconds: a duration is not negative");
  return s;
}

std::string string_or_null(const json& j, const char* name) {
  MIH_CHECK(j.contains(name), "case record: field '", name, "' is missing");
  return j.at(name).is_null() ? std::string() : field<std::string>(j, name);
}

}  // namespace

std::vector<CasePhase> case_phases(const spec::Case& c) {
  if (c.save_config) return {{"save", c.save_config->world_size()}, {"load", c.world_size()}};
  return {{"train", c.world_size()}};
}

CaseRecord record_of(const CaseRequest& request) {
  CaseRecord r;
  r.spec = request.spec;
  r.case_name = request.c.name;
  r.kind = request.c.kind;
  r.group = request.c.group;
  r.world_size = request.c.world_size();
  r.config = request.c.config;
  r.compare_to = request.c.compare_to;
  r.matrix = request.matrix;
  r.training_backend = request.training_backend;
  r.fingerprint = request.fingerprint;
  r.fault = request.fault;
  r.init_from = request.init_from;
  r.init_from_sha256 = request.init_from_sha256;
  r.case_timeout = request.case_timeout;
  r.collective_timeout = request.collective_timeout;
  return r;
}

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
       {"case_timeout_ms", r.case_timeout.count()},
       {"collective_timeout_ms", r.collective_timeout.count()},
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
                        "training_backend", "fingerprint", "fault", "init_from", "init_from_sha256", "case_timeout_ms",
                        "collective_timeout_ms", "fault_reached",
                        "seconds", "launch_seconds", "timing", "started_by", "state", "outcome", "error", "files"});
    CaseRecord out;
    out.spec = field<std::string>(j, "spec");
    out.case_name = field<std::string>(j, "case");
    out.kind = spec::parse_case_kind(field<std::string>(j, "kind"));
    out.group = field<std::string>(j, "group");
    out.world_size = integer(j, "world_size");
    out.config = field<ParallelConfig>(j, "config");
    out.compare_to = field<std::string>(j, "compare_to");
    out.matrix = field<MatrixSource>(j, "matrix");
    out.training_backend = field<std::string>(j, "training_backend");
    out.fingerprint = field<std::string>(j, "fingerprint");
    MIH_CHECK(internal::is_fingerprint(out.fingerprint), "case record: field 'fingerprint' is ", json_summary(j.at("fingerprint")),
              ", not the 16 hex digits mih writes");
    out.fault = field<std::string>(j, "fault");
    out.init_from = string_or_null(j, "init_from");
    out.init_from_sha256 = string_or_null(j, "init_from_sha256");
    MIH_CHECK(j.contains("case_timeout_ms"), "case record: field 'case_timeout_ms' is missing");
    MIH_CHECK(j.contains("collective_timeout_ms"), "case record: field 'collective_timeout_ms' is missing");
    out.case_timeout = std::chrono::milliseconds(
        json_int(j, "case_timeout_ms", 0, "case record", 1, std::numeric_limits<int64_t>::max()));
    out.collective_timeout = std::chrono::milliseconds(
        json_int(j, "collective_timeout_ms", 0, "case record", 0, std::numeric_limits<int64_t>::max()));
    if (j.contains("fault_reached")) out.fault_reached = field<bool>(j, "fault_reached");
    out.seconds = seconds_field(j, "seconds");
    out.launch_seconds = field<std::vector<double>>(j, "launch_seconds");
    for (const double s : out.launch_seconds) {
      MIH_CHECK(s >= 0, "case record: field 'launch_seconds' holds ", s, ": a duration is not negative");
    }
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
    MIH_CHECK(!out.files.empty(), "case record: field 'files' lists no evidence digest (every case writes at least its "
              "case request)");
    // What only a fault run records, and only a fault run can give.
    MIH_CHECK(!out.fault_reached || !out.fault.empty(), "case record: 'fault_reached' in a record without a fault");
    MIH_CHECK(out.outcome != Outcome::kFaultNotReached || !out.fault.empty(), "case record: outcome '",
              outcome_name(out.outcome), "' in a record without a fault");
    // A verify-only run reads evidence and writes no record.
    // What run_case writes with each outcome: a conformance failure has the reason the session
    // recorded and left the case FAILED; a case that ran has no error. (An outcome edited over
    // a record of another is refused instead of judged with an empty reason.)
    MIH_CHECK(out.outcome != Outcome::kFailed || (!out.error.empty() && out.state == "FAILED"), "case record: outcome '",
              outcome_name(out.outcome), "' with state '", out.state.substr(0, 60), "' and ",
              out.error.empty() ? "no reason" : "a reason",
              ": a case that failed has the reason its session recorded and the state FAILED");
    MIH_CHECK(out.outcome != Outcome::kRan || out.error.empty(), "case record: outcome '", outcome_name(out.outcome),
              "' with an error ('", out.error.substr(0, 120), "'): a case that ran to its end records none");
    MIH_CHECK(out.outcome != Outcome::kVerifyOnly, "case record: outcome '", outcome_name(out.outcome),
              "' is a verify-only run's, which writes no record");
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
