// Checkpoints of device tensors: the HDF5 Checkpointer stages the emulated device's memory
// (tests/support/emulated_device.hpp, mapped PROT_NONE where host code sees it, so a host read
// of device memory faults) through its own host buffer with the policy's copies. A file written
// from a device model equals the file of the same state written from a host model, and each
// restores into the other policy bit for bit, over 1 and 2 loopback ranks, synchronous and
// asynchronous saves, replicated and per-rank objects; and an optimizer state held in parts, saved
// and restored into its parts.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_exec_emulated_ckpt_test {

using namespace dtrain;
using test::bytes_of;
using test::EmulatedDevice;
namespace fs = std::filesystem;

namespace {

using LoopComm = Communicator<LoopbackTransport>;
using DevModel = BasicSequential<float, EmulatedDevice>;
using DevAdamW = BasicAdamW<EmulatedDevice>;

std::vector<LayerSpec> layers() {
  return {Linear(6, 16), Gelu(), LayerNorm(16), Dropout(0.25f), Linear(16, 3)};
}

// Two AdamW steps on a fixed batch (identical on every rank, so replicas agree without a sync).
template <class Model, class Opt>
void train(Model& model, Opt& opt, int steps) {
  RngStream rng(5, 2);
  std::vector<float> x(8 * 6);
  for (auto& v : x) v = static_cast<float>(rng.uniform_double() * 4 - 2);
  std::vector<std::int32_t> y{0, 1, 2, 0, 1, 2, 1, 0};
  for (int s = 0; s < steps; ++s) {
    PassOptions o;
    o.step = s;
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), 8, Loss::softmax_cross_entropy, {}, o);
    opt.step();
  }
}

std::string run_dir(const std::string& tag, int p) {
  return (fs::temp_directory_path() / ("dtrain_emulated_ckpt_" + tag + "_" +
                                       std::to_string(::getpid()) + "_" + std::to_string(p)))
      .string();
}

// Path, dtype, shape and bytes of every tensor, and every scalar, of a checkpoint file.
std::vector<std::string> content(const std::string& file) {
  const detail::CkptManifest m = Hdf5Format::read(file);
  std::vector<std::string> out;
  for (const auto& e : m.entries) {
    std::string line = e.path + " " + std::to_string(static_cast<int>(e.kind)) + " ";
    if (e.kind == detail::EntryKind::tensor) {
      line += std::string(name_of(e.dtype)) + to_string(e.shape) + " ";
      const auto* b = static_cast<const unsigned char*>(e.data);
      line.append(reinterpret_cast<const char*>(b), e.bytes());
    } else {
      line += std::to_string(e.i64) + " " + std::to_string(e.f64) + " " + e.str;
    }
    out.push_back(line);
  }
  return out;
}

// A state type that visits a device view as if it were host memory.
struct RawDeviceState {
  BufferView view;
  template <class V>
  void visit_state(V& v) {
    v.tensor("w", view, Shape{static_cast<std::int64_t>(view.count)});
  }
};

}  // namespace

