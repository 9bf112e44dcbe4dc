// The case and the case request as types (case_request.h).
#include "harness/contract/case_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <ostream>
#include <utility>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_field_internal.h"
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
  if (!c.trainer.empty()) j["trainer"] = c.trainer;
  if (c.save_config) {
    j["save_config"] = *c.save_config;
    j["resume_at"] = c.resume_at;
  }
}

void from_json(const json& j, Case& c) {
  check_known_fields(j, "case", {"name", "kind", "group", "config", "steps", "compare_to", "device", "pg_backend",
                                 "world_size", "save_config", "resume_at", "trainer"});
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
    if (j.contains("trainer")) {
      out.trainer = j.at("trainer");
      MIH_CHECK(out.trainer.is_object(), "case: 'trainer' must be an object, got ", out.trainer.type_name());
    }
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

std::string Lane::text() const {
  std::string out = dtype ? dtype_name(*dtype) : std::string();
  if (seed) out += (out.empty() ? "" : ",") + std::string("seed=") + std::to_string(*seed);
  return out;
}

json Lane::overrides() const {
  json j = json::object();
  if (dtype) j["dtype"] = dtype_name(*dtype);
  if (seed) j["seed"] = *seed;
  return j;
}

Lane Lane::merged_with(const Lane& over) const {
  Lane out = *this;
  if (over.dtype) out.dtype = over.dtype;
  if (over.seed) out.seed = over.seed;
  return out;
}

Lane parse_lane(std::string_view text, const std::string& where) {
  Lane lane;
  bool dtype_given = false, seed_given = false;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key(eq == std::string_view::npos ? std::string_view("dtype") : item.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? item : item.substr(eq + 1));
    MIH_CHECK(key == "dtype" || key == "seed", where, ": unknown lane setting '", key,
              "'; after '@' give a dtype and optionally seed=N (e.g. cpu-smoke@bfloat16,seed=2)");
    bool& given = key == "dtype" ? dtype_given : seed_given;
    MIH_CHECK(!given, where, ": '", key, "' is given twice");
    given = true;
    if (key == "dtype") {
      lane.dtype = with_context(where, [&] { return parse_dtype_name(value); });
    } else {
      uint64_t seed = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seed);
      MIH_CHECK(ec == std::errc() && end == value.data() + value.size() && seed < (uint64_t{1} << 53), where,
                ": seed '", value, "' is not an integer in [0, 2^53)");
      lane.seed = seed;
    }
  }
  MIH_CHECK(!lane.empty(), where, ": nothing after '@'; give a dtype (e.g. cpu-smoke@float32)");
  return lane;
}

MatrixSource MatrixSource::parse(const std::string& source) {
  MIH_CHECK(!source.empty() && source.front() != '-', "matrix source '", source.substr(0, 200),
            "' is no preset or file name; give a preset (e.g. cpu-smoke) or a JSON matrix file");
  const auto at = source.rfind('@');
  if (at == std::string::npos) return {source, {}};
  const std::string lane = source.substr(at + 1);
  for (const unsigned char ch : lane) {
    if (!(std::isalnum(ch) || ch == '=' || ch == ',' || ch == '_')) return {source, {}};
  }
  return {source.substr(0, at), parse_lane(lane, "matrix source '" + source + "'")};
}

void to_json(json& j, const MatrixSource& m) { j = m.text(); }

void from_json(const json& j, MatrixSource& m) { m = MatrixSource::parse(j.get<std::string>()); }

void to_json(json& j, const CaseRequest& r) {
  j = {{"spec", r.spec},
       {"case", r.c},
       {"matrix", r.matrix},
       {"training_backend", r.training_backend},
       {"fault", r.fault},
       {"init_from", r.init_from},
       {"init_from_sha256", r.init_from_sha256},
       {"case_timeout_ms", r.case_timeout.count()},
       {"collective_timeout_ms", r.collective_timeout.count()},
       {"fingerprint", r.fingerprint}};
}

void from_json(const json& j, CaseRequest& r) {
  check_known_fields(j, "case request",
                     {"spec", "case", "matrix", "training_backend", "fault", "init_from", "init_from_sha256",
                      "case_timeout_ms", "collective_timeout_ms", "fingerprint"});
  using internal::field;
  const std::string what = "case request";
  try {
    CaseRequest out;
    out.spec = field<std::string>(j, "spec", what);
    out.c = field<spec::Case>(j, "case", what);
    out.matrix = field<MatrixSource>(j, "matrix", what);
    out.training_backend = field<std::string>(j, "training_backend", what);
    out.fault = field<std::string>(j, "fault", what);
    if (j.contains("init_from")) out.init_from = field<std::string>(j, "init_from", what);
    if (j.contains("init_from_sha256")) out.init_from_sha256 = field<std::string>(j, "init_from_sha256", what);
    // Integers only (json_int): a timeout of 1.5 ms or true is an edit, never a conversion.
    MIH_CHECK(j.contains("case_timeout_ms"), what, ": field 'case_timeout_ms' is missing");
    MIH_CHECK(j.contains("collective_timeout_ms"), what, ": field 'collective_timeout_ms' is missing");
    out.case_timeout = std::chrono::milliseconds(json_int(j, "case_timeout_ms", 0, what, 1));
    out.collective_timeout = std::chrono::milliseconds(json_int(j, "collective_timeout_ms", 0, what, 0));
    out.fingerprint = field<std::string>(j, "fingerprint", what);
    MIH_CHECK(internal::is_fingerprint(out.fingerprint), what, ": field 'fingerprint' is ", json_summary(j.at("fingerprint")),
              ", not the 16 hex digits mih writes");
    r = std::move(out);
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message());
  }
}

CaseRequest read_case_request(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  MIH_CHECK_CODE(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st), Code::kFailedPrecondition,
                 "case file ", path.string(), " is not a regular file (a directory, FIFO or device): it is not the case "
                 "request mih writes; rerun the case, or write it again with `mih run --prepare`");
  std::string text;
  MIH_CHECK_CODE(read_file(path, &text), Code::kFailedPrecondition, "case file ", path.string(),
                 " is missing: the parent (mih run, mih test) writes it before any rank starts; launch the case "
                 "with `mih run`, or `mih run --prepare` before an external launcher starts the ranks");
  const json j = parse_json_lenient(text);
  MIH_CHECK_CODE(!j.is_discarded() && j.is_object(), Code::kFailedPrecondition, "case file ", path.string(),
                 " is not a JSON object");
  try {
    return j.get<CaseRequest>();
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, "case file ", path.string(), ": ", e.message(),
              ": it is not the case request mih writes (edited or of another tool); rerun the case, or write it "
              "again with `mih run --prepare`");
  }
}

}  // namespace mih
