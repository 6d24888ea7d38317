// SPDX-License-Identifier: BSD-3-Clause
// dtrain's C API (bindings/c/dtrain.h) over dtrain::ConfiguredRun. Compiled into the caller's
// program (CMake component `c`). Every entry point runs its body through `guard`, which turns any
// exception into a status and a message kept for the calling thread and the run.
//
// Runs on a GPU (dtrain_create_on) need a device policy, found when this file is compiled:
// - DTRAIN_C_DEVICE_POLICY_HEADER names a header (a test's emulated device) that defines, in
//   namespace dtrain_c_device: `using Policy` (an execution policy), `Policy& policy(int device)`
//   (the process's policy of that device, made on first use; InvalidArgument for one that does
//   not exist), `bool is_device_memory(const void*)` and `const char* const name`;
// - else, compiled by nvcc or hipcc, GpuExec (one per device, kept for the whole process);
// - else none: every run is on the host, and nothing can tell a device pointer.
#include "dtrain.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <dtrain/config/configured_run.hpp>

#if defined(DTRAIN_C_DEVICE_POLICY_HEADER)
#include DTRAIN_C_DEVICE_POLICY_HEADER
#define DTRAIN_C_DEVICE 1
#elif defined(__CUDACC__) || defined(__HIPCC__)
#include <map>

#include <dtrain/kernels/gpu_exec.cuh>
#define DTRAIN_C_DEVICE 1
namespace dtrain_c_device {
using Policy = dtrain::GpuExec;
const char* const name = dtrain::gpu::vendor;
Policy& policy(int device) {
  static std::mutex mutex;
  // Never destroyed: a policy outlives every run on it, and a vendor runtime may be gone at exit.
  static auto* all = new std::map<int, Policy*>();
  std::lock_guard<std::mutex> lock(mutex);
  const int n = dtrain::gpu::device_count();
  DTRAIN_REQUIRE(device >= 0 && device < n, "dtrain_create_on",
                 "device " << device << " but this rank sees " << n << " " << name << " device(s)");
  Policy*& p = (*all)[device];
  if (!p) p = new Policy(device);
  return *p;
}
bool is_device_memory(const void* p) { return dtrain::gpu::is_device_pointer(p); }
}  // namespace dtrain_c_device
#endif

