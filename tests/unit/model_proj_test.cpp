// benchmarks/allreduce_model run as a user runs it: with given parameters it writes a CSV of
// every algorithm's predicted time over ranks x sizes; the test checks that table against the
// properties the model must have and against the ring formula written out independently, and
// that bad parameters end the program with exit code 2 and a message naming the problem.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct Run {
  int code = -1;
  std::string output;  // stdout and stderr together
};

std::string scratch(const std::string& name) {
  return "/tmp/dtrain_model_proj_" + std::to_string(::getpid()) + "_" + name;
}

Run run_model(const std::string& args) {
  const std::string out = scratch("out.txt");
  const std::string cmd =
      std::string(DTRAIN_ALLREDUCE_MODEL_BIN) + " " + args + " > " + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  Run r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  r.output = ss.str();
  std::remove(out.c_str());
  return r;
}

struct Row {
  int ranks;
  double bytes;
  std::string algo;
  double time_us, busbw;
  int best;
};

std::vector<Row> read_csv(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  REQUIRE(line == "ranks,bytes,algo,time_us,busbw_gbs,best");
  std::vector<Row> rows;
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string cell[6];
    for (auto& c : cell) std::getline(ss, c, ',');
    rows.push_back(Row{std::stoi(cell[0]), std::stod(cell[1]), cell[2], std::stod(cell[3]),
                       std::stod(cell[4]), std::stoi(cell[5])});
  }
  return rows;
}

const char* kGiven =
    "--alpha 2e-6 --beta 1e-10 --gamma 5e-11 --shm-alpha 1e-6 --shm-beta 3e-10 "
    "--inter-alpha 5e-6 --inter-beta 4e-11 --ranks-per-node 4 --ranks-per-nic 2";

}  // namespace

TEST_CASE("allreduce_model projects given parameters to a table with the model's properties") {
  const std::string csv = scratch("table.csv");
  const Run r = run_model(std::string(kGiven) + " --csv " + csv);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("best algorithm per (ranks, size") != std::string::npos);
  CHECK(r.output.find("  100000 ") != std::string::npos);
  const std::vector<Row> rows = read_csv(csv);
  std::remove(csv.c_str());
  REQUIRE(!rows.empty());

  std::set<int> ranks;
  std::set<double> sizes;
  std::map<std::tuple<std::string, int>, std::map<double, double>> curve;  // (algo, p) -> size -> t
  std::map<std::pair<int, double>, std::vector<const Row*>> cell;
  for (const Row& row : rows) {
    ranks.insert(row.ranks);
    sizes.insert(row.bytes);
    curve[{row.algo, row.ranks}][row.bytes] = row.time_us;
    cell[{row.ranks, row.bytes}].push_back(&row);
    // busbw as nccl-tests defines it for all-reduce, from the row's own time.
    const double busbw = row.bytes / (row.time_us * 1e-6) / 1e9 * 2.0 * (row.ranks - 1) / row.ranks;
    CHECK(row.busbw == doctest::Approx(busbw).epsilon(1e-4));
    CHECK(row.time_us > 0);
  }
  CHECK(*ranks.begin() == 2);
  CHECK(*ranks.rbegin() == 100000);
  CHECK(*sizes.begin() == 4096);
  CHECK(*sizes.rbegin() == 1024.0 * 1024 * 1024);
  CHECK(ranks.size() >= 10);
  CHECK(sizes.size() == 10);

  // For a fixed algorithm and rank count, time grows with the size.
  for (const auto& c : curve) {
    double last = 0;
    for (const auto& pt : c.second) {
      CHECK_MESSAGE(pt.second > last, std::get<0>(c.first), " at p=", std::get<1>(c.first));
      last = pt.second;
    }
  }
  // Exactly one best per cell, and its time never exceeds any algorithm's.
  for (const auto& c : cell) {
    int best = 0;
    double best_t = 0, min_t = 1e300;
    for (const Row* row : c.second) {
      best += row->best;
      if (row->best) best_t = row->time_us;
      min_t = std::min(min_t, row->time_us);
    }
    CHECK(best == 1);
    CHECK(best_t <= min_t);
  }
  // shm needs every rank on one node: present up to 4 ranks, absent beyond.
  CHECK(curve.count({"shm", 4}) == 1);
  CHECK(curve.count({"shm", 8}) == 0);
  // The hierarchical algorithms only where there are several nodes of several ranks.
  CHECK(curve.count({"hier", 4}) == 0);
  CHECK(curve.count({"hier_leader", 4}) == 0);
  CHECK(curve.count({"hier", 8}) == 1);
  CHECK(curve.count({"hier_leader", 100000}) == 1);
  // Ring inside a node: 2(p-1) alpha + 2(p-1)/p N beta + (p-1)/p N gamma. Across nodes: the
  // same with the slower link's alpha and beta, since its steps run hops inside and between
  // nodes at once (here the inter-node alpha, 5 us, and the intra-node beta, 0.1 ns/B: the NIC
  // given is faster than a message inside a node).
  const double n = 1 << 20;
  CHECK(curve[{"ring", 4}][n] ==
        doctest::Approx((6 * 2e-6 + 1.5 * n * 1e-10 + 0.75 * n * 5e-11) * 1e6).epsilon(1e-4));
  CHECK(curve[{"ring", 8}][n] ==
        doctest::Approx((14 * 5e-6 + 1.75 * n * 1e-10 + 0.875 * n * 5e-11) * 1e6).epsilon(1e-4));
}

