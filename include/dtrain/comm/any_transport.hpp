// SPDX-License-Identifier: BSD-3-Clause
// dtrain: AnyTransport, a type-erased transport for choosing MPI, loopback or another transport
// at run time behind one Communicator<AnyTransport> type.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/detect.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {

/// Wraps any transport (by reference; it must outlive the wrapper) behind virtual calls. Costs
/// one indirect call per operation; each Request allocates its underlying request once, on first
/// use, so plans (which reuse their requests) still execute without allocating. Satisfies
/// is_transport_v and forwards shared segments, the progress-thread answer, the capabilities
/// (capabilities(), run-time values of the wrapped transport's transport_capabilities),
/// persistent channels (supports_channels() says whether the wrapped transport has them), the
/// count of abandoned operations (abandoned(), 0 where the wrapped transport keeps none) and
/// what is known of a peer's process (peer_status(), unknown where the wrapped transport cannot
/// tell).
class AnyTransport {
  template <class T>
  using abandoned_call = decltype(std::size_t{std::declval<const T&>().abandoned()});
  template <class T>
  using has_abandoned = detail::is_detected<abandoned_call, T>;

  struct Iface {
    virtual ~Iface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void* new_request() = 0;
    virtual void delete_request(void* r) noexcept = 0;
    virtual void isend(void* r, int peer, int tag, const void* data, std::size_t bytes) = 0;
    virtual void irecv(void* r, int peer, int tag, void* data, std::size_t bytes) = 0;
    virtual bool test(void* r) = 0;
    virtual bool wait_until(void* r, const Deadline& d) = 0;
    virtual void cancel(void* r) noexcept = 0;
    virtual MemoryRegion register_memory(void* p, std::size_t bytes, Space s) = 0;
    virtual void deregister_memory(MemoryRegion& m) noexcept = 0;
    virtual SharedSegments* shared_segments() noexcept = 0;
    virtual SharedSegments* node_segments() noexcept = 0;
    virtual const NodeMap& node_map() const = 0;
    virtual bool allows_progress_thread() const = 0;
    virtual void progress() noexcept = 0;
    virtual TransportCapabilities capabilities() const = 0;
    virtual bool supports_channels() const = 0;
    virtual void* bind(bool send, int peer, int id, const MemoryRegion& m, std::size_t offset,
                       std::size_t bytes) = 0;
    virtual void start(void* r, void* channel) = 0;
    virtual void unbind(void* channel) noexcept = 0;
    virtual std::size_t abandoned() const noexcept = 0;
    virtual detail::PeerStatus peer_status(int peer) const noexcept = 0;
  };

  template <class T>
  struct Impl final : Iface {
    using Req = typename T::Request;
    explicit Impl(T& t) : transport_(&t), nodes_(node_map_of(t)) {}
    static Req& req(void* r) noexcept { return *static_cast<Req*>(r); }
    int rank() const override { return transport_->rank(); }
    int size() const override { return transport_->size(); }
    void* new_request() override { return new Req(); }
    void delete_request(void* r) noexcept override { delete static_cast<Req*>(r); }
    void isend(void* r, int peer, int tag, const void* data, std::size_t bytes) override {
      transport_->isend(req(r), peer, tag, data, bytes);
    }
    void irecv(void* r, int peer, int tag, void* data, std::size_t bytes) override {
      transport_->irecv(req(r), peer, tag, data, bytes);
    }
    bool test(void* r) override { return transport_->test(req(r)); }
    bool wait_until(void* r, const Deadline& d) override {
      return transport_->wait_until(req(r), d);
    }
    void cancel(void* r) noexcept override { transport_->cancel(req(r)); }
    MemoryRegion register_memory(void* p, std::size_t bytes, Space s) override {
      return transport_->register_memory(p, bytes, s);
    }
    void deregister_memory(MemoryRegion& m) noexcept override { transport_->deregister_memory(m); }
    SharedSegments* shared_segments() noexcept override { return shared_segments_of(*transport_); }
    SharedSegments* node_segments() noexcept override { return node_segments_of(*transport_); }
    const NodeMap& node_map() const override { return nodes_; }
    bool allows_progress_thread() const override {
      return detail::transport_allows_progress_thread(*transport_);
    }
    void progress() noexcept override { transport_progress(*transport_); }
    TransportCapabilities capabilities() const override { return capabilities_of(*transport_); }
    bool supports_channels() const override { return channels_available(*transport_); }
    void* bind(bool send, int peer, int id, const MemoryRegion& m, std::size_t offset,
               std::size_t bytes) override {
      if constexpr (detail::has_channels<T>::value) {
        using C = typename T::Channel;
        return new C(send ? transport_->bind_send(peer, id, m, offset, bytes)
                          : transport_->bind_recv(peer, id, m, offset, bytes));
      } else {
        raise<InvalidArgument>("AnyTransport::bind", "the wrapped transport has no channels");
      }
    }
    void start(void* r, void* channel) override {
      if constexpr (detail::has_channels<T>::value)
        transport_->start(req(r), *static_cast<typename T::Channel*>(channel));
    }
    void unbind(void* channel) noexcept override {
      if constexpr (detail::has_channels<T>::value) {
        auto* c = static_cast<typename T::Channel*>(channel);
        transport_->unbind(*c);
        delete c;
      }
    }
    std::size_t abandoned() const noexcept override {
      if constexpr (has_abandoned<T>::value)
        return transport_->abandoned();
      else
        return 0;
    }
    detail::PeerStatus peer_status(int peer) const noexcept override {
      if constexpr (detail::has_peer_status<T>::value)
        return transport_->peer_status(peer);
      else
        return {};
    }
    T* transport_;
    NodeMap nodes_;  // taken once (node_map_of may build it)
  };

