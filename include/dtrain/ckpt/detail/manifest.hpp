// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the in-memory form of a checkpoint (entries with paths, shapes, scalars, checksums),
// the visitors that build it from objects and apply it back, and a byte encoding used to move
// it between ranks. No file format here: see <dtrain/ckpt/hdf5.hpp>.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_copier.hpp>

namespace dtrain::detail {

/// Version of the on-disk schema described in docs/checkpoint-format.md.
inline constexpr std::int64_t checkpoint_format_version = 1;
inline constexpr const char* checkpoint_format_name = "dtrain-checkpoint";

enum class EntryKind : std::uint8_t { tensor = 0, i64 = 1, f64 = 2, str = 3 };

/// One tensor or scalar. `path` is absolute in the file: "/model/fc1/weight" for replicated
/// state, "/ranks/3/sampler/cursor" for rank 3's per-rank state.
struct CkptEntry {
  std::string path;
  EntryKind kind = EntryKind::tensor;
  DType dtype = DType::f32;
  Shape shape;
  std::uint32_t crc = 0;
  std::int64_t i64 = 0;
  double f64 = 0;
  std::string str;
  int owner = -1;                      // -1: replicated; r >= 0: per-rank state of rank r
  const void* data = nullptr;          // tensor bytes, valid on ranks that hold them
  std::vector<unsigned char> storage;  // owned bytes (snapshot, gathered or loaded)
  ExecCopier device;    // set while `data` is exec (device) memory: read it only through this
  bool staged = false;  // `data` points into a checkpointer-owned host snapshot
  // A replicated tensor of shape `whole` held in parts over the ranks (tensor_parts): until the
  // checkpointer assembles it (ckpt/detail/assemble.hpp), `shape` is {held elements} and `data`
  // this rank's `parts` back to back; afterwards `shape` is `whole` and `data` the assembled
  // tensor on rank 0 (null elsewhere).
  bool sharded = false;
  Shape whole;
  StateParts parts;

