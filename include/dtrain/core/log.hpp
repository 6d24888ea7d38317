// SPDX-License-Identifier: BSD-3-Clause
// dtrain: rank-aware logging with levels. The threshold comes from DTRAIN_LOG_LEVEL
// (error, warn, info, debug; default info) and can be changed with set_log_level.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include <dtrain/core/env.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3 };

namespace detail {
inline LogLevel parse_log_level(const char* s, LogLevel fallback) noexcept {
  if (!s) return fallback;
  if (!std::strcmp(s, "error")) return LogLevel::error;
  if (!std::strcmp(s, "warn") || !std::strcmp(s, "warning")) return LogLevel::warn;
  if (!std::strcmp(s, "info")) return LogLevel::info;
  if (!std::strcmp(s, "debug")) return LogLevel::debug;
  return fallback;
}
// DTRAIN_LOG_LEVEL, read once, strictly (<dtrain/core/env.hpp>): a value other than the four
// levels (or "warning") throws InvalidArgument naming the variable at the first log call.
inline int log_level_from_env() {
  const int i =
      env::get_choice("DTRAIN_LOG_LEVEL", 3, {"error", "warn", "warning", "info", "debug"});
  return i <= 1 ? i : i - 1;
}
inline std::atomic<int>& log_threshold() {
  static std::atomic<int> level{log_level_from_env()};
  return level;
}
inline std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}
inline const char* level_name(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}
}  // namespace detail

/// Sets the process-wide threshold. Thread-safe.
inline void set_log_level(LogLevel l) noexcept {
  detail::log_threshold().store(static_cast<int>(l));
}
inline LogLevel log_level() noexcept {
  return static_cast<LogLevel>(detail::log_threshold().load());
}
inline bool log_enabled(LogLevel l) noexcept {
  return static_cast<int>(l) <= detail::log_threshold().load();
}

/// Writes one line "dtrain[rank R] level: message" to stderr if `l` passes the threshold.
/// Thread-safe; lines from threads of one process never interleave.
inline void log(LogLevel l, const std::string& message) {
  if (!log_enabled(l)) return;
  const int r = detail::thread_rank();
  std::lock_guard<std::mutex> lock(detail::log_mutex());
  if (r >= 0)
    std::fprintf(stderr, "dtrain[rank %d] %s: %s\n", r, detail::level_name(l), message.c_str());
  else
    std::fprintf(stderr, "dtrain %s: %s\n", detail::level_name(l), message.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain

/// DTRAIN_LOG(info, "step " << s << " loss " << loss); the stream is built only when enabled.
#define DTRAIN_LOG(level, stream_expr)                                \
  do {                                                                \
    if (::dtrain::log_enabled(::dtrain::LogLevel::level)) {           \
      std::ostringstream dtrain_log_os_;                              \
      dtrain_log_os_ << stream_expr;                                  \
      ::dtrain::log(::dtrain::LogLevel::level, dtrain_log_os_.str()); \
    }                                                                 \
  } while (0)
