// allreduce_model: dtrain's all-reduce cost model projected to scale. From alpha-beta-gamma
// parameters (given, read from a JSON file, or calibrated on the communicator this run is
// launched on) it predicts every algorithm's time from 2 to 100,000 ranks and 4 KiB to 1 GiB,
// prints the best algorithm per (ranks, size) with its predicted bus bandwidth, and writes CSV,
// JSON and a PNG heat map (gnuplot). With --measured it compares the model against the rows of
// allreduce_bench --json files instead: predicted against measured time, with the error.
//
//   build/benchmarks/allreduce_model --alpha 2e-6 --beta 1e-10 --gamma 5e-11 --png map.png
//   mpiexec.mpich -n 2 build/benchmarks/allreduce_model --calibrate mpi --csv model.csv
//   build/benchmarks/allreduce_model --calibrate loopback --loopback-ranks 4
//   build/benchmarks/allreduce_model --params bench.json --inter-alpha 5e-6 --inter-beta 4e-11
//   build/benchmarks/allreduce_model --measured p2.json --measured p4.json
//
// Units: seconds (alpha), seconds per byte (beta, gamma); busbw = algbw * 2(p-1)/p, GB/s = 1e9
// B/s, K/M/G = 1024^k, as allreduce_bench and nccl-tests report them.
//
// Ranks fill nodes of --ranks-per-node in order; the time of each algorithm is
// CostModel::predict over that Topology (flat algorithms pay the slower of the inside-node and
// inter-node alpha and beta on every message once there are several nodes, since each of their
// steps runs hops of both kinds at once; shm needs one node, hier and hier_leader need
// several nodes with several ranks). The algorithms whose steps cross nodes from every rank of
// a node at once (rhd, rd, and hier's per-part rings) share the node's NICs: the model's
// inter_share, which the projection sets to --ranks-per-nic (at most the ranks on a node),
// multiplies their inter-node beta. See benchmarks/RESULTS.md for what the model leaves out.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/transports/loopback.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/cli_mpi.hpp"

