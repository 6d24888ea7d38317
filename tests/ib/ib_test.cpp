// The verbs transport on real RDMA hardware (mpiexec -n 2 and 4): point-to-point on both
// protocol paths, every all-reduce algorithm against MPI_Allreduce, and a rank late to the
// construction (the others' setup deadline). Skipped (exit 77) with a message when
// ibv_get_device_list finds no device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/ibverbs.hpp>

#include "support/watchdog.hpp"

using namespace dtrain;

TEST_CASE("ibverbs: messages on both paths arrive intact") {
  IbverbsTransport t(MPI_COMM_WORLD);
  const int p = t.size(), r = t.rank();
  if (p < 2) return;
  const int to = (r + 1) % p, from = (r - 1 + p) % p;
  for (std::size_t n : {std::size_t{0}, std::size_t{8}, t.eager_limit(), t.eager_limit() + 1,
                        std::size_t{1} << 20, (std::size_t{64} << 20) + 3}) {
    std::vector<unsigned char> out(n), in(n, 0);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(i * 7 + r);
    IbverbsTransport::Request a, b;
    t.irecv(b, from, 5, in.data(), n);
    t.isend(a, to, 5, out.data(), n);
    REQUIRE(t.wait_until(a, Deadline(60)));
    REQUIRE(t.wait_until(b, Deadline(60)));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (in[i] != static_cast<unsigned char>(i * 7 + from)) ++bad;
    CHECK_MESSAGE(bad == 0, n << " B from rank " << from);
  }
}

TEST_CASE("ibverbs: every algorithm agrees with MPI_Allreduce") {
  IbverbsTransport t(MPI_COMM_WORLD);
  CommConfig cfg;
  cfg.timeout_s = 120;
  Communicator comm(t, cfg);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, (std::size_t{1} << 22) + 7})
    for (AllreduceAlgorithm algo :
         {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
          AllreduceAlgorithm::rd, AllreduceAlgorithm::automatic}) {
      std::vector<std::int64_t> x(n), y(n), want(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = static_cast<std::int64_t>(i % 1001) * (comm.rank() + 1);
      MPI_Allreduce(x.data(), want.data(), static_cast<int>(n), MPI_INT64_T, MPI_SUM,
                    MPI_COMM_WORLD);
      comm.allreduce(BufferView(span<std::int64_t>(x)), BufferView(span<std::int64_t>(y)),
                     ReduceOp::sum, algo);
      CHECK_MESSAGE(y == want, "n=" << n << " " << name_of(algo));
    }
}

TEST_CASE("ibverbs: a rank late to the construction: the others' setup deadline names it") {
  // The last rank comes 1.5 s late; the others wait in the bootstrap's first MPI collective. With
  // a 0.4 s deadline each waiting rank's watchdog fires once (the expiry hook records the
  // message instead of ending the job), and once the late rank arrives the transport works.
  int r = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const bool late = r == p - 1;
  test::ExpiryRecorder recorder;
  std::vector<float> x(1000), want(1000);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
  MPI_Allreduce(x.data(), want.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  {
    IbverbsTransport t(OneSidedConfig{}, MPI_COMM_WORLD, IbverbsDeviceConfig::from_env(), 0.4);
    CommConfig cfg;
    cfg.timeout_s = 120;
    Communicator comm(t, cfg);
    std::vector<float> y = x;
    comm.allreduce(BufferView(span<float>(y)), ReduceOp::sum, AllreduceAlgorithm::ring);
    CHECK(y == want);
  }
  recorder.stop();
  const std::vector<std::string> fired = recorder.messages();
  if (late || p < 2) {
    CHECK(fired.empty());
    return;
  }
  // The first wait is the duplication of the communicator; a later step may fire too where the
  // late rank's device opening takes long.
  const std::string head = "dtrain: rank " + std::to_string(r) + ": IbverbsTransport";
  REQUIRE_FALSE(fired.empty());
  CHECK(fired[0].rfind(head + ": the collective setup over the " + std::to_string(p) +
                           " ranks of its communicator did not finish within 0.4 s",
                       0) == 0);
  for (const std::string& f : fired) {
    CHECK(f.rfind(head, 0) == 0);
    CHECK(f.find("the timeout_s of IbverbsTransport") != std::string::npos);
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Every rank must agree, or some would wait in the transport's bootstrap for the others.
  int here = detail::ib_device_present() ? 1 : 0, everywhere = 0;
  MPI_Allreduce(&here, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!everywhere) {
    if (rank == 0)
      std::printf("SKIPPED: no RDMA device on %s (ibv_get_device_list found none)\n",
                  here ? "some ranks" : "this machine");
    MPI_Finalize();
    return 77;
  }
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  int code = context.run();
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