 public:
  /// Handle of one operation; must not move while active (like every transport's request).
  class Request {
   public:
    Request() = default;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    ~Request() {
      if (impl_) {
        owner_->cancel(impl_);
        owner_->delete_request(impl_);
      }
    }

   private:
    friend class AnyTransport;
    void* get(Iface* owner) {
      if (!impl_) {
        impl_ = owner->new_request();
        owner_ = owner;
      }
      DTRAIN_ASSERT(owner_ == owner);
      return impl_;
    }
    void* impl_ = nullptr;
    Iface* owner_ = nullptr;
  };

  /// A bound channel of the wrapped transport (owned; unbind releases it).
  class Channel {
   public:
    Channel() = default;
    Channel(Channel&& o) noexcept : impl_(o.impl_) { o.impl_ = nullptr; }
    Channel& operator=(Channel&& o) noexcept {
      std::swap(impl_, o.impl_);
      return *this;
    }
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;

   private:
    friend class AnyTransport;
    void* impl_ = nullptr;
  };

  /// Local: wraps `t`, which must satisfy is_transport_v and outlive this object.
  template <class T, class = std::enable_if_t<!std::is_same_v<std::decay_t<T>, AnyTransport>>>
  explicit AnyTransport(T& t) : impl_(std::make_unique<Impl<T>>(t)) {
    static_assert(detail::check_transport<T>(), "AnyTransport wraps dtrain transports only");
  }

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  void isend(Request& r, int peer, int tag, const void* data, std::size_t bytes) {
    impl_->isend(r.get(impl_.get()), peer, tag, data, bytes);
  }
  void irecv(Request& r, int peer, int tag, void* data, std::size_t bytes) {
    impl_->irecv(r.get(impl_.get()), peer, tag, data, bytes);
  }
  bool test(Request& r) { return !r.impl_ || impl_->test(r.impl_); }
  bool wait_until(Request& r, const Deadline& d) {
    return !r.impl_ || impl_->wait_until(r.impl_, d);
  }
  void cancel(Request& r) noexcept {
    if (r.impl_) impl_->cancel(r.impl_);
  }
  MemoryRegion register_memory(void* p, std::size_t bytes, Space s) {
    return impl_->register_memory(p, bytes, s);
  }
  void deregister_memory(MemoryRegion& m) noexcept { impl_->deregister_memory(m); }
  SharedSegments* shared_segments() noexcept { return impl_->shared_segments(); }
  /// The wrapped transport's node-local segments and node grouping (<dtrain/comm/topology.hpp>).
  SharedSegments* node_segments() noexcept { return impl_->node_segments(); }
  const NodeMap& node_map() const { return impl_->node_map(); }
  bool allows_progress_thread() const { return impl_->allows_progress_thread(); }
  /// The wrapped transport's progress() (nothing where it has none). Local, never throws.
  void progress() noexcept { impl_->progress(); }
  /// The wrapped transport's capabilities.
  TransportCapabilities capabilities() const { return impl_->capabilities(); }
  /// Whether the wrapped transport has persistent channels (bind_* throw InvalidArgument if not).
  bool supports_channels() const { return impl_->supports_channels(); }
  Channel bind_send(int peer, int channel_id, const MemoryRegion& m, std::size_t offset,
                    std::size_t bytes) {
    Channel c;
    c.impl_ = impl_->bind(true, peer, channel_id, m, offset, bytes);
    return c;
  }
  Channel bind_recv(int peer, int channel_id, const MemoryRegion& m, std::size_t offset,
                    std::size_t bytes) {
    Channel c;
    c.impl_ = impl_->bind(false, peer, channel_id, m, offset, bytes);
    return c;
  }
  void start(Request& r, Channel& c) { impl_->start(r.get(impl_.get()), c.impl_); }
  void unbind(Channel& c) noexcept {
    if (c.impl_) impl_->unbind(c.impl_);
    c.impl_ = nullptr;
  }
  /// Local. The wrapped transport's count of operations cancel() had to release while still
  /// active (their buffers may still be accessed); 0 where it keeps no such count.
  std::size_t abandoned() const noexcept { return impl_->abandoned(); }
  /// Local, never throws. The wrapped transport's view of `peer`'s process (stopped, exited,
  /// running); PeerState::unknown where it cannot tell (detail/peer_liveness.hpp).
  detail::PeerStatus peer_status(int peer) const noexcept { return impl_->peer_status(peer); }

 private:
  std::unique_ptr<Iface> impl_;
};

static_assert(detail::check_transport<AnyTransport>(), "");
static_assert(detail::has_channels<AnyTransport>::value, "AnyTransport forwards channels");

}  // namespace dtrain