TEST_SUITE("emulated_ckpt") {
  TEST_CASE("device checkpoints equal host checkpoints and restore across policies") {
    // The host file's restore into device objects reads it distributed in the asynchronous
    // rounds, in runs of 12 bytes or more: each device tensor's staging is filled by both ranks.
    const std::size_t saved_run_bytes = detail::ckpt_run_bytes();
    detail::ckpt_run_bytes() = 12;
    for (const bool async : {false, true}) {
      for (int p : {1, 2}) {
        CAPTURE(async);
        CAPTURE(p);
        const std::string dev_dir = run_dir("dev", p), host_dir = run_dir("host", p),
                          back_dir = run_dir("back", p);
        for (const auto& d : {dev_dir, host_dir, back_dir}) fs::remove_all(d);
        std::atomic<int> failures{0};
        run_loopback(p, [&](LoopbackTransport& t) {
          try {
            LoopComm comm(t);
            const int r = comm.rank();
            CheckpointOptions o;
            o.async = async;
            // Replicated model + optimizer and a per-rank model, on the device and on the host,
            // trained identically.
            EmulatedDevice dev;
            DevModel dmodel(layers(), dev), dlocal(layers(), dev);
            dmodel.init(3);
            dlocal.init(100 + static_cast<std::uint64_t>(r));
            DevAdamW dopt(dmodel, 0.01);
            train(dmodel, dopt, 2);
            Sequential hmodel(layers()), hlocal(layers());
            hmodel.init(3);
            hlocal.init(100 + static_cast<std::uint64_t>(r));
            AdamW hopt(hmodel, 0.01);
            train(hmodel, hopt, 2);
            REQUIRE(bytes_of(dev, dmodel.parameters()) == bytes_of(hmodel.parameters()));
            {
              Checkpointer<LoopComm> dc(comm, dev_dir, o), hc(comm, host_dir, o);
              dc.save(2, named("model", dmodel), named("optimizer", dopt),
                      per_rank("local", dlocal));
              hc.save(2, named("model", hmodel), named("optimizer", hopt),
                      per_rank("local", hlocal));
              dc.wait();
              hc.wait();
            }
            // Same file format: the same entries with the same bytes.
            if (r == 0) {
              const auto a = content(dev_dir + "/ckpt-000000000002.h5");
              const auto b = content(host_dir + "/ckpt-000000000002.h5");
              CHECK(a.size() > 5);
              CHECK(a == b);
            }
            // Device file -> host objects.
            Sequential h2(layers()), h2local(layers());
            AdamW h2opt(h2, 0.01);
            Checkpointer<LoopComm> dc(comm, dev_dir, o);
            CHECK(dc.restore_latest(named("model", h2), named("optimizer", h2opt),
                                    per_rank("local", h2local)) == std::optional<std::int64_t>(2));
            CHECK(bytes_of(h2.parameters()) == bytes_of(dev, dmodel.parameters()));
            CHECK(bytes_of(h2opt.exp_avg()) == bytes_of(dev, dopt.exp_avg()));
            CHECK(bytes_of(h2opt.exp_avg_sq()) == bytes_of(dev, dopt.exp_avg_sq()));
            CHECK(bytes_of(h2local.parameters()) == bytes_of(dev, dlocal.parameters()));
            CHECK(h2opt.step_count() == 2);
            // Host file -> fresh device objects (their memory starts as NaN patterns).
            EmulatedDevice dev2;
            DevModel d2(layers(), dev2), d2local(layers(), dev2);
            DevAdamW d2opt(d2, 0.01);
            CheckpointOptions ho = o;
            ho.restore = async ? RestoreStrategy::distributed : RestoreStrategy::rank0;
            Checkpointer<LoopComm> hc(comm, host_dir, ho);
            CHECK(hc.restore_latest(named("model", d2), named("optimizer", d2opt),
                                    per_rank("local", d2local)) == std::optional<std::int64_t>(2));
            CHECK(bytes_of(dev2, d2.parameters()) == bytes_of(hmodel.parameters()));
            CHECK(bytes_of(dev2, d2opt.exp_avg()) == bytes_of(hopt.exp_avg()));
            CHECK(bytes_of(dev2, d2opt.exp_avg_sq()) == bytes_of(hopt.exp_avg_sq()));
            CHECK(bytes_of(dev2, d2local.parameters()) == bytes_of(hlocal.parameters()));
            CHECK(d2.step_count() == hmodel.step_count());
            // Training goes on identically from the restored device state.
            train(d2, d2opt, 1);
            train(hmodel, hopt, 1);
            CHECK(bytes_of(dev2, d2.parameters()) == bytes_of(hmodel.parameters()));
            // Saving again reuses the staging buffer (a second save of changed state).
            Checkpointer<LoopComm> bc(comm, back_dir, o);
            bc.save(3, named("model", d2), named("optimizer", d2opt), per_rank("local", d2local));
            bc.save(4, named("model", d2), named("optimizer", d2opt), per_rank("local", d2local));
            bc.wait();
            Sequential h3(layers()), h3local(layers());
            AdamW h3opt(h3, 0.01);
            CHECK(bc.restore_latest(named("model", h3), named("optimizer", h3opt),
                                    per_rank("local", h3local)) == std::optional<std::int64_t>(4));
            CHECK(bytes_of(h3.parameters()) == bytes_of(hmodel.parameters()));
            CHECK(bytes_of(h3opt.exp_avg_sq()) == bytes_of(hopt.exp_avg_sq()));
          } catch (const std::exception& e) {
            MESSAGE(e.what());
            ++failures;
          }
        });
        CHECK(failures.load() == 0);
        for (const auto& d : {dev_dir, host_dir, back_dir}) fs::remove_all(d);
      }
    }
    detail::ckpt_run_bytes() = saved_run_bytes;
  }

  TEST_CASE("a device tensor visited without its policy's copier is refused, not read") {
    // RawDeviceState hands the checkpointer a raw device view: the host must not read it.
    const std::string dir = run_dir("raw", 1);
    fs::remove_all(dir);
    run_loopback(1, [&](LoopbackTransport& t) {
      LoopComm comm(t);
      EmulatedDevice dev;
      Tensor w({4}, DType::f32, dev.allocator());
      RawDeviceState s{w.view()};
      Checkpointer<LoopComm> c(comm, dir);
      try {
        c.save(1, named("raw", s));
        FAIL("the save accepted a device tensor without a copier");
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        CHECK(what.find("/raw/w") != std::string::npos);
        CHECK(what.find("cuda memory") != std::string::npos);
      }
      CHECK(c.files().empty());
    });
    fs::remove_all(dir);
  }

  TEST_CASE("a device optimizer state held in parts saves the host whole state's file") {
    // Two ranks train identical replicas; each keeps its own parts of the AdamW moments on the
    // device (as after sharded steps), rank 0 two of them. The checkpointer downloads each
    // rank's parts and assembles them: the file equals the host optimizer's whole state's.
    const std::string dev_dir = run_dir("parts_dev", 2), host_dir = run_dir("parts_host", 2);
    for (const auto& d : {dev_dir, host_dir}) fs::remove_all(d);
    std::atomic<int> failures{0};
    run_loopback(2, [&](LoopbackTransport& t) {
      try {
        LoopComm comm(t);
        EmulatedDevice dev;
        DevModel dmodel(layers(), dev);
        dmodel.init(3);
        DevAdamW dopt(dmodel, 0.01);
        train(dmodel, dopt, 2);
        Sequential hmodel(layers());
        hmodel.init(3);
        AdamW hopt(hmodel, 0.01);
        train(hmodel, hopt, 2);
        const std::size_t n = dmodel.parameters().count, a = n / 5, b = n / 2;
        const StateParts mine =
            comm.rank() == 0 ? StateParts{{0, a}, {b, n - b}} : StateParts{{a, b - a}};
        dopt.shard_state(mine);
        REQUIRE(dopt.state_elements() < n);
        Checkpointer<LoopComm>(comm, dev_dir).save(2, named("optimizer", dopt));
        Checkpointer<LoopComm>(comm, host_dir).save(2, named("optimizer", hopt));
        CHECK(dopt.state_elements() < n);  // still held in parts
        // Restored into a device optimizer sharded over the same parts: it loads those parts
        // (each moment whole on the device only while it loads), the saved ones' bits.
        DevAdamW back(dmodel, 0.01);
        back.shard_state(mine);
        REQUIRE(Checkpointer<LoopComm>(comm, dev_dir).restore_latest(named("optimizer", back)) ==
                std::optional<std::int64_t>(2));
        CHECK(back.state_elements() == dopt.state_elements());
        CHECK(back.step_count() == dopt.step_count());
        CHECK(bytes_of(dev, back.exp_avg()) == bytes_of(dev, dopt.exp_avg()));
        CHECK(bytes_of(dev, back.exp_avg_sq()) == bytes_of(dev, dopt.exp_avg_sq()));
      } catch (...) {
        ++failures;
        throw;
      }
    });
    REQUIRE(failures == 0);
    const auto dev_file = content(dev_dir + "/ckpt-000000000002.h5");
    CHECK(dev_file.size() >= 3u);  // exp_avg, exp_avg_sq, step, the schedule
    CHECK(dev_file == content(host_dir + "/ckpt-000000000002.h5"));
    for (const auto& d : {dev_dir, host_dir}) fs::remove_all(d);
  }
}

}  // namespace dtrain_test_exec_emulated_ckpt_test
