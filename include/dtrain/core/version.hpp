// SPDX-License-Identifier: BSD-3-Clause
// dtrain: library version.
#pragma once

#define DTRAIN_VERSION_MAJOR 0
#define DTRAIN_VERSION_MINOR 1
#define DTRAIN_VERSION_PATCH 0
#define DTRAIN_VERSION_STRING "0.1.0"

namespace dtrain {
/// "MAJOR.MINOR.PATCH" of the headers in use.
inline constexpr const char* version_string() noexcept { return DTRAIN_VERSION_STRING; }
}  // namespace dtrain
