// The case and the case request as types (case_request.h).
#include "harness/base/case_request.h"

#include <ostream>
#include <utility>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"

namespace mih::spec {

using nlohmann::json;

std::string case_kind_name(CaseKind kind) {
  switch (kind) {
    case CaseKind::kReference: return "reference";
    case CaseKind::kTrain: return "train";
    case CaseKind::kResume: return "resume";
    case CaseKind::kCrossResume: return "cross_resume";
  }
  return "?";
}

CaseKind parse_case_kind(const std::string& name) {
  for (CaseKind k : {CaseKind::kReference, CaseKind::kTrain, CaseKind::kResume, CaseKind::kCrossResume}) {
    if (case_kind_name(k) == name) return k;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown case kind '", name, "'; valid: reference, train, resume, cross_resume");
}

void to_json(json& j, const Case& c) {
  j = {{"name", c.name},   {"kind", case_kind_name(c.kind)}, {"group", c.group},   {"config", c.config},
       {"steps", c.steps}, {"compare_to", c.compare_to},     {"device", c.device}, {"pg_backend", c.pg_backend},
       {"world_size", c.world_size()}};
  if (c.save_config) {
    j["save_config"] = *c.save_config;
    j["resume_at"] = c.resume_at;
  }
}

void from_json(const json& j, Case& c) {
  check_known_fields(j, "case", {"name", "kind", "group", "config", "steps", "compare_to", "device", "pg_backend",
                                 "world_size", "save_config", "resume_at"});
  try {
    Case out;
    out.name = j.at("name").get<std::string>();
    out.kind = parse_case_kind(j.at("kind").get<std::string>());
    out.group = j.at("group").get<std::string>();
    out.config = j.at("config").get<ParallelConfig>();
    out.steps = j.at("steps").get<int64_t>();
    out.compare_to = j.at("compare_to").get<std::string>();
    out.device = j.at("device").get<std::string>();
    out.pg_backend = j.at("pg_backend").get<std::string>();
    if (j.contains("save_config")) {
      out.save_config = j.at("save_config").get<ParallelConfig>();
      out.resume_at = j.at("resume_at").get<int64_t>();
    }
    c = std::move(out);
  } catch (const json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, "case: ", e.what());
  }
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (" << c.config << ", " << c.world_size() << " rank" << (c.world_size() == 1 ? "" : "s") << ")";
}

}  // namespace mih::spec

namespace mih {

using nlohmann::json;

void to_json(json& j, const CaseRequest& r) {
  j = {{"spec", r.spec},
       {"case", r.c},
       {"matrix", r.matrix},
       {"training_backend", r.training_backend},
       {"fault", r.fault},
       {"init_from", r.init_from},
       {"init_from_sha256", r.init_from_sha256}};
}

void from_json(const json& j, CaseRequest& r) {
  check_known_fields(j, "case request",
                     {"spec", "case", "matrix", "training_backend", "fault", "init_from", "init_from_sha256"});
  try {
    CaseRequest out;
    out.spec = j.at("spec").get<std::string>();
    out.c = j.at("case").get<spec::Case>();
    out.matrix = j.at("matrix").get<std::string>();
    out.training_backend = j.at("training_backend").get<std::string>();
    out.fault = j.at("fault").get<std::string>();
    if (j.contains("init_from")) out.init_from = j.at("init_from").get<std::string>();
    if (j.contains("init_from_sha256")) out.init_from_sha256 = j.at("init_from_sha256").get<std::string>();
    r = std::move(out);
  } catch (const json::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, e.what());
  }
}

CaseRequest read_case_request(const std::filesystem::path& path) {
  std::string text;
  MIH_CHECK_CODE(read_file(path, &text), Code::kFailedPrecondition, "case file ", path.string(),
                 " is missing: the parent (mih run, mih test) writes it before any rank starts; launch the case "
                 "with `mih run`, or `mih run --prepare` before an external launcher starts the ranks");
  const json j = parse_json_lenient(text);
  MIH_CHECK_CODE(!j.is_discarded() && j.is_object(), Code::kFailedPrecondition, "case file ", path.string(),
                 " is not a JSON object");
  return with_context("case file " + path.string(), [&] { return j.get<CaseRequest>(); });
}

}  // namespace mih