namespace {

using dtrain::ConfiguredRun;

// Runs by id. Ids only grow, so an id below next_id that is not in the table was closed.
struct Registry {
  std::mutex mutex;
  std::unordered_map<std::int64_t, std::shared_ptr<ConfiguredRun>> runs;
  std::unordered_map<std::int64_t, int> devices;  // DTRAIN_HOST or the GPU of each live run
  std::int64_t next_id = 1;
};
Registry& registry() {
  static Registry r;
  return r;
}

// This thread's messages: one per run id, and one for calls that named no valid run.
struct Messages {
  std::unordered_map<std::int64_t, std::string> by_run;
  std::string unattached;
};
Messages& messages() {
  thread_local Messages m;
  return m;
}

// A failure found by this layer, with its status (the C++ library's errors carry theirs by type).
struct CError {
  int status;
  std::string message;
};

int world_rank() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  int r = -1;
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

[[noreturn]] void fail(int status, const char* op, const std::string& why, int rank = -2) {
  if (rank == -2)
    rank = dtrain::detail::thread_rank() >= 0 ? dtrain::detail::thread_rank() : world_rank();
  throw CError{status, dtrain::detail::format_message(rank, op, why)};
}

std::shared_ptr<ConfiguredRun> find(dtrain_run run, const char* op) {
  if (run.id == 0) fail(DTRAIN_ERR_CLOSED, op, "the run handle is 0 (never created, or closed)");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.runs.find(run.id);
  if (it != r.runs.end()) return it->second;
  if (run.id > 0 && run.id < r.next_id)
    fail(DTRAIN_ERR_CLOSED, op, "run " + std::to_string(run.id) + " was closed");
  fail(DTRAIN_ERR_CLOSED, op, "run " + std::to_string(run.id) + " does not exist");
}

void record(std::int64_t id, bool attached, std::string message) {
  Messages& m = messages();
  if (attached)
    m.by_run[id] = std::move(message);
  else
    m.unattached = std::move(message);
}

// Runs `body`; on any exception records the message (for run `id` when it names a live or
// closed run) and returns the status. Never throws.
template <class F>
int guard(const char* op, std::int64_t id, F&& body) noexcept {
  bool attached = false;
  try {
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      attached = id > 0 && id < r.next_id;
    }
    body();
    return DTRAIN_OK;
  } catch (const CError& e) {
    record(id, attached, e.message);
    return e.status;
  } catch (const std::bad_alloc&) {
    try {
      record(id, attached,
             dtrain::detail::format_message(world_rank(), op, "out of memory (std::bad_alloc)"));
    } catch (...) {
    }
    return DTRAIN_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    int status = DTRAIN_ERR_INTERNAL;
    if (dynamic_cast<const dtrain::InvalidArgument*>(&e))
      status = DTRAIN_ERR_INVALID_ARGUMENT;
    else if (dynamic_cast<const dtrain::IoError*>(&e))
      status = DTRAIN_ERR_IO;
    else if (dynamic_cast<const dtrain::TransportError*>(&e))
      status = DTRAIN_ERR_TRANSPORT;
    else if (dynamic_cast<const dtrain::RemoteError*>(&e))
      status = DTRAIN_ERR_REMOTE;
    else if (dynamic_cast<const dtrain::TimeoutError*>(&e))
      status = DTRAIN_ERR_TIMEOUT;
    else if (dynamic_cast<const dtrain::DeviceError*>(&e))
      status = DTRAIN_ERR_DEVICE;
    try {
      std::string m = e.what();
      // The library's own errors already say rank and operation; others get them here.
      if (!dynamic_cast<const dtrain::Error*>(&e))
        m = dtrain::detail::format_message(world_rank(), op, m);
      record(id, attached, std::move(m));
    } catch (...) {
    }
    return status;
  } catch (...) {
    try {
      record(id, attached, dtrain::detail::format_message(world_rank(), op, "unknown exception"));
    } catch (...) {
    }
    return DTRAIN_ERR_INTERNAL;
  }
}

void need(const void* p, const char* op, const char* what) {
  if (!p) fail(DTRAIN_ERR_INVALID_ARGUMENT, op, std::string(what) + " is null");
}

std::string shape_text(const std::int64_t* shape, int ndim) {
  std::ostringstream os;
  os << "{";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "}";
  return os.str();
}

const char* dtype_text(int t) {
  switch (t) {
    case DTRAIN_F32: return "F32";
    case DTRAIN_F64: return "F64";
    case DTRAIN_I32: return "I32";
    default: return "unknown";
  }
}

// One caller array checked against the elements a sample must have: returns the batch (shape[0]).
// Accepted: {b, sample shape...} exactly, or {b, product} (flattened), or {b} for samples of one
// element.
std::int64_t check_array(const char* op, const char* name, const void* data, int dtype, int ndim,
                         const std::int64_t* shape, const dtrain::Shape& sample, bool labels_ok) {
  need(shape, op, (std::string(name) + "'s shape").c_str());
  if (!(dtype == DTRAIN_F32 || dtype == DTRAIN_F64 || (labels_ok && dtype == DTRAIN_I32)))
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         std::string(name) + " has element type " + dtype_text(dtype) +
             (labels_ok ? " (expected F32, F64 or I32)" : " (expected F32 or F64)"));
  if (ndim < 1 || ndim > DTRAIN_MAX_DIMS)
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         std::string(name) + " has " + std::to_string(ndim) + " axes (expected 1 to " +
             std::to_string(DTRAIN_MAX_DIMS) + ")");
  for (int i = 0; i < ndim; ++i)
    if (shape[i] < 0)
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           std::string(name) + " has a negative extent: shape " + shape_text(shape, ndim));
  std::int64_t elements = 1;
  for (auto d : sample) elements *= d;
  std::int64_t got = 1;
  for (int i = 1; i < ndim; ++i) got *= shape[i];
  bool ok = false;
  if (dtype == DTRAIN_I32) {
    ok = ndim == 1 || (ndim == 2 && shape[1] == 1);
  } else if (ndim - 1 == static_cast<int>(sample.size())) {
    ok = std::equal(sample.begin(), sample.end(), shape + 1);
  } else {
    ok = got == elements && (ndim == 2 || (ndim == 1 && elements == 1));
  }
  if (!ok) {
    std::ostringstream os;
    os << name << " has shape " << shape_text(shape, ndim) << " (C order, batch first); expected "
       << (dtype == DTRAIN_I32 ? "{batch} of class labels" : "{batch");
    if (dtype != DTRAIN_I32) {
      for (auto d : sample) os << ", " << d;
      os << "} or {batch, " << elements << "}";
    }
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op, os.str());
  }
  if (shape[0] == 0)
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op, std::string(name) + " holds no samples (batch 0)");
  need(data, op, name);
  return shape[0];
}

