// A case's changes to its spec's TrainerOptions, their names and their references.
#include "harness/spec/case_trainer.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "harness/base/error.h"

namespace mih::spec {

using nlohmann::json;

namespace {

const std::vector<std::string> kFields = {"optimizer", "momentum", "warmup_steps", "decay_steps", "min_lr",
                                          "max_grad_norm"};

double number(const json& t, const char* field, const std::string& where) {
  MIH_CHECK(t.at(field).is_number(), where, ": trainer '", field, "' must be a number, got ", t.at(field).dump());
  return t.at(field).get<double>();
}

int64_t count(const json& t, const char* field, const std::string& where) {
  MIH_CHECK(t.at(field).is_number_integer() && t.at(field).get<int64_t>() >= 0, where, ": trainer '", field,
            "' must be an integer >= 0, got ", t.at(field).dump());
  return t.at(field).get<int64_t>();
}

}  // namespace

void check_case_trainer(const json& trainer, const std::string& where) {
  MIH_CHECK(trainer.is_object(), where, ": 'trainer' must be an object, got ", trainer.dump());
  for (const auto& [key, value] : trainer.items()) {
    MIH_CHECK(std::find(kFields.begin(), kFields.end(), key) != kFields.end(), where, ": unknown trainer field '", key,
              "'; valid: [optimizer, momentum, warmup_steps, decay_steps, min_lr, max_grad_norm]");
  }
  with_context(where, [&] { (void)with_case_trainer(TrainerOptions(), trainer); });
}

TrainerOptions with_case_trainer(TrainerOptions base, const json& t) {
  const std::string where = "case trainer " + t.dump();
  if (t.contains("optimizer")) {
    MIH_CHECK(t.at("optimizer").is_string(), where, ": 'optimizer' must be a string");
    base.optimizer(parse_optimizer_kind(t.at("optimizer").get<std::string>()));
  }
  if (t.contains("momentum")) base.momentum(number(t, "momentum", where));
  if (t.contains("warmup_steps")) base.warmup_steps(count(t, "warmup_steps", where));
  if (t.contains("decay_steps")) base.decay_steps(count(t, "decay_steps", where));
  if (t.contains("min_lr")) base.min_lr(number(t, "min_lr", where));
  if (t.contains("max_grad_norm")) base.max_grad_norm(number(t, "max_grad_norm", where));
  return base;
}

std::string case_trainer_suffix(const json& t) {
  std::string out;
  if (t.contains("optimizer") && t.at("optimizer").is_string()) {
    std::string name = t.at("optimizer").get<std::string>();
    if (!name.empty()) name[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(name[0])));
    out += name;
  }
  if (t.contains("warmup_steps") || t.contains("decay_steps")) out += "Cosine";
  return out;
}

void read_case_trainer(const json& listed, Case& c, const std::string& where) {
  if (!listed.contains("trainer")) return;
  const json& t = listed.at("trainer");
  check_case_trainer(t, where);
  if (t.empty()) return;
  c.trainer = t;
  const std::string suffix = case_trainer_suffix(t);
  c.name += suffix;
  if (!c.compare_to.empty()) c.compare_to += suffix;
}

std::string case_trainer_lane_problem(const json& trainer, bool reduced) {
  if (!reduced || trainer.empty()) return "";
  return "its own trainer (" + trainer.dump() + ") runs in the float64 lane only: a reduced lane's tolerances are "
         "calibrated on the spec's trainer";
}

std::vector<Case> case_trainer_references(const std::vector<Case>& cases, uint64_t seed) {
  std::vector<Case> out;
  std::set<std::string> named;
  for (const Case& c : cases) {
    if (c.trainer.empty()) continue;
    Case ref;
    ref.name = "Reference" + case_trainer_suffix(c.trainer);
    if (!named.insert(ref.name).second) continue;
    ref.kind = CaseKind::kTrain;
    ref.group = "reference";
    ref.config.dtype = DType::kFloat64;
    ref.config.seed = seed;
    ref.trainer = c.trainer;
    out.push_back(ref);
  }
  return out;
}

}  // namespace mih::spec
