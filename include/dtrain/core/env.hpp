// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the one place where dtrain reads environment variables, strictly.
//
// Every DTRAIN_* variable goes through these functions. An unset variable, or one set to the
// empty string, gives the caller's default; any other value must parse completely, or the call
// throws InvalidArgument naming the variable, the value and what is accepted. Booleans accept
// exactly 0 1 true false on off yes no; numbers must be whole (no trailing characters), finite
// and inside the stated range; choices must be one of the listed words.
//
// Who reads what (each in one function, called once where the object is configured):
//   CommConfig::from_env (comm/comm_config.hpp)        DTRAIN_COMM_*, DTRAIN_ALLREDUCE_ALGO,
//                                                       DTRAIN_TUNING_FILE
//   SharedSegmentConfig::from_env                      DTRAIN_SHM, DTRAIN_SHM_SLOT_BYTES, _SLOTS
//     (comm/shared_segment_config.hpp)
//   the log threshold (core/log.hpp)                    DTRAIN_LOG_LEVEL
//   mpi_device_buffers (transports/mpi_gpu_support.hpp) DTRAIN_MPI_GPU_AWARE
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>

#include <dtrain/core/error.hpp>

namespace dtrain::env {

/// The value of `name`, or nothing when unset or empty. Thread-safe as far as getenv is (no
/// concurrent setenv).
inline std::optional<std::string> get(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  return std::string(s);
}

namespace detail {
// Only the characters of a plain decimal number (no blanks, hex, inf or nan).
inline bool plain_number(const std::string& v, bool fraction) {
  for (char c : v) {
    const bool ok = (c >= '0' && c <= '9') || c == '+' || c == '-' ||
                    (fraction && (c == '.' || c == 'e' || c == 'E'));
    if (!ok) return false;
  }
  return true;
}
[[noreturn]] inline void bad_value(const char* name, const std::string& value,
                                   const std::string& accepted) {
  raise<InvalidArgument>("environment",
                         dtrain::detail::concat(name, "='", value, "' is not ", accepted));
}
}  // namespace detail

/// Parses a boolean value of variable `name` (for messages): 0 1 true false on off yes no.
inline bool parse_bool(const char* name, const std::string& v) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  detail::bad_value(name, v, "a boolean (accepted: 0 1 true false on off yes no)");
}

/// Parses a finite number in [lo, hi].
inline double parse_double(const char* name, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (!detail::plain_number(v, true) || end == v.c_str() || *end != '\0' || errno == ERANGE ||
      !std::isfinite(x) || x < lo || x > hi)
    detail::bad_value(name, v, dtrain::detail::concat("a number in [", lo, ", ", hi, "]"));
  return x;
}

/// Parses a decimal integer in [lo, hi].
inline long long parse_int(const char* name, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (!detail::plain_number(v, false) || end == v.c_str() || *end != '\0' || errno == ERANGE ||
      x < lo || x > hi)
    detail::bad_value(name, v, dtrain::detail::concat("an integer in [", lo, ", ", hi, "]"));
  return x;
}

/// Returns the position of `v` in `choices`.
inline int parse_choice(const char* name, const std::string& v,
                        std::initializer_list<const char*> choices) {
  int i = 0;
  std::string list;
  for (const char* c : choices) {
    if (v == c) return i;
    list += (i++ ? " " : "");
    list += c;
  }
  detail::bad_value(name, v, "one of: " + list);
}

/// The variable as a boolean, or `fallback` when unset.
inline bool get_bool(const char* name, bool fallback) {
  const auto v = get(name);
  return v ? parse_bool(name, *v) : fallback;
}
/// The variable as a number in [lo, hi], or `fallback` when unset.
inline double get_double(const char* name, double fallback, double lo, double hi) {
  const auto v = get(name);
  return v ? parse_double(name, *v, lo, hi) : fallback;
}
/// The variable as an integer in [lo, hi], or `fallback` when unset.
inline long long get_int(const char* name, long long fallback, long long lo, long long hi) {
  const auto v = get(name);
  return v ? parse_int(name, *v, lo, hi) : fallback;
}
/// The variable's position in `choices`, or `fallback` when unset.
inline int get_choice(const char* name, int fallback, std::initializer_list<const char*> choices) {
  const auto v = get(name);
  return v ? parse_choice(name, *v, choices) : fallback;
}

}  // namespace dtrain::env
