// Runs N ranks as N threads of the test process, each with its own DeviceMesh over one
// shared in-process store: real Gloo groups on loopback, no mocked process groups.
// See NOTE [Why ranks are threads in unit tests].
//
// NOTE [Why ranks are threads in unit tests]
// Collective wrappers and the mesh are tested with threads: it costs no process start
// (about a second per libtorch process here) and failures stay inside one gtest process.
// The launcher, rendezvous and failure handling are tested with real processes instead.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness/compat/store.h"
#include "harness/runtime/device_mesh.h"

namespace mih::testing {

/// Group options for thread ranks: Gloo on loopback with a short timeout, so a broken test
/// fails in seconds instead of hanging.
inline compat::GroupOptions thread_group_options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  compat::GroupOptions o;
  o.backend = compat::BackendKind::kGloo;
  o.timeout = timeout;
  o.gloo_hostname = "127.0.0.1";
  return o;
}

/// Runs `body(rank)` on `world_size` threads and joins them. Returns one message per rank
/// that threw (empty if none), each prefixed "rank r: ".
inline std::vector<std::string> run_ranks(int world_size, const std::function<void(int rank)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> out;
  for (auto& e : errors) {
    if (!e.empty()) out.push_back(e);
  }
  return out;
}

/// Runs `body(mesh)` on every rank of a `dims` mesh built over a fresh HashStore.
inline std::vector<std::string> run_mesh(const ParallelConfig& dims, const std::function<void(DeviceMesh&)>& body,
                                         MeshOptions options = {}) {
  const int world_size = dims.world_size();
  compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
  if (options.group.gloo_hostname.empty()) options.group = thread_group_options();
  return run_ranks(world_size, [&](int rank) {
    DeviceMesh mesh(dims, store, rank, world_size, options);
    body(mesh);
  });
}

}  // namespace mih::testing
