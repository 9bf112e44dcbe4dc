// A rank's records of its phase read typed (rank_phase_records.h).
#include "harness/contract/rank_phase_records.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_field_internal.h"
#include "harness/base/json_fields.h"

namespace mih::contract {
namespace {

using nlohmann::json;

// The record of `file` as an object of `fields` handed to `read`, every refusal naming the file.
template <class Record, class Read>
Record read_record(const std::filesystem::path& file, const std::vector<std::string>& fields, Read&& read) {
  try {
    const json j = read_json_file(file);
    check_known_fields(j, file.string(), fields);
    return read(j, file.string());
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message(), ": not what a rank of mih wrote (edited or damaged); rerun the case");
  }
}

double seconds(const json& j, const char* name, const std::string& file) {
  const double s = internal::field<double>(j, name, file);
  MIH_CHECK(j.at(name).is_number(), file, ": field '", name, "' is ", json_summary(j.at(name)), ", not a number");
  return s;
}

}  // namespace

RankTiming read_rank_timing(const std::filesystem::path& file) {
  return read_record<RankTiming>(
      file, {"process_start_s", "rendezvous_s", "build_s", "init_from_s", "init_from_parameters", "steps_s", "end_s", "session_s"},
      [](const json& j, const std::string& where) {
        RankTiming t;
        t.process_start_s = seconds(j, "process_start_s", where);
        t.rendezvous_s = seconds(j, "rendezvous_s", where);
        t.build_s = seconds(j, "build_s", where);
        t.steps_s = seconds(j, "steps_s", where);
        t.end_s = seconds(j, "end_s", where);
        t.session_s = seconds(j, "session_s", where);
        if (j.contains("init_from_s")) t.init_from_s = seconds(j, "init_from_s", where);
        if (j.contains("init_from_parameters")) t.init_from_parameters = json_int(j, "init_from_parameters", 0, where, 0);
        return t;
      });
}

RankFaultReach read_rank_fault_reach(const std::filesystem::path& file) {
  return read_record<RankFaultReach>(file, {"fault", "reached"}, [](const json& j, const std::string& where) {
    return RankFaultReach{internal::field<std::string>(j, "fault", where), internal::field<bool>(j, "reached", where)};
  });
}

RankInitFromFailure read_rank_init_from_failure(const std::filesystem::path& file) {
  return read_record<RankInitFromFailure>(file, {"checkpoint", "code", "error"}, [](const json& j, const std::string& where) {
    return RankInitFromFailure{internal::field<std::string>(j, "checkpoint", where),
                               internal::field<std::string>(j, "code", where), internal::field<std::string>(j, "error", where)};
  });
}

}  // namespace mih::contract
