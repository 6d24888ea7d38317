// SPDX-License-Identifier: BSD-3-Clause
// Command-line conventions shared by dtrain's examples and benchmarks (not part of the library:
// only examples/ and benchmarks/ include this, so library users never inherit CLI11).
//
// Every program builds a CLI::App and adds its options through the helpers below, so the same
// option has the same name, meaning, range and help text everywhere:
//   --epochs N  --max-steps N  --batch N  --lr X  --seed N  --hidden N  --threads N
//   --run-dir DIR  --json-summary FILE  --json FILE
// Numbers are parsed strictly: decimal digits only for integers (no "64abc", no octal "010", no
// hex, no sign on counts), a complete finite number for reals ("abc", "1e", "nan" are errors),
// and every value is range-checked. An option given twice takes its last value. CLI11 prints --help
// and the error; run_parser() turns that into an exit code and, under MPI, makes every rank agree
// on it before anyone continues.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

namespace dtrain_cli {

/// Parses a whole decimal integer in [lo, hi]; throws CLI::ValidationError naming the option.
inline std::int64_t parse_int(const std::string& name, const std::string& text, std::int64_t lo,
                              std::int64_t hi) {
  std::size_t i = 0;
  if (!text.empty() && (text[0] == '-' || text[0] == '+') && lo < 0) i = 1;
  bool ok = i < text.size();
  for (std::size_t k = i; ok && k < text.size(); ++k) ok = text[k] >= '0' && text[k] <= '9';
  std::int64_t v = 0;
  if (ok) {
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    ok = errno == 0 && end == text.c_str() + text.size();
    v = static_cast<std::int64_t>(x);
  }
  if (!ok) throw CLI::ValidationError(name, "'" + text + "' is not a whole decimal number");
  if (v < lo || v > hi)
    throw CLI::ValidationError(
        name, "'" + text + "' is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

/// Parses a complete, finite real number in [lo, hi]; throws CLI::ValidationError.
inline double parse_real(const std::string& name, const std::string& text, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    throw CLI::ValidationError(name, "'" + text + "' is not a finite number");
  if (v < lo || v > hi) {
    std::ostringstream os;
    os << "'" << text << "' is outside [" << lo << ", " << hi << "]";
    throw CLI::ValidationError(name, os.str());
  }
  return v;
}

namespace detail {
template <class T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace detail

/// Adds an integer option bound to `value` (its current value is the default) with range [lo, hi].
template <class T>
CLI::Option* add_int(CLI::App& app, const std::string& name, T& value, const std::string& help,
                     std::int64_t lo, std::int64_t hi) {
  static_assert(std::is_integral<T>::value, "add_int needs an integer variable");
  auto* o = app.add_option_function<std::string>(
      name,
      [&value, name, lo, hi](const std::string& s) {
        value = static_cast<T>(parse_int(name, s, lo, hi));
      },
      help + " [" + std::to_string(lo) + ".." +
          (hi == std::numeric_limits<std::int64_t>::max() ? std::string("") : std::to_string(hi)) +
          "]");
  o->type_name("N")->default_str(detail::show(value));
  return o;
}

/// Adds a real option bound to `value` (its current value is the default) with range [lo, hi].
inline CLI::Option* add_real(CLI::App& app, const std::string& name, double& value,
                             const std::string& help, double lo, double hi) {
  auto* o = app.add_option_function<std::string>(
      name, [&value, name, lo, hi](const std::string& s) { value = parse_real(name, s, lo, hi); },
      help);
  o->type_name("X")->default_str(detail::show(value));
  return o;
}

constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

// ---- The shared names ----

inline CLI::Option* add_epochs(CLI::App& app, int& v) {
  return add_int(app, "--epochs", v, "passes over the training set", 1, 1000000);
}
/// -1 means "no limit"; 0 is refused by the programs that train (nothing to do).
inline CLI::Option* add_max_steps(CLI::App& app, std::int64_t& v) {
  return add_int(app, "--max-steps", v,
                 "stop after this many optimizer steps in total (-1: no limit)", -1, kMaxInt);
}
template <class T>
CLI::Option* add_batch(CLI::App& app, T& v, const std::string& help = "samples per rank per step") {
  return add_int(app, "--batch", v, help, 1, 1 << 24);
}
inline CLI::Option* add_lr(CLI::App& app, double& v) {
  return add_real(app, "--lr", v, "peak learning rate", 1e-12, 10.0);
}
inline CLI::Option* add_seed(CLI::App& app, std::uint64_t& v) {
  return add_int(app, "--seed", v, "seed of initialisation and shuffling", 0, kMaxInt);
}
inline CLI::Option* add_hidden(CLI::App& app, std::int64_t& v) {
  return add_int(app, "--hidden", v, "width of each hidden layer", 1, 1 << 20);
}
inline CLI::Option* add_threads(CLI::App& app, int& v, const std::string& help) {
  return add_int(app, "--threads", v, help, 1, 4096);
}
inline CLI::Option* add_run_dir(CLI::App& app, std::string& v) {
  return app.add_option("--run-dir", v,
                        "run directory: checkpoints, metrics.csv, per-rank timings (locked while "
                        "the job runs)");
}
inline CLI::Option* add_json_summary(CLI::App& app, std::string& v) {
  return app.add_option("--json-summary", v, "write a JSON summary of the run to FILE")
      ->type_name("FILE");
}
inline CLI::Option* add_json(CLI::App& app, std::string& v) {
  return app.add_option("--json", v, "write the results as JSON to FILE")->type_name("FILE");
}

/// What parsing argv produced: `code` is -1 when the program should continue, otherwise the exit
/// code (0 after --help, 2 after an error); `out`/`err` hold the text CLI11 would print.
struct ParseResult {
  int code = -1;
  std::string out, err;
};

/// Parses argv without printing.
inline ParseResult parse_quietly(CLI::App& app, int argc, char** argv) {
  ParseResult r;
  // An option given twice takes its last value, so that wrapper scripts can pass defaults that a
  // user's later arguments override (scripts/demo --epochs 5).
  for (CLI::Option* o : app.get_options())
    if (o->get_expected_min() > 0) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    app.exit(e, out, err);
    r.code = e.get_exit_code() == 0 ? 0 : 2;
    r.out = out.str();
    r.err = err.str();
  }
  return r;
}

/// Parses argv, prints help or the error, and returns -1 (continue) or the exit code.
inline int run_parser(CLI::App& app, int argc, char** argv) {
  const ParseResult r = parse_quietly(app, argc, argv);
  std::fputs(r.out.c_str(), stdout);
  std::fputs(r.err.c_str(), stderr);
  return r.code;
}

}  // namespace dtrain_cli
