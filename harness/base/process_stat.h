// This process's age from /proc/self/stat (the one reader of that file). Torch-free.
#pragma once

#include <optional>

namespace mih {

/// Seconds since this process started (exec, or the fork that made it: /proc/self/stat's
/// starttime against CLOCK_BOOTTIME, the clock starttime counts in), clamped to >= 0; nullopt
/// when /proc/self/stat cannot be read or parsed. A command forked by the warm server long
/// after the binary loaded counts from its own start.
std::optional<double> process_age_seconds();

}  // namespace mih