// x and targets of a step, evaluation or store: both checked, same batch.
std::int64_t check_pair(const char* op, ConfiguredRun& run, const void* x, int xt, int xn,
                        const std::int64_t* xs, const void* t, int tt, int tn,
                        const std::int64_t* ts, bool labels_ok, const char* tname = "targets") {
  const std::int64_t b = check_array(op, "x", x, xt, xn, xs, run.input_shape(), false);
  const std::int64_t bt = check_array(op, tname, t, tt, tn, ts, run.output_shape(), labels_ok);
  if (b != bt)
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         "x holds " + std::to_string(b) + " samples but " + tname + " " + std::to_string(bt));
  return b;
}

// Arrays whose memory the build's device policy can tell: a host call refuses device memory, a
// _device call host memory. Without a device policy nothing is known (and every run is a host
// run, which the _device calls refuse).
void host_array(const char* op, const char* name, const void* p, const char* hint) {
#if defined(DTRAIN_C_DEVICE)
  if (p && dtrain_c_device::is_device_memory(p))
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         std::string(name) + " is " + dtrain_c_device::name + " device memory, but " + op +
             " takes host arrays (" + hint + ")");
#else
  (void)op, (void)name, (void)p, (void)hint;
#endif
}
constexpr const char* to_train_device =
    "device arrays go to dtrain_train_step_device on a run made by dtrain_create_on on a device";
constexpr const char* to_predict_device =
    "device arrays go to dtrain_predict_device on a run made by dtrain_create_on on a device";
void device_array(const char* op, const char* name, const void* p, const char* host_op) {
#if defined(DTRAIN_C_DEVICE)
  if (p && !dtrain_c_device::is_device_memory(p))
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         std::string(name) + " is not " + dtrain_c_device::name + " device memory, but " + op +
             " reads device arrays (host arrays go to " + host_op + ")");
#else
  (void)op, (void)name, (void)p, (void)host_op;
#endif
}

// The run of a _device call: one made on a device.
void need_device_run(const char* op, dtrain_run run, const ConfiguredRun& p) {
  if (!p.on_device())
    fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
         "run " + std::to_string(run.id) +
             " is on the host (dtrain_create, or dtrain_create_on with DTRAIN_HOST): device "
             "arrays need a run made by dtrain_create_on with a device");
}

int create(const char* op, MPI_Comm comm, const char* config_path, int device, dtrain_run* run) {
  if (run) run->id = 0;
  return guard(op, 0, [&] {
    need(run, op, "the run pointer");
    need(config_path, op, "the configuration path");
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           fin ? "MPI is finalised" : "MPI is not initialised (call MPI_Init first)", -1);
    if (comm == MPI_COMM_NULL) fail(DTRAIN_ERR_INVALID_ARGUMENT, op, "the communicator is null");
    if (device < DTRAIN_HOST)
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           "device " + std::to_string(device) + " (DTRAIN_HOST or a GPU ordinal from 0)");
    std::shared_ptr<ConfiguredRun> made;
    if (device == DTRAIN_HOST) {
      made = std::make_shared<ConfiguredRun>(comm, std::string(config_path));
    } else {
#if defined(DTRAIN_C_DEVICE)
      made = std::make_shared<ConfiguredRun>(comm, dtrain::read_run_config(config_path),
                                             dtrain_c_device::policy(device));
#else
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           "device " + std::to_string(device) +
               " asked for, but this build of the C API has no device policy (compile "
               "bindings/c/dtrain_c.cpp with nvcc or hipcc for GPU runs)");
#endif
    }
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    run->id = r.next_id++;
    r.runs.emplace(run->id, std::move(made));
    r.devices.emplace(run->id, device);
  });
}

