// `mih export` without torch headers, so the command-line TU stays light.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace mih::models {

/// Runs export_reference_model (registry.h) and prints what it wrote. Returns 0.
/// Throws: mih::Error as export_reference_model.
int export_command(const std::string& model, const std::filesystem::path& out, const std::filesystem::path& corpus,
                   int64_t seq_len, int64_t batch, const std::string& dtype, uint64_t seed);

}  // namespace mih::models
