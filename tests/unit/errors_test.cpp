// Deliberately wrong calls through the public API give a dtrain error whose message names the
// calling rank and the operation.
#include <doctest/doctest.h>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/transports/loopback.hpp>

#include "support/messages.hpp"

#include <string>
#include <vector>

using namespace dtrain;

using test::invalid_argument_text;

TEST_CASE("wrong calls name the rank and the operation") {
  constexpr int p = 3;
  std::vector<std::vector<std::string>> msgs(p);
  run_loopback(p, [&](LoopbackTransport& t) {
    Communicator comm(t);
    std::vector<float> buf(4, 1.0f);
    auto& m = msgs[static_cast<std::size_t>(comm.rank())];
    // Broadcast from a rank that does not exist: refused before any message moves.
    m.push_back(invalid_argument_text(
        [&] { comm.broadcast(BufferView(buf.data(), buf.size(), DType::f32), 7); }));
    // A float buffer read as doubles.
    m.push_back(invalid_argument_text(
        [&] { (void)BufferView(buf.data(), buf.size(), DType::f32).as<double>("allreduce"); }));
    // A sampler for a rank outside the world.
    m.push_back(invalid_argument_text([&] { DistributedSampler s(10, 5, comm.size(), 1); }));
  });
  for (int r = 0; r < p; ++r) {
    const auto& m = msgs[static_cast<std::size_t>(r)];
    REQUIRE(m.size() == 3);
    const std::string prefix = "dtrain: rank " + std::to_string(r) + ": ";
    INFO(m[0] << "\n" << m[1] << "\n" << m[2]);
    CHECK(m[0].rfind(prefix + "broadcast", 0) == 0);
    CHECK(m[0].find("root 7") != std::string::npos);
    CHECK(m[1].rfind(prefix + "allreduce", 0) == 0);
    CHECK(m[1].find("f64") != std::string::npos);
    CHECK(m[2].rfind(prefix + "DistributedSampler", 0) == 0);
    CHECK(m[2].find("rank 5") != std::string::npos);
  }
}