template <class F>
auto with_x(int dtype, const void* p, F&& f) {
  return dtype == DTRAIN_F32 ? f(static_cast<const float*>(p)) : f(static_cast<const double*>(p));
}
template <class F>
auto with_target(int dtype, const void* p, F&& f) {
  if (dtype == DTRAIN_I32) return f(static_cast<const std::int32_t*>(p));
  return dtype == DTRAIN_F32 ? f(static_cast<const float*>(p)) : f(static_cast<const double*>(p));
}

}  // namespace

extern "C" {

int dtrain_create(MPI_Comm comm, const char* config_path, dtrain_run* run) {
  return create("dtrain_create", comm, config_path, DTRAIN_HOST, run);
}

int dtrain_create_f(MPI_Fint comm, const char* config_path, dtrain_run* run) {
  return dtrain_create(MPI_Comm_f2c(comm), config_path, run);
}

int dtrain_create_on(MPI_Comm comm, const char* config_path, int device, dtrain_run* run) {
  return create("dtrain_create_on", comm, config_path, device, run);
}

int dtrain_create_on_f(MPI_Fint comm, const char* config_path, int device, dtrain_run* run) {
  return dtrain_create_on(MPI_Comm_f2c(comm), config_path, device, run);
}

int dtrain_device(dtrain_run run, int* device) {
  const char* op = "dtrain_device";
  return guard(op, run.id, [&] {
    need(device, op, "device");
    find(run, op);
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    *device = r.devices.at(run.id);
  });
}

int dtrain_close(dtrain_run* run) {
  const char* op = "dtrain_close";
  return guard(op, run ? run->id : 0, [&] {
    need(run, op, "the run pointer");
    if (run->id == 0) return;
    auto p = find(*run, op);
    p->wait_checkpoints();
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.runs.erase(run->id);
      r.devices.erase(run->id);
    }
    run->id = 0;
    p.reset();  // the last reference: the run is destroyed here, after the wait
  });
}

const char* dtrain_last_error(dtrain_run run) {
  try {
    Messages& m = messages();
    auto it = m.by_run.find(run.id);
    if (run.id != 0 && it != m.by_run.end()) return it->second.c_str();
    return m.unattached.c_str();
  } catch (...) {
    return "";
  }
}

int dtrain_copy_last_error(dtrain_run run, char* buf, size_t size, size_t* length) {
  const char* m = dtrain_last_error(run);
  const std::size_t n = std::strlen(m);
  if (length) *length = n;
  if (buf && size > 0) {
    const std::size_t k = n < size - 1 ? n : size - 1;
    std::memcpy(buf, m, k);
    buf[k] = '\0';
  }
  return DTRAIN_OK;
}

int dtrain_input_size(dtrain_run run, int64_t* elements) {
  return guard("dtrain_input_size", run.id, [&] {
    need(elements, "dtrain_input_size", "elements");
    *elements = find(run, "dtrain_input_size")->in_features();
  });
}
int dtrain_output_size(dtrain_run run, int64_t* elements) {
  return guard("dtrain_output_size", run.id, [&] {
    need(elements, "dtrain_output_size", "elements");
    *elements = find(run, "dtrain_output_size")->out_features();
  });
}
int dtrain_model_dtype(dtrain_run run, int* dtype) {
  return guard("dtrain_model_dtype", run.id, [&] {
    need(dtype, "dtrain_model_dtype", "dtype");
    *dtype =
        find(run, "dtrain_model_dtype")->dtype() == dtrain::DType::f64 ? DTRAIN_F64 : DTRAIN_F32;
  });
}
int dtrain_step(dtrain_run run, int64_t* step) {
  return guard("dtrain_step", run.id, [&] {
    need(step, "dtrain_step", "step");
    *step = find(run, "dtrain_step")->step();
  });
}
int dtrain_parameter_count(dtrain_run run, int64_t* count) {
  return guard("dtrain_parameter_count", run.id, [&] {
    need(count, "dtrain_parameter_count", "count");
    *count = static_cast<int64_t>(find(run, "dtrain_parameter_count")->parameter_count());
  });
}
int dtrain_rank(dtrain_run run, int* rank, int* size) {
  return guard("dtrain_rank", run.id, [&] {
    auto p = find(run, "dtrain_rank");
    if (rank) *rank = p->rank();
    if (size) *size = p->size();
  });
}

