// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the tuning file (DTRAIN_TUNING_FILE, CommConfig::tuning_file): a machine's all-reduce
// calibration, cached so that every job on it starts with the same model and decision table,
// and so picks the same algorithm per size on every run.
//
// Format: text, one "key value" per line, '#' starts a comment line:
//   dtrain_tuning 1             format version
//   version 0.1.0               dtrain version that wrote it
//   world_size 2                ranks of the communicator
//   node_shape 1x2              nodes x ranks per node as the transport groups them (3+1 uneven)
//   transport mpi               the transport's name
//   alpha 6.1e-07  beta ...  gamma ...  shm_alpha ...  shm_beta ...  shm_chunk ...
//   inter_alpha ... inter_beta ... inter_share ... call ... cache_bytes ... mem_factor ...
//   cache_ranks ...             (optional: 0, 0, 1, 0, 0, 1, 1 when absent, as older files are)
//   decision 0 rd               one row per line, min_bytes ascending, the first at 0
//   decision 32768 shm
// Every key but `decision` exactly once; numbers are written with 17 significant digits, so a
// round trip is exact. A file whose identity (format, version, world size, node shape,
// transport) differs from the job's is stale: a warning, a new calibration, and the file is
// rewritten. A file that does not parse is an IoError naming the file and line on every rank.
// Rank 0 reads the file and broadcasts it; rank 0 writes it (a temporary file, then rename, so
// a reader never sees half a file).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <cxxabi.h>
#include <unistd.h>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/calibration.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/version.hpp>

