// Store selection and the join step of a run.
#include "harness/runtime/rendezvous.h"

#include <unistd.h>

#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/strings.h"

namespace mih {

compat::Store connect_store(const World& world, const Env& env, std::chrono::milliseconds timeout) {
  if (const std::string* path = find_env(env, kStoreFileVar)) {
    return compat::make_file_store(*path, world.world_size, timeout);
  }
  MIH_CHECK(!world.master_addr.empty(),
            "no rendezvous for ", world.describe(), ": set ", kStoreFileVar,
            "=<shared file>, or MASTER_ADDR and MASTER_PORT (torchrun sets them; under srun or mpirun export "
            "MASTER_ADDR=<host of rank 0> MASTER_PORT=<free port>)");
  const std::string* hosted = find_env(env, kStoreHostedVar);
  const std::string* agent = find_env(env, kAgentStoreVar);
  // torch writes str(bool): "True" or "False".
  MIH_CHECK(!agent || *agent == "True" || *agent == "False" || *agent == "1" || *agent == "0", kAgentStoreVar, "='",
            *agent, "': expected True or False (torchrun sets it)");
  const bool agent_hosts = agent && (*agent == "True" || *agent == "1");
  std::string attempt;
  if (agent_hosts) {
    const std::string* restarts = find_env(env, kRestartCountVar);
    attempt = restarts ? *restarts : "0";
    MIH_CHECK(!attempt.empty() && attempt.find_first_not_of("0123456789") == std::string::npos, kRestartCountVar,
              "='", attempt, "': expected the attempt number torchrun sets (0, 1, ...)");
  }
  compat::TcpStoreOptions o;
  o.host = world.master_addr;
  o.port = static_cast<uint16_t>(world.master_port);
  o.is_server = !(hosted && *hosted == "1") && !agent_hosts && world.rank == 0;
  o.world_size = world.world_size;
  o.timeout = timeout;
  compat::Store store = with_context(
      internal::str("while connecting ", world.describe(), " to the rendezvous store",
                    agent_hosts ? " (hosted by torchrun's agent: TORCHELASTIC_USE_AGENT_STORE)" : ""),
      [&] { return compat::make_tcp_store(o); });
  // The agent's store outlives one attempt of the workers: each attempt meets under its own
  // prefix, so a restarted group never reads the keys of the one before it.
  return agent_hosts ? store.prefixed("/worker/attempt_" + attempt) : store;
}

namespace {
std::string join_key_prefix(const std::string& tag) { return "mih/join/" + tag + "/rank"; }
}  // namespace

void join(compat::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
          const std::string& tag) {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string prefix = join_key_prefix(tag);
  store.set(prefix + std::to_string(rank), nlohmann::json{{"host", host}, {"pid", ::getpid()}}.dump());
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const Error&) {
    std::vector<int> missing, joined;
    for (int r = 0; r < world_size; ++r) (store.check({keys[static_cast<size_t>(r)]}) ? joined : missing).push_back(r);
    if (missing.empty()) return;  // the last rank arrived just after the deadline
    auto list = [](const std::vector<int>& v) {
      std::string s = mih::join(v, ", ");
      return "[" + s + "]";
    };
    MIH_THROW(Code::kDeadlineExceeded, "rendezvous '", tag, "' timed out after ", timeout.count(), " ms: rank(s) ",
              list(missing), " of ", world_size, " never joined (joined: ", list(joined), "; store ",
              store.description(), "); check that every rank was started and reaches the same store");
  }
}

nlohmann::json join_records(compat::Store& store, int world_size, const std::string& tag) {
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < world_size; ++r) {
    const nlohmann::json joined =
        nlohmann::json::parse(store.get(join_key_prefix(tag) + std::to_string(r)), nullptr, false);
    out.push_back({{"rank", r},
                   {"host", joined.is_object() ? joined.value("host", "") : ""},
                   {"pid", joined.is_object() ? joined.value("pid", 0) : 0}});
  }
  return out;
}

}  // namespace mih