int dtrain_train_step(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                      const int64_t* x_shape, const void* targets, int t_dtype, int t_ndim,
                      const int64_t* t_shape, double* loss) {
  const char* op = "dtrain_train_step";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, targets, t_dtype, t_ndim, t_shape, true);
    host_array(op, "x", x, to_train_device);
    host_array(op, "targets", targets, to_train_device);
    const double l = with_x(x_dtype, x, [&](auto xp) {
      return with_target(t_dtype, targets, [&](auto tp) { return p->train_step(xp, tp, b); });
    });
    if (loss) *loss = l;
  });
}

int dtrain_train_step_device(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                             const int64_t* x_shape, const void* targets, int t_dtype, int t_ndim,
                             const int64_t* t_shape, double* loss) {
  const char* op = "dtrain_train_step_device";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    need_device_run(op, run, *p);
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, targets, t_dtype, t_ndim, t_shape, true);
    device_array(op, "x", x, "dtrain_train_step");
    device_array(op, "targets", targets, "dtrain_train_step");
    const double l = with_x(x_dtype, x, [&](auto xp) {
      return with_target(t_dtype, targets,
                         [&](auto tp) { return p->train_step_device(xp, tp, b); });
    });
    if (loss) *loss = l;
  });
}

int dtrain_predict(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                   void* y, int y_dtype, int y_ndim, const int64_t* y_shape) {
  const char* op = "dtrain_predict";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, y, y_dtype, y_ndim, y_shape, false, "y");
    host_array(op, "x", x, to_predict_device);
    host_array(op, "y", y, to_predict_device);
    with_x(x_dtype, x, [&](auto xp) {
      if (y_dtype == DTRAIN_F32)
        p->predict(xp, static_cast<float*>(y), b);
      else
        p->predict(xp, static_cast<double*>(y), b);
      return 0;
    });
  });
}

int dtrain_predict_device(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                          const int64_t* x_shape, void* y, int y_dtype, int y_ndim,
                          const int64_t* y_shape) {
  const char* op = "dtrain_predict_device";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    need_device_run(op, run, *p);
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, y, y_dtype, y_ndim, y_shape, false, "y");
    device_array(op, "x", x, "dtrain_predict");
    device_array(op, "y", y, "dtrain_predict");
    with_x(x_dtype, x, [&](auto xp) {
      if (y_dtype == DTRAIN_F32)
        p->predict_device(xp, static_cast<float*>(y), b);
      else
        p->predict_device(xp, static_cast<double*>(y), b);
      return 0;
    });
  });
}

int dtrain_evaluate(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                    const void* targets, int t_dtype, int t_ndim, const int64_t* t_shape,
                    double* loss, double* accuracy) {
  const char* op = "dtrain_evaluate";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, targets, t_dtype, t_ndim, t_shape, true);
    host_array(op, "x", x, to_train_device);
    host_array(op, "targets", targets, to_train_device);
    const auto e = with_x(x_dtype, x, [&](auto xp) {
      return with_target(t_dtype, targets, [&](auto tp) { return p->evaluate(xp, tp, b); });
    });
    if (loss) *loss = e.loss;
    if (accuracy) *accuracy = e.accuracy;
  });
}

int dtrain_copy_parameters(dtrain_run run, void* out, int dtype, int64_t count) {
  const char* op = "dtrain_copy_parameters";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    need(out, op, "out");
    host_array(op, "out", out, "the parameters are copied to host memory");
    if (dtype != DTRAIN_F32 && dtype != DTRAIN_F64)
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           std::string("element type ") + dtype_text(dtype) + " (expected F32 or F64)");
    if (count != static_cast<int64_t>(p->parameter_count()))
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           "count " + std::to_string(count) + " but the model has " +
               std::to_string(p->parameter_count()) + " parameters");
    if (dtype == DTRAIN_F32)
      p->copy_parameters(static_cast<float*>(out));
    else
      p->copy_parameters(static_cast<double*>(out));
  });
}