namespace dtrain::detail {

/// What a tuning file is valid for. Plain value type.
struct TuningIdentity {
  int format = 1;
  std::string version = version_string();
  int world_size = 1;
  std::string node_shape;
  std::string transport;
  bool operator==(const TuningIdentity& o) const {
    return format == o.format && version == o.version && world_size == o.world_size &&
           node_shape == o.node_shape && transport == o.transport;
  }
};

/// The content of a tuning file.
struct Tuning {
  TuningIdentity identity;
  CostModel model;
  AllreduceDecisions decisions;
};

template <class T, class = void>
struct has_transport_name : std::false_type {};
template <class T>
struct has_transport_name<T, std::void_t<decltype(std::declval<const T&>().name())>>
    : std::true_type {};

/// The transport's name(): its own when it has one, else its C++ type name.
template <class Transport>
std::string transport_name_of(const Transport& t) {
  if constexpr (has_transport_name<Transport>::value) {
    return std::string(t.name());
  } else {
    const char* raw = typeid(Transport).name();
    int status = -1;
    char* readable = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
    std::string name = status == 0 && readable ? readable : raw;
    std::free(readable);
    std::replace(name.begin(), name.end(), ' ', '_');  // one word in the file
    return name;
  }
}

/// The identity of the job that `st` serves.
template <class Transport>
TuningIdentity tuning_identity(CommState<Transport>& st) {
  TuningIdentity id;
  Transport& t = *st.transport;
  id.world_size = t.size();
  id.node_shape = node_map_of(t).describe();  // "2x2", or the node sizes as in "3+1"
  id.transport = transport_name_of(t);
  return id;
}

/// The text of a tuning file.
inline std::string format_tuning(const Tuning& tu) {
  std::ostringstream os;
  os.precision(17);
  os << "# dtrain tuning file: the all-reduce calibration of one machine and job shape\n"
     << "dtrain_tuning " << tu.identity.format << "\n"
     << "version " << tu.identity.version << "\n"
     << "world_size " << tu.identity.world_size << "\n"
     << "node_shape " << tu.identity.node_shape << "\n"
     << "transport " << tu.identity.transport << "\n"
     << "alpha " << tu.model.alpha << "\n"
     << "beta " << tu.model.beta << "\n"
     << "gamma " << tu.model.gamma << "\n"
     << "shm_alpha " << tu.model.shm_alpha << "\n"
     << "shm_beta " << tu.model.shm_beta << "\n"
     << "shm_chunk " << tu.model.shm_chunk << "\n"
     << "inter_alpha " << tu.model.inter_alpha << "\n"
     << "inter_beta " << tu.model.inter_beta << "\n"
     << "inter_share " << tu.model.inter_share << "\n"
     << "call " << tu.model.call << "\n"
     << "cache_bytes " << tu.model.cache_bytes << "\n"
     << "mem_factor " << tu.model.mem_factor << "\n"
     << "cache_ranks " << tu.model.cache_ranks << "\n";
  for (const AllreduceDecision& d : tu.decisions)
    os << "decision " << d.min_bytes << " " << name_of(d.algo) << "\n";
  return os.str();
}

/// Most decision rows a file may hold (a table has at most one per power of two).
inline constexpr std::size_t kMaxTuningRows = 2 * (kDecisionMaxLog2 + 2);

/// Parses the text of tuning file `path` (for messages); IoError naming the file and line.
inline Tuning parse_tuning(const std::string& path, const std::string& text) {
  Tuning tu;
  std::map<std::string, std::string> seen;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) {
    raise<IoError>("tuning file",
                   concat(path, " line ", lineno, ": ", why,
                          " (delete the file to recalibrate, or fix DTRAIN_TUNING_FILE)"));
  };
  auto number = [&](const std::string& v, double lo) {
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < lo)
      bad(concat("'", v, "' is not a number >= ", lo));
    return x;
  };
  auto integer = [&](const std::string& v) {
    for (char ch : v)
      if (ch < '0' || ch > '9') bad(concat("'", v, "' is not a non-negative integer"));
    if (v.empty() || v.size() > 19) bad(concat("'", v, "' is not a non-negative integer"));
    return std::strtoull(v.c_str(), nullptr, 10);
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string key, value, extra;
    ls >> key >> value;
    if (value.empty()) bad(concat("'", line, "' is not 'key value'"));
    if (key == "decision") {
      std::string algo;
      ls >> algo;
      if (algo.empty()) bad("a decision needs 'decision <min_bytes> <algorithm>'");
      ls >> extra;
      if (!extra.empty()) bad(concat("unexpected '", extra, "'"));
      AllreduceDecision d;
      d.min_bytes = static_cast<std::size_t>(integer(value));
      try {
        d.algo = allreduce_algorithm_from_name(algo);
      } catch (const InvalidArgument&) {
        bad(concat("unknown algorithm '", algo, "'"));
      }
      if (d.algo == AllreduceAlgorithm::automatic) bad("a decision cannot be 'auto'");
      if (tu.decisions.empty() ? d.min_bytes != 0 : d.min_bytes <= tu.decisions.back().min_bytes)
        bad("decisions must start at 0 and ascend");
      tu.decisions.push_back(d);
      continue;
    }
    ls >> extra;
    if (!extra.empty()) bad(concat("unexpected '", extra, "'"));
    if (seen.count(key)) bad(concat("'", key, "' given twice"));
    seen[key] = value;
    if (key == "dtrain_tuning") {
      tu.identity.format = static_cast<int>(integer(value));
    } else if (key == "version") {
      tu.identity.version = value;
    } else if (key == "world_size") {
      tu.identity.world_size = static_cast<int>(integer(value));
    } else if (key == "node_shape") {
      tu.identity.node_shape = value;
    } else if (key == "transport") {
      tu.identity.transport = value;
    } else if (key == "alpha") {
      tu.model.alpha = number(value, 0);
    } else if (key == "beta") {
      tu.model.beta = number(value, 0);
    } else if (key == "gamma") {
      tu.model.gamma = number(value, 0);
    } else if (key == "shm_alpha") {
      tu.model.shm_alpha = number(value, 0);
    } else if (key == "shm_beta") {
      tu.model.shm_beta = number(value, 0);
    } else if (key == "shm_chunk") {
      tu.model.shm_chunk = number(value, 1);
    } else if (key == "inter_alpha") {
      tu.model.inter_alpha = number(value, 0);
    } else if (key == "inter_beta") {
      tu.model.inter_beta = number(value, 0);
    } else if (key == "inter_share") {
      tu.model.inter_share = number(value, 1);
    } else if (key == "call") {
      tu.model.call = number(value, 0);
    } else if (key == "cache_bytes") {
      tu.model.cache_bytes = number(value, 0);
    } else if (key == "mem_factor") {
      tu.model.mem_factor = number(value, 1);
    } else if (key == "cache_ranks") {
      tu.model.cache_ranks = static_cast<int>(integer(value));
      if (tu.model.cache_ranks < 1) bad("cache_ranks must be at least 1");
    } else {
      bad(concat("unknown key '", key, "'"));
    }
  }
  for (const char* k : {"dtrain_tuning", "version", "world_size", "node_shape", "transport",
                        "alpha", "beta", "gamma", "shm_alpha", "shm_beta", "shm_chunk"})
    if (!seen.count(k)) {
      lineno = 0;
      bad(concat("'", k, "' missing"));
    }
  if (tu.decisions.empty() || tu.decisions.size() > kMaxTuningRows) {
    lineno = 0;
    bad(concat("needs 1 to ", kMaxTuningRows, " 'decision' lines"));
  }
  if (!tu.model.valid()) {
    lineno = 0;
    bad("alpha and beta must be positive");
  }
  return tu;
}

