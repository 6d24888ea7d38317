// SPDX-License-Identifier: BSD-3-Clause
// Command-line parsing for MPI programs (examples and benchmarks only): every rank parses its own
// argv, then the ranks agree on the outcome before anyone continues, so that a bad option on one
// rank of an MPMD launch stops the whole job at once instead of leaving the others waiting in
// their first collective. options_mismatch() then checks that every rank was given the same
// options (a training program must not train different models in lockstep).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cli.hpp"

namespace dtrain_cli {

/// Collective over `comm` (MPI_Allreduce, no deadline needed: every rank calls it right after
/// start-up). Returns -1 when every rank parsed its options, otherwise the exit code every rank
/// must return: 2 if any rank's options are wrong (the lowest such rank prints its error, prefixed
/// with its rank when the job has several), 0 after --help (rank 0 prints it).
inline int run_parser_mpi(CLI::App& app, int argc, char** argv, MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const ParseResult r = parse_quietly(app, argc, argv);
  int worst = r.code, first_bad = r.code == 2 ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, comm);
  if (worst == 2) {
    if (rank == first_bad) {
      if (size > 1) std::fprintf(stderr, "rank %d: ", rank);
      std::fputs(r.err.c_str(), stderr);
      std::fflush(stderr);
    }
    return 2;
  }
  if (worst == 0 || r.code == 0) {
    if (rank == 0) std::fputs(r.out.c_str(), stdout);
    return 0;
  }
  return -1;
}

namespace detail {
// An option's value as this rank has it: the last one given, else the default; a flag is its name
// or "no <name>". `key` is what the ranks compare: numbers by value ("2e-3" and "0.002" agree).
inline void option_value(const CLI::Option& o, std::string& shown, std::string& key) {
  const std::string name = o.get_name();
  if (o.get_expected_min() == 0) {
    shown = o.count() > 0 ? name : "no " + name;
    key = shown;
    return;
  }
  const std::string text = o.count() > 0 ? o.results().back() : o.get_default_str();
  shown = name + " " + text;
  key = text;
  char* end = nullptr;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size()) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", v);
    key = b;
  }
}

// The text of `s` on rank `root` (MPI_Bcast of its length, then of its bytes).
inline std::string broadcast_text(std::string s, int root, MPI_Comm comm) {
  long long len = static_cast<long long>(s.size());
  MPI_Bcast(&len, 1, MPI_LONG_LONG, root, comm);
  s.resize(static_cast<std::size_t>(len));
  if (len > 0) MPI_Bcast(&s[0], static_cast<int>(len), MPI_CHAR, root, comm);
  return s;
}
}  // namespace detail

/// Collective over `comm` (MPI_Allreduce and MPI_Allgather, then MPI_Bcast when they differ):
/// call it on every rank after parsing. Every rank's options must be rank 0's, each taken as the
/// last value given or else its default (numbers compared by value), so that an MPMD launch or a
/// script that hands different options to different ranks does not train different models in
/// lockstep. Returns "" when they agree, otherwise the same message on every rank, naming the
/// lowest rank that differs and its first differing option: "every rank must run with the same
/// options, but rank 1 has --batch 32 and rank 0 has --batch 16 (check the mpiexec command
/// line)". --help is not compared.
inline std::string options_mismatch(CLI::App& app, MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<std::string> shown;
  std::vector<unsigned long long> keys;
  for (const CLI::Option* o : app.get_options()) {
    if (o == app.get_help_ptr() || o == app.get_help_all_ptr()) continue;
    std::string text, key;
    detail::option_value(*o, text, key);
    unsigned long long h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    shown.push_back(text);
    keys.push_back(h);
  }
  int counts[2] = {static_cast<int>(keys.size()), -static_cast<int>(keys.size())};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, comm);
  if (counts[0] != -counts[1]) return "every rank must run the same program with the same options";
  const std::size_t k = keys.size();
  std::vector<unsigned long long> all(k * static_cast<std::size_t>(size));
  MPI_Allgather(keys.data(), static_cast<int>(k), MPI_UNSIGNED_LONG_LONG, all.data(),
                static_cast<int>(k), MPI_UNSIGNED_LONG_LONG, comm);
  for (std::size_t r = 1; r < static_cast<std::size_t>(size); ++r)
    for (std::size_t f = 0; f < k; ++f)
      if (all[r * k + f] != all[f]) {
        const std::string theirs = detail::broadcast_text(shown[f], static_cast<int>(r), comm);
        const std::string ours = detail::broadcast_text(shown[f], 0, comm);
        return "every rank must run with the same options, but rank " + std::to_string(r) +
               " has " + theirs + " and rank 0 has " + ours + " (check the mpiexec command line)";
      }
  return "";
}

}  // namespace dtrain_cli