int dtrain_save(dtrain_run run) {
  return guard("dtrain_save", run.id, [&] { find(run, "dtrain_save")->save(); });
}
int dtrain_maybe_save(dtrain_run run, int* saved) {
  return guard("dtrain_maybe_save", run.id, [&] {
    const bool s = find(run, "dtrain_maybe_save")->maybe_save();
    if (saved) *saved = s ? 1 : 0;
  });
}
int dtrain_restore_latest(dtrain_run run, int64_t* step) {
  return guard("dtrain_restore_latest", run.id, [&] {
    const auto s = find(run, "dtrain_restore_latest")->restore_latest();
    if (step) *step = s ? *s : -1;
  });
}
int dtrain_wait_checkpoints(dtrain_run run) {
  return guard("dtrain_wait_checkpoints", run.id,
               [&] { find(run, "dtrain_wait_checkpoints")->wait_checkpoints(); });
}

int dtrain_checkpoint_array(dtrain_run run, const char* name, void* data, int dtype,
                            int64_t count) {
  const char* op = "dtrain_checkpoint_array";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    need(name, op, "name");
    need(data, op, "data");
    host_array(op, "data", data, "checkpoints hold host arrays");
    if (dtype == DTRAIN_F32)
      p->checkpoint_array(name, static_cast<float*>(data), count);
    else if (dtype == DTRAIN_F64)
      p->checkpoint_array(name, static_cast<double*>(data), count);
    else if (dtype == DTRAIN_I32)
      p->checkpoint_array(name, static_cast<std::int32_t*>(data), count);
    else
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           std::string("'") + name + "': element type " + dtype_text(dtype) +
               " (expected F32, F64 or I32)");
  });
}

int dtrain_store_open(dtrain_run run, int64_t capacity, int eviction, int normalise) {
  const char* op = "dtrain_store_open";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    if (eviction != DTRAIN_EVICT_OLDEST && eviction != DTRAIN_EVICT_RESERVOIR)
      fail(DTRAIN_ERR_INVALID_ARGUMENT, op,
           "eviction " + std::to_string(eviction) +
               " (expected DTRAIN_EVICT_OLDEST or DTRAIN_EVICT_RESERVOIR)");
    dtrain::StoreOptions o;
    o.capacity = capacity;
    o.eviction =
        eviction == DTRAIN_EVICT_OLDEST ? dtrain::Eviction::oldest : dtrain::Eviction::reservoir;
    o.normalise = normalise != 0;
    p->open_store(o);
  });
}

int dtrain_store_add(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                     const void* targets, int t_dtype, int t_ndim, const int64_t* t_shape) {
  const char* op = "dtrain_store_add";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    const auto b =
        check_pair(op, *p, x, x_dtype, x_ndim, x_shape, targets, t_dtype, t_ndim, t_shape, false);
    host_array(op, "x", x, "the store keeps host copies");
    host_array(op, "targets", targets, "the store keeps host copies");
    with_x(x_dtype, x, [&](auto xp) {
      if (t_dtype == DTRAIN_F32)
        p->store_add(xp, static_cast<const float*>(targets), b);
      else
        p->store_add(xp, static_cast<const double*>(targets), b);
      return 0;
    });
  });
}

int dtrain_store_size(dtrain_run run, int64_t* stored, int64_t* fed) {
  return guard("dtrain_store_size", run.id, [&] {
    auto p = find(run, "dtrain_store_size");
    if (stored) *stored = p->store_size();
    if (fed) *fed = p->store_fed();
  });
}

int dtrain_train_step_from_store(dtrain_run run, int64_t batch, double* loss) {
  const char* op = "dtrain_train_step_from_store";
  return guard(op, run.id, [&] {
    auto p = find(run, op);
    dtrain::detail::RankScope scope(p->rank());
    const double l = p->train_step_from_store(batch);
    if (loss) *loss = l;
  });
}

}  // extern "C"