TEST_CASE("allreduce_model reads back the parameters it wrote") {
  const std::string json = scratch("model.json"), a = scratch("a.csv"), b = scratch("b.csv");
  const Run first = run_model(
      "--alpha 3e-6 --beta 2e-10 --gamma 1e-10 --ranks-max 64 -e 1M "
      "--json " +
      json + " --csv " + a);
  INFO(first.output);
  REQUIRE(first.code == 0);
  const Run second = run_model("--params " + json + " --ranks-max 64 -e 1M --csv " + b);
  INFO(second.output);
  REQUIRE(second.code == 0);
  std::ifstream fa(a), fb(b);
  std::stringstream sa, sb;
  sa << fa.rdbuf();
  sb << fb.rdbuf();
  CHECK(sa.str() == sb.str());
  CHECK(!sa.str().empty());
  for (const auto& f : {json, a, b}) std::remove(f.c_str());
}

TEST_CASE("allreduce_model rejects bad parameters with the reason") {
  struct Bad {
    std::string args, says;
  };
  const std::string junk = scratch("junk.json");
  { std::ofstream(junk) << "{\"p\": 2, \"cost_model\": {\"alpha\": 1e-6,"; }
  const Bad cases[] = {
      {"--alpha 0 --beta 1e-10 --gamma 0", "--alpha: '0' is outside"},
      {"--alpha 1e-6 --beta -1e-10 --gamma 0", "--beta: '-1e-10' is outside"},
      {"--alpha 1e-6 --beta abc --gamma 0", "--beta: 'abc' is not a finite number"},
      {"--alpha 1e-6 --beta 1e-10", "--alpha, --beta and --gamma go together"},
      {"", "no parameters"},
      {"--alpha 1e-6 --beta 1e-10 --gamma 0 --params x.json", "one source of parameters"},
      {"--alpha 1e-6 --beta 1e-10 --gamma 0 -b 1M -e 4K", "need -b <= -e"},
      {"--alpha 1e-6 --beta 1e-10 --gamma 0 --ranks-min 64 --ranks-max 8", "--ranks-max"},
      {"--params /nonexistent/model.json", "cannot read /nonexistent/model.json"},
      {"--params " + junk, "malformed JSON"},
  };
  for (const Bad& c : cases) {
    const Run r = run_model(c.args);
    INFO("args: ", c.args, "\noutput: ", r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.says) != std::string::npos);
  }
  std::remove(junk.c_str());
}