  std::size_t bytes() const { return element_count(shape) * size_of(dtype); }
  /// Points `data` at an owned copy of the current bytes.
  void take_copy() {
    if (kind != EntryKind::tensor) return;
    const std::size_t n = bytes();
    storage.resize(n);
    if (n) std::memcpy(storage.data(), data, n);
    data = storage.data();
  }
};

/// A whole checkpoint: metadata plus entries in visiting order.
struct CkptManifest {
  std::int64_t format_version = checkpoint_format_version;
  std::int64_t step = 0;
  std::int64_t world_size = 1;
  std::string library_version;
  std::string config;
  std::string strategy;
  double created_unix = 0;
  /// The identity of the run that wrote the file ("" in files written before identities).
  std::string run_id;
  /// The newest step of the run that had been sent to the run directory when this file was
  /// written (its own step when it is written or flushed there); -1: none.
  std::int64_t shared_step = -1;
  std::vector<CkptEntry> entries;
  /// Called by a writer after all tensor data is written and before checksums are stored, so
  /// that checksums may still be in the making while the data is written.
  std::function<void()> before_checksums;
  /// Where set, a serial writer does not read the data of tensors held in parts: it creates the
  /// whole tensor's dataset and calls this with the entry and a sink, which is handed the
  /// elements [first, first + count) in row-major order, run by run, to store (rank 0's write
  /// of a sharded state streamed from the ranks: no rank assembles a whole tensor).
  std::function<void(const CkptEntry&,
                     const std::function<void(std::size_t first, std::size_t count, const void*)>&)>
      write_parts;
};

inline std::string parent_path(const std::string& p) {
  const auto k = p.rfind('/');
  return k == 0 || k == std::string::npos ? std::string("/") : p.substr(0, k);
}
inline std::string leaf_name(const std::string& p) {
  const auto k = p.rfind('/');
  return k == std::string::npos ? p : p.substr(k + 1);
}

/// Throws InvalidArgument unless `name` is a relative '/'-separated path of non-empty components
/// other than "." and "..".
inline void check_state_name(const std::string& name, const char* operation) {
  bool ok = !name.empty() && name.front() != '/' && name.back() != '/' &&
            name.find("//") == std::string::npos && name.find('\0') == std::string::npos;
  if (ok) {
    std::size_t start = 0;
    while (start <= name.size()) {
      auto end = name.find('/', start);
      if (end == std::string::npos) end = name.size();
      const std::string c = name.substr(start, end - start);
      if (c == "." || c == "..") ok = false;
      start = end + 1;
    }
  }
  DTRAIN_REQUIRE(ok, operation,
                 "invalid state name '" << name
                                        << "' (use non-empty '/'-separated names without '.' or "
                                           "'..' components)");
}

// ---------------------------------------------------------------------------------------------
// Scalar conversions: the protocol stores int64, double and string; integral and floating
// members of other widths are accepted and range-checked on load.

template <class S>
inline constexpr bool is_int_scalar_v = std::is_integral_v<S> && !std::is_same_v<S, bool>;

template <class S>
EntryKind scalar_kind() {
  if constexpr (std::is_same_v<S, std::string>)
    return EntryKind::str;
  else if constexpr (std::is_floating_point_v<S>)
    return EntryKind::f64;
  else {
    static_assert(std::is_integral_v<S>,
                  "checkpoint scalars must be integers, floating point or std::string");
    return EntryKind::i64;
  }
}

inline const char* kind_name(EntryKind k) {
  switch (k) {
    case EntryKind::tensor: return "tensor";
    case EntryKind::i64: return "integer scalar";
    case EntryKind::f64: return "floating scalar";
    case EntryKind::str: return "string scalar";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Save side: walks objects and records views (no copy).

class SaveCollector {
 public:
  SaveCollector(std::vector<CkptEntry>& out, std::string prefix, int owner)
      : out_(out), prefix_(std::move(prefix)), owner_(owner) {}

  void tensor(const std::string& name, BufferView view, Shape shape) {
    add_tensor(name, view, std::move(shape), ExecCopier{});
  }
  /// An exec-memory tensor: recorded with its policy's copier; the checkpointer stages it into
  /// host memory before anything reads it.
  void tensor(const std::string& name, BufferView view, Shape shape, const ExecCopier& copier) {
    add_tensor(name, view, std::move(shape), copier);
  }
  /// A tensor of shape `whole` of which this rank holds `parts`, back to back in `held` (host
  /// memory). Replicated objects only; the checkpointer assembles the ranks' parts into one
  /// dataset, the same as the whole tensor's. Throws InvalidArgument on parts out of order,
  /// outside the tensor or not matching `held`, and in a per-rank object.
  void tensor_parts(const std::string& name, BufferView held, Shape whole,
                    const StateParts& parts) {
    const char* op = "checkpoint save";
    check_state_name(name, op);
    const std::string path = prefix_ + "/" + name;
    DTRAIN_REQUIRE(owner_ < 0, op,
                   "tensor " << path
                             << " is held in parts over the ranks; pass its object with "
                                "dtrain::named (replicated), not dtrain::per_rank");
    const std::size_t n = element_count(whole, op);
    std::size_t end = 0, total = 0;
    for (const auto& [first, count] : parts) {
      DTRAIN_REQUIRE(first >= end && first <= n && count <= n - first, op,
                     "tensor " << path << ": part [" << first << ", " << first + count
                               << ") is out of order or outside its " << n << " elements");
      end = first + count;
      total += count;
    }
    DTRAIN_REQUIRE(held.count == total, op,
                   "tensor " << path << ": the view holds " << held.count
                             << " elements but the parts cover " << total);
    DTRAIN_REQUIRE(held.space == Space::host, op,
                   "tensor " << path
                             << ": parts are read from host memory (visit them through "
                                "StateMirror::visit_parts)");
    DTRAIN_REQUIRE(total == 0 || held.data != nullptr, op,
                   "tensor " << path << " has a null data pointer");
    CkptEntry e;
    e.path = path;
    e.kind = EntryKind::tensor;
    e.dtype = held.dtype;
    e.shape = Shape{static_cast<std::int64_t>(total)};
    e.owner = owner_;
    e.data = held.data;
    e.sharded = true;
    e.whole = std::move(whole);
    e.parts = parts;
    out_.push_back(std::move(e));
  }

  template <class S>
  void scalar(const std::string& name, S& value) {
    check_state_name(name, "checkpoint save");
    CkptEntry e;
    e.path = prefix_ + "/" + name;
    e.kind = scalar_kind<std::remove_cv_t<S>>();
    e.owner = owner_;
    if constexpr (std::is_same_v<S, std::string>)
      e.str = value;
    else if constexpr (std::is_floating_point_v<S>)
      e.f64 = static_cast<double>(value);
    else {
      if constexpr (std::is_unsigned_v<S> && sizeof(S) >= 8)
        DTRAIN_REQUIRE(
            value <= static_cast<S>(std::numeric_limits<std::int64_t>::max()), "checkpoint save",
            "scalar " << e.path << " = " << value << " does not fit a signed 64-bit integer");
      e.i64 = static_cast<std::int64_t>(value);
    }
    out_.push_back(std::move(e));
  }

  template <class U>
  void child(const std::string& name, U& sub) {
    check_state_name(name, "checkpoint save");
    const std::string saved = prefix_;
    prefix_ += "/" + name;
    visit_object(*this, sub);
    prefix_ = saved;
  }

  bool loading() const { return false; }

 private:
  void add_tensor(const std::string& name, BufferView view, Shape shape, const ExecCopier& copier) {
    check_state_name(name, "checkpoint save");
    const std::string path = prefix_ + "/" + name;
    const std::size_t n = element_count(shape, "checkpoint save");
    DTRAIN_REQUIRE(view.count == n, "checkpoint save",
                   "tensor " << path << ": view holds " << view.count << " elements but shape "
                             << to_string(shape) << " needs " << n);
    if (copier)
      DTRAIN_REQUIRE(view.space == copier.space, "checkpoint save",
                     "tensor " << path << " lives in " << name_of(view.space)
                               << " memory but comes with a copier for " << name_of(copier.space)
                               << " memory");
    else
      DTRAIN_REQUIRE(view.space == Space::host, "checkpoint save",
                     "tensor " << path << " lives in " << name_of(view.space)
                               << " memory without a copier; checkpoints read host memory "
                                  "(visit it through StateMirror or stage it on the host)");
    DTRAIN_REQUIRE(n == 0 || view.data != nullptr, "checkpoint save",
                   "tensor " << path << " has a null data pointer");
    CkptEntry e;
    e.path = path;
    e.kind = EntryKind::tensor;
    e.dtype = view.dtype;
    e.shape = std::move(shape);
    e.owner = owner_;
    e.data = view.data;
    if (copier && view.space != Space::host) e.device = copier;
    out_.push_back(std::move(e));
  }

  std::vector<CkptEntry>& out_;
  std::string prefix_;
  int owner_;
};

// ---------------------------------------------------------------------------------------------
// Load side. One visitor, two modes: `check` compares names, kinds, dtypes and shapes against the
// file without touching the object (it reports loading() == false so the object only reads
// itself); `apply` writes scalars and hands each tensor to a fetch callback that fills it.

class LoadVisitor {
 public:
  enum class Mode { check, apply };
  using Index = std::map<std::string, const CkptEntry*>;
  using Fetch = void (*)(void* ctx, const CkptEntry& entry, BufferView dst);
  /// Fills `held` with this rank's `parts` of the tensor `entry` (apply mode, tensor_parts).
  using FetchParts = void (*)(void* ctx, const CkptEntry& entry, BufferView held,
                              const StateParts& parts);

  LoadVisitor(const Index& index, std::string prefix, Mode mode, Fetch fetch = nullptr,
              void* ctx = nullptr)
      : index_(index), prefix_(std::move(prefix)), mode_(mode), fetch_(fetch), ctx_(ctx) {}

  /// Apply mode: objects held in parts load only their parts, through `fetch` (loads_parts()).
  void set_parts_fetch(FetchParts fetch, void* ctx) {
    fetch_parts_ = fetch;
    parts_ctx_ = ctx;
  }
  /// Whether an object held in parts loads only its parts (visitor_loads_parts).
  bool loads_parts() const { return mode_ == Mode::apply && fetch_parts_ != nullptr; }

  /// First problem found in check mode (empty when none).
  const std::string& mismatch() const { return mismatch_; }
  /// Paths visited, in order, with shapes: all ranks must agree on it for replicated state.
  const std::string& trace() const { return trace_; }
  const std::set<std::string>& visited() const { return visited_; }

  void tensor(const std::string& name, BufferView view, Shape shape) {
    load_tensor(name, view, std::move(shape), ExecCopier{});
  }
  /// An exec-memory tensor: the bytes are fetched into host memory and uploaded through the
  /// policy's copier (blocking).
  void tensor(const std::string& name, BufferView view, Shape shape, const ExecCopier& copier) {
    load_tensor(name, view, std::move(shape), copier);
  }
  /// A tensor the object holds in parts (a sharded state). Check pass: its dtype and whole shape
  /// are checked against the file, and where the file holds this rank's parts only (a node-local
  /// part file: the entry is `sharded`), that the object holds the same parts. Apply pass (only
  /// where loads_parts()): `held` is filled with the elements of `parts`.
  void tensor_parts(const std::string& name, BufferView held, Shape whole,
                    const StateParts& parts) {
    check_state_name(name, "checkpoint restore");
    const std::string path = prefix_ + "/" + name;
    if (mode_ == Mode::apply) {
      DTRAIN_REQUIRE(fetch_parts_ != nullptr, "checkpoint restore",
                     "tensor " << path << ": this restore loads a tensor whole, not in parts");
      const auto it = index_.find(path);
      if (it != index_.end()) fetch_parts_(parts_ctx_, *it->second, held, parts);
      return;
    }
    visited_.insert(path);
    // Marked: every rank must load a tensor the same way (in parts or whole), the reads being
    // collective for some sources.
    trace_ += path + to_string(whole) + name_of(held.dtype) + "(parts);";
    if (const CkptEntry* e = find(path, EntryKind::tensor))
      if (same_layout(path, *e, held.dtype, whole) && e->sharded && e->parts != parts)
        note(path, "this rank holds other parts of it than its node-local part file (" +
                       parts_text(e->parts) + " saved, " + parts_text(parts) +
                       " held now): the run was sharded differently");
  }

  template <class S>
  void scalar(const std::string& name, S& value) {
    check_state_name(name, "checkpoint restore");
    const std::string path = prefix_ + "/" + name;
    visited_.insert(path);
    trace_ += path + ";";
    using T = std::remove_cv_t<S>;
    const CkptEntry* e = find(path, scalar_kind<T>());
    if (!e) return;
    if constexpr (std::is_same_v<T, std::string>) {
      if (mode_ == Mode::apply) value = e->str;
    } else if constexpr (std::is_floating_point_v<T>) {
      if (mode_ == Mode::apply) value = static_cast<T>(e->f64);
    } else {
      bool fits;
      if constexpr (std::is_same_v<T, bool>)
        fits = e->i64 == 0 || e->i64 == 1;
      else if constexpr (std::is_signed_v<T>)
        fits = e->i64 >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
               e->i64 <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
      else
        fits = e->i64 >= 0 && static_cast<std::uint64_t>(e->i64) <=
                                  static_cast<std::uint64_t>(std::numeric_limits<T>::max());
      if (!fits && mode_ == Mode::check)
        note(path, "value " + std::to_string(e->i64) + " does not fit the object's integer type");
      if (fits && mode_ == Mode::apply) value = static_cast<T>(e->i64);
    }
  }

  template <class U>
  void child(const std::string& name, U& sub) {
    check_state_name(name, "checkpoint restore");
    const std::string saved = prefix_;
    prefix_ += "/" + name;
    visit_object(*this, sub);
    prefix_ = saved;
  }

  bool loading() const { return mode_ == Mode::apply; }

 private:
  void load_tensor(const std::string& name, BufferView view, Shape shape,
                   const ExecCopier& copier) {
    check_state_name(name, "checkpoint restore");
    const std::string path = prefix_ + "/" + name;
    visited_.insert(path);
    trace_ += path + to_string(shape) + name_of(view.dtype) + ";";
    const CkptEntry* e = find(path, EntryKind::tensor);
    if (!e) return;
    const std::size_t n = element_count(shape, "checkpoint restore");
    if (mode_ == Mode::check) {
      if (!same_layout(path, *e, view.dtype, shape)) return;
      if (view.count != n)
        note(path, "view holds " + std::to_string(view.count) + " elements but shape " +
                       to_string(shape) + " needs " + std::to_string(n));
      else if (view.space != (copier ? copier.space : Space::host))
        note(path, std::string("tensor lives in ") + name_of(view.space) +
                       " memory; checkpoints restore into host memory or, through a copier, "
                       "into the copier's memory");
      return;
    }
    if (view.space == Space::host) {
      fetch_(ctx_, *e, view);
      return;
    }
    // Staged: the file's bytes (or the broadcast) land in host memory, then one upload.
    staging_.resize(view.bytes());
    fetch_(ctx_, *e, BufferView(staging_.data(), view.count, view.dtype));
    copier.upload(copier.exec, view.data, staging_.data(), view.bytes());
    copier.wait(copier.exec, "checkpoint restore: upload of a device tensor");
  }

  // Check mode: notes (and returns false) where the file's tensor has another dtype or shape.
  bool same_layout(const std::string& path, const CkptEntry& e, DType dtype, const Shape& shape) {
    if (e.dtype != dtype)
      note(path, std::string("dtype differs: checkpoint ") + name_of(e.dtype) + ", object " +
                     name_of(dtype));
    else if (e.shape != shape)
      note(path,
           "shape differs: checkpoint " + to_string(e.shape) + ", object " + to_string(shape));
    return e.dtype == dtype && e.shape == shape;
  }

  const CkptEntry* find(const std::string& path, EntryKind kind) {
    auto it = index_.find(path);
    if (it == index_.end()) {
      note(path, std::string(kind_name(kind)) + " not found in the checkpoint");
      return nullptr;
    }
    if (it->second->kind != kind) {
      note(path, std::string("checkpoint holds a ") + kind_name(it->second->kind) +
                     " where the object has a " + kind_name(kind));
      return nullptr;
    }
    return it->second;
  }
  void note(const std::string& path, const std::string& what) {
    if (mismatch_.empty()) mismatch_ = path + ": " + what;
  }
  static std::string parts_text(const StateParts& parts) {
    std::string s;
    for (const auto& [first, count] : parts)
      s += (s.empty() ? "[" : " [") + std::to_string(first) + ", " + std::to_string(first + count) +
           ")";
    return s.empty() ? "none" : s;
  }

  const Index& index_;
  std::string prefix_;
  Mode mode_;
  Fetch fetch_;
  void* ctx_;
  FetchParts fetch_parts_ = nullptr;
  void* parts_ctx_ = nullptr;
  std::string mismatch_;
  std::string trace_;
  std::set<std::string> visited_;
  std::vector<unsigned char> staging_;  // host side of exec-memory tensors being restored
};

// ---------------------------------------------------------------------------------------------
// Byte encoding for moving entries between ranks (little-endian host order is assumed equal on
// all ranks of one job).

class BlobWriter {
 public:
  void put_i64(std::int64_t v) { put_raw(&v, 8); }
  void put_f64(double v) { put_raw(&v, 8); }
  void put_str(const std::string& s) {
    put_i64(static_cast<std::int64_t>(s.size()));
    put_raw(s.data(), s.size());
  }
  void put_raw(const void* p, std::size_t n) {
    if (n == 0) return;  // an empty tensor's data may be null
    const auto* b = static_cast<const unsigned char*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<unsigned char>& bytes() { return buf_; }

 private:
  std::vector<unsigned char> buf_;
};

class BlobReader {
 public:
  BlobReader(const unsigned char* p, std::size_t n) : data_(p), size_(n) {}
  std::int64_t get_i64() {
    std::int64_t v;
    get_raw(&v, 8);
    return v;
  }
  double get_f64() {
    double v;
    get_raw(&v, 8);
    return v;
  }
  std::string get_str() {
    const auto n = get_i64();
    need(static_cast<std::size_t>(n));
    std::string s(reinterpret_cast<const char*>(data_ + off_), static_cast<std::size_t>(n));
    off_ += static_cast<std::size_t>(n);
    return s;
  }
  void get_raw(void* dst, std::size_t n) {
    need(n);
    if (n) std::memcpy(dst, data_ + off_, n);
    off_ += n;
  }
  bool done() const { return off_ == size_; }
  std::size_t left() const { return size_ - off_; }

 private:
  void need(std::size_t n) {
    if (n > size_ - off_) raise<Error>("checkpoint exchange", "truncated message between ranks");
  }
  const unsigned char* data_;
  std::size_t size_;
  std::size_t off_ = 0;
};

inline void encode_entry(BlobWriter& w, const CkptEntry& e, bool with_data) {
  w.put_str(e.path);
  w.put_i64(static_cast<std::int64_t>(e.kind));
  w.put_i64(static_cast<std::int64_t>(e.dtype));
  w.put_i64(static_cast<std::int64_t>(e.shape.size()));
  for (auto d : e.shape) w.put_i64(d);
  w.put_i64(static_cast<std::int64_t>(e.crc));
  w.put_i64(e.i64);
  w.put_f64(e.f64);
  w.put_str(e.str);
  w.put_i64(e.owner);
  const bool data = with_data && e.kind == EntryKind::tensor;
  w.put_i64(data ? 1 : 0);
  if (data) w.put_raw(e.data, e.bytes());
}

/// Decodes one entry written by encode_entry. The bytes come from another rank of the same job,
/// but are still checked (kind, dtype, rank, extents, size against the message) so that a
/// damaged message is an error, not an out-of-range allocation or read.
inline CkptEntry decode_entry(BlobReader& r) {
  const char* op = "checkpoint exchange";
  CkptEntry e;
  e.path = r.get_str();
  const std::int64_t kind = r.get_i64(), dtype = r.get_i64(), rank = r.get_i64();
  if (kind < 0 || kind > static_cast<std::int64_t>(EntryKind::str) || dtype < 0 ||
      dtype > static_cast<std::int64_t>(DType::i64) || rank < 0 || rank > 32)
    raise<Error>(op, "malformed entry '" + e.path + "' in a message between ranks");
  e.kind = static_cast<EntryKind>(kind);
  e.dtype = static_cast<DType>(dtype);
  e.shape.resize(static_cast<std::size_t>(rank));
  std::size_t bytes = size_of(e.dtype);
  for (auto& d : e.shape) {
    d = r.get_i64();
    if (d < 0 || (d > 0 && bytes > std::numeric_limits<std::size_t>::max() / 2 /
                                       static_cast<std::size_t>(d)))
      raise<Error>(op, "entry '" + e.path + "' has an invalid extent in a message between ranks");
    bytes *= static_cast<std::size_t>(d);
  }
  e.crc = static_cast<std::uint32_t>(r.get_i64());
  e.i64 = r.get_i64();
  e.f64 = r.get_f64();
  e.str = r.get_str();
  const std::int64_t owner = r.get_i64();
  if (owner < -1 || owner > std::numeric_limits<int>::max())
    raise<Error>(op, "entry '" + e.path + "' has an invalid owner in a message between ranks");
  e.owner = static_cast<int>(owner);
  if (r.get_i64()) {
    if (e.kind != EntryKind::tensor || bytes > r.left())
      raise<Error>(op, "truncated message between ranks (entry '" + e.path + "')");
    e.storage.resize(bytes);
    r.get_raw(e.storage.data(), e.storage.size());
    e.data = e.storage.data();
  }
  return e;
}

inline void encode_header(BlobWriter& w, const CkptManifest& m) {
  w.put_i64(m.format_version);
  w.put_i64(m.step);
  w.put_i64(m.world_size);
  w.put_str(m.library_version);
  w.put_str(m.config);
  w.put_str(m.strategy);
  w.put_f64(m.created_unix);
  w.put_str(m.run_id);
  w.put_i64(m.shared_step);
}

inline void decode_header(BlobReader& r, CkptManifest& m) {
  m.format_version = r.get_i64();
  m.step = r.get_i64();
  m.world_size = r.get_i64();
  m.library_version = r.get_str();
  m.config = r.get_str();
  m.strategy = r.get_str();
  m.created_unix = r.get_f64();
  m.run_id = r.get_str();
  m.shared_step = r.get_i64();
}

}  // namespace dtrain::detail
