// Test support: DeviceLoopbackTransport, a loopback rank that takes emulated device buffers as
// they are, as a GPU-aware MPI does: device bytes move only through the device's own copies (into
// and out of a host bounce buffer, on a stream of the transport's), never by a host read or write
// of device memory (EmulatedDevice maps it PROT_NONE, so one would fault). It answers
// device_buffers() as told at construction, so that tests choose hand-over or staging, and
// counts the device bytes it sent. It waits for its copies on an event, so that the device's
// count of stream synchronisations is the library's own. Test-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/comm/transport_capabilities.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_registration.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/loopback.hpp>

namespace dtrain::test {

class DeviceLoopbackTransport {
 public:
  struct Request {
    LoopbackTransport::Request inner;
    std::vector<unsigned char> bounce;
    void* device_dst = nullptr;  // a device receive, copied in once the bounce has arrived
  };

  static constexpr bool supports_device_memory = true;
  static constexpr bool thread_safe = true;

  /// `takes_device`: the run-time answer of device_buffers().
  DeviceLoopbackTransport(LoopbackTransport& inner, EmulatedDevice& dev, bool takes_device)
      : inner_(&inner),
        dev_(&dev),
        takes_(takes_device),
        stream_(dev.create_stream()),
        copied_(dev.create_event()) {}
  ~DeviceLoopbackTransport() {
    dev_->destroy_event(copied_);
    dev_->destroy_stream(stream_);
  }
  DeviceLoopbackTransport(const DeviceLoopbackTransport&) = delete;
  DeviceLoopbackTransport& operator=(const DeviceLoopbackTransport&) = delete;

  DeviceBuffers device_buffers(Space space) const {
    if (takes_ && space == EmulatedDevice::space) return {true, "the test transport takes them"};
    return {false, "the test transport was told to refuse " + std::string(name_of(space))};
  }

  int rank() const noexcept { return inner_->rank(); }
  int size() const noexcept { return inner_->size(); }
  /// The loopback world's nodes (device IPC works within them).
  const NodeMap& node_map() const noexcept { return inner_->node_map(); }

  void isend(Request& r, int peer, int tag, const void* data, std::size_t bytes) {
    r.device_dst = nullptr;
    if (bytes && dev_->is_device(data)) {
      DTRAIN_REQUIRE(takes_, "DeviceLoopbackTransport::isend",
                     "device buffer given while the transport refuses device memory");
      r.bounce.resize(bytes);
      dev_->copy_d2h(stream_, r.bounce.data(), data, bytes);
      copied("DeviceLoopbackTransport::isend");
      device_bytes_sent_ += bytes;
      inner_->isend(r.inner, peer, tag, r.bounce.data(), bytes);
    } else {
      inner_->isend(r.inner, peer, tag, data, bytes);
    }
  }
  void irecv(Request& r, int peer, int tag, void* data, std::size_t bytes) {
    r.device_dst = nullptr;
    if (bytes && dev_->is_device(data)) {
      DTRAIN_REQUIRE(takes_, "DeviceLoopbackTransport::irecv",
                     "device buffer given while the transport refuses device memory");
      r.bounce.resize(bytes);
      r.device_dst = data;
      inner_->irecv(r.inner, peer, tag, r.bounce.data(), bytes);
    } else {
      inner_->irecv(r.inner, peer, tag, data, bytes);
    }
  }
  bool test(Request& r) { return inner_->test(r.inner) && land(r); }
  bool wait_until(Request& r, const Deadline& d) {
    return inner_->wait_until(r.inner, d) && land(r);
  }
  void cancel(Request& r) noexcept {
    inner_->cancel(r.inner);
    r.device_dst = nullptr;
  }
  MemoryRegion register_memory(void* data, std::size_t bytes, Space space) {
    return inner_->register_memory(data, bytes, space);
  }
  void deregister_memory(MemoryRegion& m) noexcept { inner_->deregister_memory(m); }

  /// Bytes of device memory sent so far.
  std::size_t device_bytes_sent() const noexcept { return device_bytes_sent_; }

 private:
  bool land(Request& r) {
    if (r.device_dst) {
      dev_->copy_h2d(stream_, r.device_dst, r.bounce.data(), r.bounce.size());
      copied("DeviceLoopbackTransport receive");
      r.device_dst = nullptr;
    }
    return true;
  }

  // The copies queued so far on the transport's stream have run.
  void copied(const char* what) {
    dev_->record(copied_, stream_);
    exec_wait(*dev_, copied_, 30, what);
  }

  LoopbackTransport* inner_;
  EmulatedDevice* dev_;
  bool takes_;
  EmulatedDevice::stream_type stream_;
  EmulatedDevice::event_type copied_;
  std::size_t device_bytes_sent_ = 0;
};

}  // namespace dtrain::test
