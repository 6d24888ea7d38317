// Checkpoint tests: the Checkpointer's communicator contract over an MPI communicator, with
// transport().mpi_comm() so that the parallel HDF5 strategies can be used.
#pragma once

#include <mpi.h>

#include <string>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::test {

struct MpiTestTransport {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm mpi_comm() const { return comm; }
};

class MpiTestComm {
 public:
  explicit MpiTestComm(MPI_Comm c) {
    MPI_Comm_dup(c, &t_.comm);
    MPI_Comm_rank(t_.comm, &rank_);
    MPI_Comm_size(t_.comm, &size_);
  }
  ~MpiTestComm() { MPI_Comm_free(&t_.comm); }
  MpiTestComm(const MpiTestComm&) = delete;
  MpiTestComm& operator=(const MpiTestComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() { check(MPI_Barrier(t_.comm), "barrier"); }
  void broadcast(BufferView b, int root) {
    check(MPI_Bcast(b.data, static_cast<int>(b.bytes()), MPI_BYTE, root, t_.comm), "broadcast");
  }
  void allreduce(BufferView b, ReduceOp op) {
    MPI_Datatype t = MPI_BYTE;
    switch (b.dtype) {
      case DType::f32: t = MPI_FLOAT; break;
      case DType::f64: t = MPI_DOUBLE; break;
      case DType::i32: t = MPI_INT32_T; break;
      case DType::i64: t = MPI_INT64_T; break;
      default: raise<InvalidArgument>("test allreduce", "unsupported dtype");
    }
    MPI_Op o = op == ReduceOp::min    ? MPI_MIN
               : op == ReduceOp::max  ? MPI_MAX
               : op == ReduceOp::prod ? MPI_PROD
                                      : MPI_SUM;
    check(MPI_Allreduce(MPI_IN_PLACE, b.data, static_cast<int>(b.count), t, o, t_.comm),
          "allreduce");
    if (op == ReduceOp::avg) {
      if (b.dtype == DType::f64)
        for (auto& x : b.as<double>()) x /= size_;
      else if (b.dtype == DType::f32)
        for (auto& x : b.as<float>()) x /= static_cast<float>(size_);
      else if (b.dtype == DType::i64)
        for (auto& x : b.as<std::int64_t>()) x /= size_;
      else
        for (auto& x : b.as<std::int32_t>()) x /= size_;
    }
  }
  MpiTestTransport& transport() { return t_; }

 private:
  static void check(int rc, const char* what) {
    if (rc != MPI_SUCCESS) raise<TransportError>(what, "MPI error " + std::to_string(rc));
  }
  MpiTestTransport t_;
  int rank_ = 0, size_ = 1;
};

}  // namespace dtrain::test