namespace {

using dtrain::AllreduceAlgorithm;
using dtrain::CostModel;

// ---- A small JSON reader: enough for the files allreduce_bench and this program write. ----

struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* find(const std::string& key) const {
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

class JsonParser {
 public:
  JsonParser(std::string text, std::string where) : s_(std::move(text)), where_(std::move(where)) {}

  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw dtrain::IoError("allreduce_model: " + where_ + ": malformed JSON at byte " +
                          std::to_string(i_) + ": " + what);
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string text() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;  // the files we read escape nothing else
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::object;
      ++i_;
      if (eat('}')) return v;
      do {
        std::string key = text();
        expect(':');
        v.members.emplace_back(std::move(key), value());
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::array;
      ++i_;
      if (eat(']')) return v;
      do v.items.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::string;
      v.str = text();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::boolean;
      v.num = s_[i_] == 't' ? 1 : 0;
      i_ += s_[i_] == 't' ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      char* end = nullptr;
      v.kind = Json::number;
      v.num = std::strtod(s_.c_str() + i_, &end);
      if (end == s_.c_str() + i_) fail("expected a value");
      i_ = static_cast<std::size_t>(end - s_.c_str());
    }
    return v;
  }

  std::string s_, where_;
  std::size_t i_ = 0;
};

Json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw dtrain::IoError("allreduce_model: cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return JsonParser(ss.str(), path).parse();
}

double number_in(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = obj.find(key);
  if (!v || v->kind != Json::number)
    throw dtrain::IoError("allreduce_model: " + where + ": no number '" + key + "'");
  return v->num;
}

// ---- The model at scale ----

/// What a projection needs besides the CostModel (whose inter_alpha / inter_beta, 0 = as inside
/// a node, price messages between nodes).
struct Machine {
  CostModel cm;
  int ranks_per_node = 8;  // consecutive ranks share a node
  int ranks_per_nic = 1;   // ranks of a node that share one NIC (1: a NIC, or rail, per rank)
  std::string source;      // where the parameters came from
};

const std::vector<AllreduceAlgorithm>& model_algorithms() {
  static const std::vector<AllreduceAlgorithm> all{
      AllreduceAlgorithm::ring,       AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
      AllreduceAlgorithm::rd,         AllreduceAlgorithm::shm,  AllreduceAlgorithm::hier,
      AllreduceAlgorithm::hier_leader};
  return all;
}

constexpr double kUnavailable = 1e300;

/// `p` ranks filling nodes of `per_node` ranks in order (the last node may have fewer).
dtrain::Topology topology_of(int p, int per_node) {
  const int nodes = (p + per_node - 1) / per_node;
  const int last = p - (nodes - 1) * per_node;
  return dtrain::Topology{nodes, std::min(p, per_node), nodes > 1 ? last : p};
}

/// Predicted seconds of `algo` on `bytes` bytes per rank over `p` ranks of machine `m`
/// (kUnavailable where the algorithm cannot run).
double project(const Machine& m, AllreduceAlgorithm algo, std::size_t bytes, int p) {
  const dtrain::Topology topo = topology_of(p, m.ranks_per_node);
  const bool hier = algo == AllreduceAlgorithm::hier || algo == AllreduceAlgorithm::hier_leader;
  if (hier && !topo.hierarchical()) return kUnavailable;  // as CostModel::best decides
  CostModel cm = m.cm;
  // Where every rank of a node crosses to another node at once (rhd, rd, hier's parts), the
  // ranks sharing a NIC share its bandwidth: the machine described by --ranks-per-nic, not the
  // inter_share a calibration measured on the machine it ran on.
  cm.inter_share = std::min(m.ranks_per_nic, topo.max_ranks_per_node);
  const double t = cm.predict(algo, bytes, p, topo);
  return t >= kUnavailable ? kUnavailable : t;
}

double busbw_gbs(std::size_t bytes, int p, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9 * 2.0 * (p - 1) / p;
}

std::string show_size(std::size_t b) {
  const char* unit[] = {"", "K", "M", "G"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + unit[u];
}

// "4096", "4K", "1M", "1G" (K/M/G = 1024^k), at most 64G.
std::size_t parse_size(const std::string& name, const std::string& text) {
  std::string digits = text;
  double scale = 1;
  if (!digits.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    const double k = last == 'K'   ? 1024.0
                     : last == 'M' ? 1048576.0
                     : last == 'G' ? 1073741824.0
                                   : 0;
    if (k > 0) {
      scale = k;
      digits.pop_back();
    }
  }
  const double v = dtrain_cli::parse_real(name, digits, 1, 64.0 * 1073741824.0 / scale) * scale;
  return static_cast<std::size_t>(v);
}

struct Options {
  double alpha = 0, beta = 0, gamma = -1, shm_alpha = 0, shm_beta = 0, shm_chunk = 256 * 1024;
  double inter_alpha = 0, inter_beta = 0;
  int ranks_per_node = 8, ranks_per_nic = 1, loopback_ranks = 2;
  int measured_ranks_per_node = 0;  // --ranks-per-node given with --measured
  std::int64_t ranks_min = 2, ranks_max = 100000;
  std::string b = "4K", e = "1G", params, calibrate, csv, json, png;
  double factor = 4;
  std::vector<std::string> measured;
  std::string validation_csv;
};

// ---- Parameters from their three sources ----

CostModel cost_model_from(const Json& doc, const std::string& path) {
  const Json* cmj = doc.find("cost_model");
  if (!cmj || cmj->kind != Json::object)
    throw dtrain::IoError("allreduce_model: " + path +
                          ": no \"cost_model\" object (allreduce_bench writes it when it "
                          "calibrates, i.e. unless DTRAIN_ALLREDUCE_ALGO fixes the algorithm)");
  CostModel cm;
  cm.alpha = number_in(*cmj, "alpha", path);
  cm.beta = number_in(*cmj, "beta", path);
  cm.gamma = number_in(*cmj, "gamma", path);
  if (cmj->find("shm_alpha")) cm.shm_alpha = number_in(*cmj, "shm_alpha", path);
  if (cmj->find("shm_beta")) cm.shm_beta = number_in(*cmj, "shm_beta", path);
  if (cmj->find("shm_chunk")) cm.shm_chunk = number_in(*cmj, "shm_chunk", path);
  if (cmj->find("inter_alpha")) cm.inter_alpha = number_in(*cmj, "inter_alpha", path);
  if (cmj->find("inter_beta")) cm.inter_beta = number_in(*cmj, "inter_beta", path);
  if (cmj->find("call")) cm.call = number_in(*cmj, "call", path);
  if (cmj->find("cache_bytes")) cm.cache_bytes = number_in(*cmj, "cache_bytes", path);
  if (cmj->find("mem_factor")) cm.mem_factor = number_in(*cmj, "mem_factor", path);
  if (cmj->find("cache_ranks"))
    cm.cache_ranks = static_cast<int>(number_in(*cmj, "cache_ranks", path));
  if (!cm.valid() || cm.shm_alpha < 0 || cm.shm_beta < 0 || cm.shm_chunk < 1 ||
      cm.inter_alpha < 0 || cm.inter_beta < 0)
    throw dtrain::InvalidArgument("allreduce_model: " + path +
                                  ": cost_model needs alpha > 0, beta > 0, gamma >= 0, shm and "
                                  "inter terms >= 0 and shm_chunk >= 1");
  return cm;
}

// Calibrates on every rank of MPI_COMM_WORLD (collective) or on `n` loopback threads.
CostModel calibrate(const std::string& how, int n, int& p) {
  if (how == "mpi") {
    dtrain::MpiTransport t(MPI_COMM_WORLD);
    dtrain::Communicator comm(t);
    p = comm.size();
    if (p < 2)
      throw dtrain::InvalidArgument(
          "allreduce_model: --calibrate mpi needs at least 2 ranks (run it under mpiexec -n 2)");
    return comm.cost_model();
  }
  CostModel out;
  std::mutex m;
  p = n;
  dtrain::run_loopback(n, [&](dtrain::LoopbackTransport& t) {
    dtrain::Communicator comm(t);
    const CostModel cm = comm.cost_model();
    if (t.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      out = cm;
    }
  });
  return out;
}

void print_parameters(const Machine& m) {
  std::printf("# parameters (%s):\n", m.source.c_str());
  std::printf(
      "#   alpha %.3f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f ns/B (%.2f GB/s reduced)\n",
      m.cm.alpha * 1e6, m.cm.beta * 1e9, 1e-9 / m.cm.beta, m.cm.gamma * 1e9,
      m.cm.gamma > 0 ? 1e-9 / m.cm.gamma : 0.0);
  if (m.cm.shm_alpha > 0)
    std::printf("#   shm: hand-off %.3f us, %.4f ns/B, chunk %.0f B\n", m.cm.shm_alpha * 1e6,
                m.cm.shm_beta * 1e9, m.cm.shm_chunk);
  else
    std::printf("#   shm: not available\n");
  const double ia = m.cm.inter_alpha > 0 ? m.cm.inter_alpha : m.cm.alpha;
  const double ib = m.cm.inter_beta > 0 ? m.cm.inter_beta : m.cm.beta;
  std::printf(
      "#   %d ranks per node, %d ranks per NIC; between nodes alpha %.3f us, beta %.4f ns/B "
      "(%.2f GB/s)%s\n",
      m.ranks_per_node, m.ranks_per_nic, ia * 1e6, ib * 1e9, 1e-9 / ib,
      m.cm.inter_alpha > 0 || m.cm.inter_beta > 0 ? "" : " (= inside a node: not given)");
}

// ---- Projection table ----

struct Cell {
  int p;
  std::size_t bytes;
  std::vector<double> seconds;  // per model_algorithms()
  std::size_t best;
};

std::vector<int> rank_grid(const Options& o) {
  std::vector<int> ps;
  for (std::int64_t p = o.ranks_min; p < o.ranks_max; p *= 2) ps.push_back(static_cast<int>(p));
  ps.push_back(static_cast<int>(o.ranks_max));
  return ps;
}

std::vector<std::size_t> size_grid(const Options& o) {
  const std::size_t lo = parse_size("-b", o.b), hi = parse_size("-e", o.e);
  if (hi < lo) throw CLI::ValidationError("-b/-e", "need -b <= -e");
  std::vector<std::size_t> out;
  for (double s = static_cast<double>(lo); s <= static_cast<double>(hi) * 1.0001; s *= o.factor)
    out.push_back(static_cast<std::size_t>(s));
  return out;
}

std::vector<Cell> project_all(const Machine& m, const std::vector<int>& ps,
                              const std::vector<std::size_t>& sizes) {
  std::vector<Cell> cells;
  const auto& algos = model_algorithms();
  for (int p : ps)
    for (std::size_t bytes : sizes) {
      Cell c{p, bytes, {}, 0};
      for (std::size_t a = 0; a < algos.size(); ++a) {
        c.seconds.push_back(project(m, algos[a], bytes, p));
        if (c.seconds[a] < c.seconds[c.best]) c.best = a;
      }
      cells.push_back(std::move(c));
    }
  return cells;
}

void print_table(const std::vector<Cell>& cells, const std::vector<std::size_t>& sizes) {
  std::printf("\n# best algorithm per (ranks, size per rank) : its predicted busbw in GB/s\n");
  std::printf("%8s", "ranks");
  for (std::size_t s : sizes) std::printf(" %17s", show_size(s).c_str());
  std::printf("\n");
  int row = -1;
  for (const Cell& c : cells) {
    if (c.p != row) {
      if (row != -1) std::printf("\n");
      row = c.p;
      std::printf("%8d", c.p);
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s:%.3g", dtrain::name_of(model_algorithms()[c.best]),
                  busbw_gbs(c.bytes, c.p, c.seconds[c.best]));
    std::printf(" %17s", buf);
  }
  std::printf("\n");
}

FILE* open_out(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw dtrain::IoError("allreduce_model: cannot write " + path);
  return f;
}

void write_csv(const std::string& path, const std::vector<Cell>& cells) {
  FILE* f = open_out(path);
  std::fprintf(f, "ranks,bytes,algo,time_us,busbw_gbs,best\n");
  const auto& algos = model_algorithms();
  for (const Cell& c : cells)
    for (std::size_t a = 0; a < algos.size(); ++a) {
      if (c.seconds[a] >= kUnavailable) continue;
      std::fprintf(f, "%d,%zu,%s,%.6g,%.6g,%d\n", c.p, c.bytes, dtrain::name_of(algos[a]),
                   c.seconds[a] * 1e6, busbw_gbs(c.bytes, c.p, c.seconds[a]), a == c.best ? 1 : 0);
    }
  std::fclose(f);
}

void write_json(const std::string& path, const Machine& m, const std::vector<Cell>& cells) {
  FILE* f = open_out(path);
  std::fprintf(f,
               "{\"cost_model\": {\"alpha\": %.6e, \"beta\": %.6e, \"gamma\": %.6e, \"shm_alpha\": "
               "%.6e, \"shm_beta\": %.6e, \"shm_chunk\": %.0f, \"inter_alpha\": %.6e, "
               "\"inter_beta\": %.6e},\n",
               m.cm.alpha, m.cm.beta, m.cm.gamma, m.cm.shm_alpha, m.cm.shm_beta, m.cm.shm_chunk,
               m.cm.inter_alpha, m.cm.inter_beta);
  std::fprintf(f, " \"ranks_per_node\": %d, \"ranks_per_nic\": %d,\n \"cells\": [\n",
               m.ranks_per_node, m.ranks_per_nic);
  const auto& algos = model_algorithms();
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    std::fprintf(
        f, "  {\"ranks\": %d, \"bytes\": %zu, \"best\": \"%s\", \"busbw\": %.6g, \"time_us\": {",
        c.p, c.bytes, dtrain::name_of(algos[c.best]), busbw_gbs(c.bytes, c.p, c.seconds[c.best]));
    bool first = true;
    for (std::size_t a = 0; a < algos.size(); ++a) {
      if (c.seconds[a] >= kUnavailable) continue;
      std::fprintf(f, "%s\"%s\": %.6g", first ? "" : ", ", dtrain::name_of(algos[a]),
                   c.seconds[a] * 1e6);
      first = false;
    }
    std::fprintf(f, "}}%s\n", i + 1 < cells.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

// A heat map: one colour per best algorithm, its busbw written in the cell.
void write_png(const std::string& path, const std::vector<Cell>& cells, const std::vector<int>& ps,
               const std::vector<std::size_t>& sizes) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("# png: skipped (gnuplot not found; Debian: apt-get install gnuplot-nox)\n");
    return;
  }
  const std::string data = path + ".dat";
  FILE* d = open_out(data);
  for (const Cell& c : cells) {
    const auto col = std::find(sizes.begin(), sizes.end(), c.bytes) - sizes.begin();
    const auto row = std::find(ps.begin(), ps.end(), c.p) - ps.begin();
    std::fprintf(d, "%td %td %zu %.3g\n", col, row, c.best,
                 busbw_gbs(c.bytes, c.p, c.seconds[c.best]));
  }
  std::fclose(d);
  const std::string script = path + ".gp";
  FILE* g = open_out(script);
  const auto& algos = model_algorithms();
  const char* colours[] = {"#4e79a7", "#59a14f", "#f28e2b", "#e15759",
                           "#b07aa1", "#76b7b2", "#edc948", "#9c755f"};
  std::fprintf(g, "set terminal pngcairo noenhanced size 1100,800 font ',10'\nset output '%s'\n",
               path.c_str());
  std::fprintf(g,
               "set title 'dtrain all-reduce: best algorithm (colour) and its predicted busbw "
               "(GB/s)'\nset xlabel 'bytes per rank'\nset ylabel 'ranks'\n");
  std::fprintf(g, "set xrange [-0.5:%zu.5]\nset yrange [-0.5:%zu.5]\n", sizes.size() - 1,
               ps.size() - 1);
  std::fprintf(g, "set xtics (");
  for (std::size_t i = 0; i < sizes.size(); ++i)
    std::fprintf(g, "%s'%s' %zu", i ? ", " : "", show_size(sizes[i]).c_str(), i);
  std::fprintf(g, ")\nset ytics (");
  for (std::size_t i = 0; i < ps.size(); ++i)
    std::fprintf(g, "%s'%d' %zu", i ? ", " : "", ps[i], i);
  std::fprintf(g, ")\nset cbrange [-0.5:%zu.5]\nset palette maxcolors %zu\nset palette defined (",
               algos.size() - 1, algos.size());
  for (std::size_t a = 0; a < algos.size(); ++a)
    std::fprintf(g, "%s%zu '%s'", a ? ", " : "", a, colours[a % 8]);
  std::fprintf(g, ")\nset cbtics (");
  for (std::size_t a = 0; a < algos.size(); ++a)
    std::fprintf(g, "%s'%s' %zu", a ? ", " : "", dtrain::name_of(algos[a]), a);
  std::fprintf(g,
               ")\nunset key\nplot '%s' using 1:2:3 with image, '' using 1:2:(sprintf('%%s', "
               "strcol(4))) with labels font ',8'\n",
               data.c_str());
  std::fclose(g);
  const std::string cmd = "gnuplot '" + script + "'";
  if (std::system(cmd.c_str()) != 0)
    throw dtrain::IoError("allreduce_model: gnuplot failed on " + script);
  std::remove(data.c_str());
  std::remove(script.c_str());
  std::printf("# png: %s\n", path.c_str());
}

// ---- Validation against allreduce_bench --json rows ----

struct Check {
  std::string file, transport, algo;
  int p;
  std::size_t bytes;
  double predicted_us, measured_us;
};

std::vector<Check> validate(const Options& o, const Machine* given) {
  std::vector<Check> out;
  for (const std::string& path : o.measured) {
    const Json doc = read_json(path);
    const int p = static_cast<int>(number_in(doc, "p", path));
    Machine m;
    if (given) {
      m = *given;
    } else {
      m.cm = cost_model_from(doc, path);
      if (o.inter_alpha > 0) m.cm.inter_alpha = o.inter_alpha;
      if (o.inter_beta > 0) m.cm.inter_beta = o.inter_beta;
      m.ranks_per_nic = o.ranks_per_nic;
      m.source = path;
    }
    // A measurement here runs on one machine: its p ranks share one node unless the run made
    // fake nodes (DTRAIN_RANKS_PER_NODE), which --ranks-per-node then states.
    m.ranks_per_node = o.measured_ranks_per_node > 0 ? o.measured_ranks_per_node : p;
    const Json* rows = doc.find("rows");
    if (!rows || rows->kind != Json::array)
      throw dtrain::IoError("allreduce_model: " + path + ": no \"rows\" array");
    std::printf("# %s: p=%d, parameters from %s: alpha %.2f us, beta %.4f ns/B, gamma %.4f ns/B\n",
                path.c_str(), p, given ? given->source.c_str() : "this file", m.cm.alpha * 1e6,
                m.cm.beta * 1e9, m.cm.gamma * 1e9);
    for (const Json& r : rows->items) {
      const Json* algo = r.find("algo");
      const Json* tr = r.find("transport");
      if (!algo || algo->kind != Json::string) continue;
      const auto& algos = model_algorithms();
      const auto it = std::find_if(algos.begin(), algos.end(), [&](AllreduceAlgorithm a) {
        return algo->str == dtrain::name_of(a);
      });
      if (it == algos.end()) continue;  // auto, mpi: not a modelled algorithm
      const auto bytes = static_cast<std::size_t>(number_in(r, "bytes", path));
      const double t = project(m, *it, bytes, p);
      if (t >= kUnavailable) continue;
      out.push_back(Check{path, tr && tr->kind == Json::string ? tr->str : "?", algo->str, p, bytes,
                          t * 1e6, number_in(r, "time_us", path)});
    }
  }
  return out;
}

// Markdown tables: the error per (measurement, algorithm) and size, then per size which
// algorithm the model picks against the measured fastest, and what the pick costs.
void report_validation(const Options& o, const std::vector<Check>& checks) {
  std::vector<std::size_t> sizes;
  std::vector<std::pair<std::string, int>> files;  // in order of appearance
  for (const Check& c : checks) {
    if (std::find(sizes.begin(), sizes.end(), c.bytes) == sizes.end()) sizes.push_back(c.bytes);
    if (std::find(files.begin(), files.end(), std::make_pair(c.file, c.p)) == files.end())
      files.emplace_back(c.file, c.p);
  }
  std::sort(sizes.begin(), sizes.end());
  auto header = [&](const char* first, const char* second) {
    std::printf("| %s | %s |", first, second);
    for (std::size_t s : sizes) std::printf(" %s |", show_size(s).c_str());
    std::printf("\n|---|---|");
    for (std::size_t i = 0; i < sizes.size(); ++i) std::printf("---:|");
    std::printf("\n");
  };
  std::printf("\n# model error, predicted / measured - 1, per size\n");
  header("measurement", "algo");
  std::map<std::string, std::vector<double>> by_algo;
  for (const auto& f : files)
    for (AllreduceAlgorithm a : model_algorithms()) {
      bool any = false;
      for (const Check& c : checks)
        any = any || (c.file == f.first && c.algo == dtrain::name_of(a));
      if (!any) continue;
      std::printf("| %s (p=%d) | %s |", f.first.c_str(), f.second, dtrain::name_of(a));
      for (std::size_t s : sizes) {
        const auto it = std::find_if(checks.begin(), checks.end(), [&](const Check& c) {
          return c.file == f.first && c.algo == dtrain::name_of(a) && c.bytes == s;
        });
        if (it == checks.end()) {
          std::printf(" |");
          continue;
        }
        const double err = it->predicted_us / it->measured_us - 1;
        by_algo[it->algo].push_back(std::fabs(err));
        std::printf(" %+.0f%% |", err * 100);
      }
      std::printf("\n");
    }
  std::printf("\n# median |error| per algorithm:");
  for (auto& kv : by_algo) {
    std::sort(kv.second.begin(), kv.second.end());
    std::printf(" %s %.0f%%", kv.first.c_str(), kv.second[kv.second.size() / 2] * 100);
  }
  std::printf(
      "\n\n# the model's pick / the measured fastest (measured time of the pick / fastest)\n");
  header("measurement", "");
  for (const auto& f : files) {
    std::printf("| %s (p=%d) | |", f.first.c_str(), f.second);
    for (std::size_t s : sizes) {
      const Check *pick = nullptr, *fastest = nullptr;
      for (const Check& c : checks) {
        if (c.file != f.first || c.bytes != s) continue;
        if (!pick || c.predicted_us < pick->predicted_us) pick = &c;
        if (!fastest || c.measured_us < fastest->measured_us) fastest = &c;
      }
      if (!pick) {
        std::printf(" |");
        continue;
      }
      std::printf(" %s/%s (%.2f) |", pick->algo.c_str(), fastest->algo.c_str(),
                  pick->measured_us / fastest->measured_us);
    }
    std::printf("\n");
  }
  if (!o.validation_csv.empty()) {
    FILE* f = open_out(o.validation_csv);
    std::fprintf(f, "file,transport,algo,ranks,bytes,predicted_us,measured_us,error\n");
    for (const Check& c : checks)
      std::fprintf(f, "%s,%s,%s,%d,%zu,%.6g,%.6g,%.4f\n", c.file.c_str(), c.transport.c_str(),
                   c.algo.c_str(), c.p, c.bytes, c.predicted_us, c.measured_us,
                   c.predicted_us / c.measured_us - 1);
    std::fclose(f);
  }
}

int run(int argc, char** argv, bool use_mpi, int world_rank) {
  Options o;
  CLI::App app{"allreduce_model: dtrain's all-reduce cost model projected from 2 to 100,000 ranks"};
  dtrain_cli::add_real(app, "--alpha", o.alpha, "seconds per message", 1e-12, 1.0);
  dtrain_cli::add_real(app, "--beta", o.beta, "seconds per byte moved", 1e-15, 1e-3);
  dtrain_cli::add_real(app, "--gamma", o.gamma, "seconds per byte reduced", 0, 1e-3)
      ->default_str("none");
  dtrain_cli::add_real(app, "--shm-alpha", o.shm_alpha,
                       "seconds per counter hand-off through shared segments (0: no shm)", 0, 1.0);
  dtrain_cli::add_real(app, "--shm-beta", o.shm_beta, "shm seconds per byte of vector", 0, 1e-3);
  dtrain_cli::add_real(app, "--shm-chunk", o.shm_chunk, "shm pipelining chunk in bytes", 1, 1e12);
  dtrain_cli::add_real(app, "--inter-alpha", o.inter_alpha,
                       "seconds per message between nodes (0: as inside)", 0, 1.0);
  dtrain_cli::add_real(app, "--inter-beta", o.inter_beta,
                       "seconds per byte between nodes (0: as inside)", 0, 1e-3);
  dtrain_cli::add_int(app, "--ranks-per-node", o.ranks_per_node, "consecutive ranks on one node", 1,
                      1 << 20);
  dtrain_cli::add_int(app, "--ranks-per-nic", o.ranks_per_nic,
                      "ranks of a node sharing one NIC (1: a NIC or rail per rank)", 1, 1 << 20);
  app.add_option("--params", o.params,
                 "read the cost model from a JSON file (allreduce_bench --json, or this "
                 "program's --json)")
      ->type_name("FILE");
  app.add_option("--calibrate", o.calibrate,
                 "measure the cost model: mpi (all ranks of this mpiexec job) or loopback")
      ->check(CLI::IsMember({"mpi", "loopback"}));
  dtrain_cli::add_int(app, "--loopback-ranks", o.loopback_ranks,
                      "threads of the loopback world --calibrate loopback measures", 2, 256);
  dtrain_cli::add_int(app, "--ranks-min", o.ranks_min, "smallest rank count of the table", 2,
                      1 << 30);
  dtrain_cli::add_int(app, "--ranks-max", o.ranks_max, "largest rank count of the table", 2,
                      1 << 30);
  app.add_option("-b", o.b, "smallest message per rank (suffix K, M, G)")->capture_default_str();
  app.add_option("-e", o.e, "largest message per rank")->capture_default_str();
  dtrain_cli::add_real(app, "-f", o.factor, "size step factor", 1.01, 1024);
  app.add_option("--csv", o.csv, "write every algorithm's prediction to FILE")->type_name("FILE");
  dtrain_cli::add_json(app, o.json);
  app.add_option("--png", o.png, "write a heat map of the best algorithm (needs gnuplot)")
      ->type_name("FILE");
  app.add_option("--measured", o.measured,
                 "allreduce_bench --json file(s) to compare the model with (uses each file's own "
                 "cost model unless parameters are given)")
      ->type_name("FILE");
  app.add_option("--validation-csv", o.validation_csv, "write the comparison to FILE")
      ->type_name("FILE");
  const int code = use_mpi ? dtrain_cli::run_parser_mpi(app, argc, argv)
                           : dtrain_cli::run_parser(app, argc, argv);
  if (code >= 0) return code;

  // Exactly one source of parameters, or none with --measured (each file brings its own).
  const bool given = app.count("--alpha") + app.count("--beta") + app.count("--gamma") > 0;
  const int sources = (given ? 1 : 0) + (o.params.empty() ? 0 : 1) + (o.calibrate.empty() ? 0 : 1);
  auto bad = [&](const std::string& what) {
    if (world_rank == 0) std::fprintf(stderr, "allreduce_model: %s\n", what.c_str());
    return 2;
  };
  if (sources > 1)
    return bad("give one source of parameters: --alpha/--beta/--gamma, --params or --calibrate");
  if (sources == 0 && o.measured.empty())
    return bad(
        "no parameters: give --alpha, --beta and --gamma, or --params FILE, or --calibrate "
        "mpi|loopback (see --help)");
  if (given && (app.count("--alpha") == 0 || app.count("--beta") == 0 || app.count("--gamma") == 0))
    return bad("--alpha, --beta and --gamma go together (seconds, seconds/byte, seconds/byte)");
  if ((app.count("--shm-alpha") > 0) != (app.count("--shm-beta") > 0))
    return bad("--shm-alpha and --shm-beta go together");
  if (o.ranks_max < o.ranks_min) return bad("--ranks-max must be >= --ranks-min");
  std::vector<std::size_t> sizes;
  try {
    sizes = size_grid(o);
  } catch (const CLI::ValidationError& e) {
    return bad(e.what());
  }

  Machine m;
  m.ranks_per_node = o.ranks_per_node;
  m.ranks_per_nic = o.ranks_per_nic;
  if (given) {
    m.cm.alpha = o.alpha;
    m.cm.beta = o.beta;
    m.cm.gamma = o.gamma;
    m.cm.shm_alpha = o.shm_alpha;
    m.cm.shm_beta = o.shm_beta;
    m.cm.shm_chunk = o.shm_chunk;
    m.source = "given";
  } else if (!o.params.empty()) {
    m.cm = cost_model_from(read_json(o.params), o.params);
    m.source = o.params;
  } else if (!o.calibrate.empty()) {
    int p = 0;
    m.cm = calibrate(o.calibrate, o.loopback_ranks, p);
    m.source = "calibrated, " + o.calibrate + " transport, " + std::to_string(p) + " ranks";
  }
  // Given inter-node terms override those of a file or a calibration (one machine has none).
  if (app.count("--inter-alpha")) m.cm.inter_alpha = o.inter_alpha;
  if (app.count("--inter-beta")) m.cm.inter_beta = o.inter_beta;
  if (app.count("--ranks-per-node")) o.measured_ranks_per_node = o.ranks_per_node;
  if (world_rank != 0) return 0;  // every rank calibrated; rank 0 reports
  if (!o.measured.empty()) {
    report_validation(o, validate(o, sources ? &m : nullptr));
    return 0;
  }
  print_parameters(m);
  const std::vector<int> ps = rank_grid(o);
  const std::vector<Cell> cells = project_all(m, ps, sizes);
  print_table(cells, sizes);
  if (!o.csv.empty()) write_csv(o.csv, cells);
  if (!o.json.empty()) write_json(o.json, m, cells);
  if (!o.png.empty()) write_png(o.png, cells, ps, sizes);
  std::fflush(stdout);
  return 0;
}

// MPI is started only to calibrate over it: a projection from given parameters is a plain
// program (quick to start, no launcher needed).
bool wants_mpi(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--calibrate=mpi" ||
        (a == "--calibrate" && i + 1 < argc && std::string(argv[i + 1]) == "mpi"))
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const bool use_mpi = wants_mpi(argc, argv);
  int world_rank = 0;
  if (use_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  }
  int code = 0;
  try {
    code = run(argc, argv, use_mpi, world_rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_model: %s\n", e.what());
    code = 2;
  }
  if (use_mpi) MPI_Finalize();
  return code;
}
