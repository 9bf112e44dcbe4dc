// The one precompiled header shared by torch-heavy targets (see mih_use_pch in
// MihHelpers.cmake). Only stable, heavy third-party headers belong here, never our own.
// GoogleTest is left out: its cost is small and its compile definitions differ by target.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