/// Writes `tu` to `path` atomically (a temporary file beside it, then rename). Returns "" or
/// what went wrong.
inline std::string write_tuning(const std::string& path, const Tuning& tu) {
  const std::string tmp = concat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << format_tuning(tu);
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return concat("cannot write ", tmp, ": ", std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return concat("cannot rename ", tmp, " to ", path, ": ", why);
  }
  return "";
}

/// The calibration of `st`'s communicator (the model applied as `view` says): from the tuning file
/// when one is configured and matches the job, else measured (and then written to the file by rank
/// 0). Collective.
template <class Transport>
Calibration calibrate_or_load(CommState<Transport>& st, const ModelView& view) {
  const std::string& path = st.config.tuning_file;
  if (path.empty()) return calibrate(st, view);
  Transport& t = *st.transport;
  const TuningIdentity want = tuning_identity(st);
  // Rank 0 reads; the outcome travels as doubles: status (0 calibrate, 1 loaded, 2 malformed),
  // the six model numbers, the row count, (min_bytes, algorithm) per row, then the six optional
  // model numbers.
  constexpr std::size_t kMore = 8 + 2 * kMaxTuningRows;
  std::vector<double> msg(kMore + 7, 0.0);
  std::string error;
  if (t.rank() == 0) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      try {
        const Tuning tu = parse_tuning(path, ss.str());
        if (!(tu.identity == want)) {
          DTRAIN_LOG(warn, "tuning file " << path << " is for version " << tu.identity.version
                                          << ", " << tu.identity.world_size << " ranks ("
                                          << tu.identity.node_shape << "), transport "
                                          << tu.identity.transport << "; this job is version "
                                          << want.version << ", " << want.world_size << " ranks ("
                                          << want.node_shape << "), transport " << want.transport
                                          << ": recalibrating and rewriting it");
        } else {
          msg[0] = 1;
          const CostModel& m = tu.model;
          const double v[6] = {m.alpha, m.beta, m.gamma, m.shm_alpha, m.shm_beta, m.shm_chunk};
          std::copy(v, v + 6, msg.begin() + 1);
          msg[7] = static_cast<double>(tu.decisions.size());
          for (std::size_t i = 0; i < tu.decisions.size(); ++i) {
            msg[8 + 2 * i] = static_cast<double>(tu.decisions[i].min_bytes);
            msg[9 + 2 * i] = static_cast<double>(tu.decisions[i].algo);
          }
          const double more[7] = {m.inter_alpha, m.inter_beta, m.call,
                                  m.cache_bytes, m.mem_factor, static_cast<double>(m.cache_ranks),
                                  m.inter_share};
          std::copy(more, more + 7, msg.begin() + kMore);
        }
      } catch (const IoError& e) {
        error = e.what();
        msg[0] = 2;
      }
    }
  }
  {
    PlanSpec s;
    s.kind = CollectiveKind::broadcast;
    s.dtype = DType::f64;
    s.count = msg.size();
    s.in = msg.data();
    s.out = msg.data();
    s.root = 0;
    PlanImpl<Transport> bcast(st, s);
    execute_in_order(st, bcast);
  }
  if (msg[0] == 2) {
    if (!error.empty()) throw IoError(error);
    raise<IoError>("tuning file", concat(path, " is malformed (rank 0 read it; see its error)"));
  }
  if (msg[0] == 1) {
    Calibration c;
    c.model.alpha = msg[1];
    c.model.beta = msg[2];
    c.model.gamma = msg[3];
    c.model.shm_alpha = msg[4];
    c.model.shm_beta = msg[5];
    c.model.shm_chunk = msg[6];
    c.model.inter_alpha = msg[kMore];
    c.model.inter_beta = msg[kMore + 1];
    c.model.call = msg[kMore + 2];
    c.model.cache_bytes = msg[kMore + 3];
    c.model.mem_factor = msg[kMore + 4];
    c.model.cache_ranks = static_cast<int>(msg[kMore + 5]);
    c.model.inter_share = msg[kMore + 6];
    const auto rows = static_cast<std::size_t>(msg[7]);
    for (std::size_t i = 0; i < rows; ++i)
      c.decisions.push_back(AllreduceDecision{static_cast<std::size_t>(msg[8 + 2 * i]),
                                              static_cast<AllreduceAlgorithm>(msg[9 + 2 * i])});
    return c;
  }
  Calibration c = calibrate(st, view);
  if (t.rank() == 0) {
    const std::string why = write_tuning(path, Tuning{want, c.model, c.decisions});
    if (!why.empty()) DTRAIN_LOG(warn, "tuning file not written: " << why);
  }
  return c;
}

}  // namespace dtrain::detail
