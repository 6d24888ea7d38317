// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Hdf5Dataset, features and labels stored as two HDF5 datasets (opt-in: link dtrain::hdf5,
// parallel HDF5 of the MPICH flavour).
//
// Reading only what a rank needs
// ------------------------------
// A batch's indices are sorted, duplicates removed, and merged into runs of consecutive rows; each
// run is read by one H5Dread of a simple hyperslab into a staging buffer in file order, then the
// rows are scattered (and transformed) into batch order. Only the selected rows are read.
// Chunked datasets: because the runs are visited in file order, all rows that fall into one chunk
// are read back to back, so a chunk is fetched (and decompressed) once per batch however many of
// the batch's rows it holds, never once per sample. Across batches, the datasets are opened with a
// chunk cache of Hdf5Options::chunk_cache_bytes (default 64 MiB, far above HDF5's 1 MiB; raised to
// at least one chunk), so chunks that later batches touch again are not read again while they fit.
// (A single H5Dread over the union of the runs would also touch each chunk once, but HDF5 1.10 maps
// such irregular selections onto chunks in milliseconds per batch; it is used only for collective
// reads, which need exactly one call per rank.) Contiguous datasets, what the converter writes by
// default, are read with data sieving off (sieving would read 64 KiB around every scattered row),
// and when stored in the host's layout their runs are read directly at the dataset's file offset
// (H5Dget_offset): pread with the POSIX driver, MPI_File_read_at on a rank-private handle with the
// MPI-IO driver; that costs a third of an H5Dread per run (Hdf5Options::direct_reads).
//
// Drivers
// -------
// With the MPI-IO driver the file is opened collectively on the communicator and reads go through
// MPI-IO: independent by default (each rank reads its own rows when its loader needs them), or
// collective (Hdf5Options::collective), which lets MPI-IO aggregate the ranks' scattered rows into
// large contiguous file accesses; every rank then has to read the same number of batches, which
// the DistributedSampler guarantees, and a Loader reads such a dataset in the caller's thread (a
// read-ahead thread could leave the ranks with different numbers of reads issued). Otherwise a
// Loader reads from a background thread, and MPI allows that only at MPI_THREAD_MULTIPLE;
// Hdf5Driver::automatic therefore picks MPI-IO when MPI runs at MPI_THREAD_MULTIPLE and otherwise
// the POSIX driver, on which every rank opens the file read-only on its own and still reads only
// its rows (no MPI calls at all).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <mpi.h>
#include <hdf5.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/io_watchdog.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/detail/hdf5.hpp>
#include <dtrain/data/transform.hpp>

#ifndef H5_HAVE_PARALLEL
#error "dtrain/data/hdf5.hpp needs parallel HDF5 (Debian: libhdf5-mpich-dev; CMake: dtrain::hdf5)"
#endif

namespace dtrain {

/// How Hdf5Dataset opens its file (see the header comment).
enum class Hdf5Driver : unsigned char { automatic, mpio, posix };

constexpr const char* name_of(Hdf5Driver d) noexcept {
  switch (d) {
    case Hdf5Driver::automatic: return "automatic";
    case Hdf5Driver::mpio: return "mpio";
    case Hdf5Driver::posix: return "posix";
  }
  return "?";
}

/// Options of Hdf5Dataset.
struct Hdf5Options {
  Hdf5Driver driver = Hdf5Driver::automatic;
  /// Collective MPI-IO reads (mpio driver only): every rank must call read() equally often.
  bool collective = false;
  /// Raw-data chunk cache per dataset, in bytes (chunked datasets only).
  std::size_t chunk_cache_bytes = std::size_t(64) << 20;
  /// Labels must lie in [0, num_classes). 0: take the labels dataset's integer attribute
  /// "num_classes" when it has one, otherwise only require labels >= 0.
  int num_classes = 0;
  /// Labels datasets up to this many bytes are read whole at construction and served from memory
  /// (one H5Dread per batch instead of two); larger ones are read per batch like the features.
  std::size_t label_cache_bytes = std::size_t(64) << 20;
  /// Contiguous features stored in the host's layout, independent reads: read rows at the
  /// dataset's file offset with pread() (POSIX driver) or MPI_File_read_at on a rank-private
  /// handle (MPI-IO driver) instead of one H5Dread per run: same bytes, a third of the cost.
  bool direct_reads = true;
  /// Deadline, in seconds, of each collective MPI-IO section of the dataset (mpio driver): the
  /// file's opening and closing, and every read with `collective`. A collective call returns only
  /// once every rank has joined it and cannot be cancelled, so a rank that failed or stopped
  /// before joining would leave the others waiting until the allocation ends; when the deadline
  /// passes, every waiting rank prints what it waited for and the job is ended (abort_job,
  /// <dtrain/core/failure.hpp>). <= 0: none.
  double collective_timeout_s = 300.0;
};

/// A dataset made of a features dataset [N, ...] (any integer or float type; unsigned bytes are
/// converted by table lookup, other types by HDF5 to float) and an integer labels dataset [N] in
/// one HDF5 file. Construction validates both (existence, type class, rank, matching N) and throws
/// IoError naming the file, the dataset and what was expected.
/// With the mpio driver, construction and destruction are collective over `comm` (every rank
/// opens and closes the file together); with posix they are local. read() is thread-safe (HDF5
/// calls are serialised by a process-wide lock, see detail::h5_mutex()); other code that calls
/// HDF5 (checkpoints) while a Loader reads in the background must take the same lock, or the
/// loader must read in the caller's thread (LoaderOptions::prefetch_depth = 0).
class Hdf5Dataset {
 public:
  Hdf5Dataset(const std::string& file, const std::string& features, const std::string& labels,
              MPI_Comm comm, Hdf5Options options = {})
      : file_(file), features_name_(features), labels_name_(labels), opt_(options) {
    open(comm);
  }
  /// Same on MPI_COMM_WORLD.
  Hdf5Dataset(const std::string& file, const std::string& features, const std::string& labels,
              Hdf5Options options = {})
      : Hdf5Dataset(file, features, labels, MPI_COMM_WORLD, options) {}

  /// Local with the posix driver. With mpio the file close is collective; a dataset destroyed by
  /// an exception (stack unwinding) or while the job fails (job_failing()) therefore does not
  /// close it: its HDF5 identifiers are leaked until the process ends, so that a failing rank
  /// never waits for its peers (see <dtrain/core/failure.hpp>).
  ~Hdf5Dataset() {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (direct_mpi_ != MPI_FILE_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_File_close(&direct_mpi_);  // MPI_COMM_SELF: local
    }
    detail::H5Session session;
    if (driver_ == Hdf5Driver::mpio && unwind_.failing()) {
      for (auto* h : {&features_, &labels_, &fspace_, &lspace_, &dxpl_, &file_id_})
        (void)h->release();
      return;
    }
    std::optional<detail::IoWatchdog> watch;
    if (driver_ == Hdf5Driver::mpio) {
      try {
        watch.emplace(opt_.collective_timeout_s, collective_stall("closing"));
      } catch (...) {  // no thread or no memory for the deadline: close without one
      }
    }
    features_.reset();
    labels_.reset();
    fspace_.reset();
    lspace_.reset();
    dxpl_.reset();
    file_id_.reset();  // collective with mpio
  }
  Hdf5Dataset(const Hdf5Dataset&) = delete;
  Hdf5Dataset& operator=(const Hdf5Dataset&) = delete;

  std::size_t size() const noexcept { return n_; }
  Shape sample_shape() const { return shape_; }
  /// The class count labels are checked against (0: only >= 0).
  int num_classes() const noexcept { return num_classes_; }
  /// The driver actually in use (never automatic).
  Hdf5Driver driver() const noexcept { return driver_; }
  /// True when the features are stored as unsigned bytes.
  bool stored_as_bytes() const noexcept { return bytes_; }
  /// True when reads are collective MPI-IO (every rank must read equally often; a Loader then
  /// reads in the caller's thread).
  bool collective_reads() const noexcept { return opt_.collective; }
  /// True when the features dataset is chunked (and the chunk cache applies).
  bool chunked() const noexcept { return chunked_; }
  const std::string& file() const noexcept { return file_; }

  /// Dataset requirement (<dtrain/data/dataset.hpp>). Thread-safe. With collective reads every rank
  /// must call it the same number of times.
  void read(span<const std::int64_t> indices, span<float> features, span<std::int32_t> labels,
            const Normalize& transform) {
    const char* op = "Hdf5Dataset::read";
    detail::check_read_args(op, "'" + file_ + "' dataset '" + features_name_ + "'", n_, elements_,
                            indices, features, labels);
    transform.validate(op);
    if (driver_ == Hdf5Driver::mpio && !mpi_multiple_ && std::this_thread::get_id() != owner_)
      raise<InvalidArgument>(
          op, "'" + file_ +
                  "' is open through MPI-IO but MPI was not initialised with "
                  "MPI_THREAD_MULTIPLE, so it cannot be read from another thread (a Loader's "
                  "background thread); use Hdf5Driver::posix, MPI_THREAD_MULTIPLE, or "
                  "LoaderOptions::prefetch_depth = 0");
    std::lock_guard<std::mutex> self(mutex_);
    const std::size_t b = indices.size();
    if (b == 0 && !opt_.collective) return;

    // Sort the rows by file position, drop repeats, remember where each batch row comes from.
    order_.resize(b);
    for (std::size_t i = 0; i < b; ++i) order_[i] = {indices[i], i};
    std::sort(order_.begin(), order_.end());
    unique_.clear();
    slot_of_row_.resize(b);
    for (std::size_t k = 0; k < b; ++k) {
      if (unique_.empty() || unique_.back() != order_[k].first) unique_.push_back(order_[k].first);
      slot_of_row_[order_[k].second] = unique_.size() - 1;
    }
    const std::size_t u = unique_.size();
    fstage_.resize(u * elements_ * fkind_.size);
    if (!labels_cached_) lstage_.resize(u * lkind_.size);

    if (direct()) read_rows_direct();
    {
      detail::H5Session session;
      // One section per batch: the collective H5Dreads below (features, then labels unless
      // cached) are called off together.
      struct Disarm {
        detail::IoWatchdogThread* w;
        ~Disarm() {
          if (w) w->disarm();
        }
      } disarm{read_watch_.get()};
      if (read_watch_)
        read_watch_->arm(collective_stall("reading batch " + std::to_string(reads_) + " (" +
                                          std::to_string(b) + " rows)"));
      ++reads_;
      if (!direct())
        read_rows(features_.get(), fspace_.get(), fkind_.memtype, fstage_.data(), file_shape_,
                  features_name_);
      if (!labels_cached_)
        read_rows(labels_.get(), lspace_.get(), lkind_.memtype, lstage_.data(),
                  Shape{static_cast<std::int64_t>(n_)}, labels_name_);
    }

    const detail::ByteTable table(transform);
    for (std::size_t i = 0; i < b; ++i) {
      const std::size_t s = slot_of_row_[i];
      float* out = features.data() + i * elements_;
      const unsigned char* row = fstage_.data() + s * elements_ * fkind_.size;
      if (fkind_.code == Kind::u8)
        table.apply(row, out, elements_);
      else
        visit_kind(fkind_.code, [&](auto tag) {
          using T = decltype(tag);
          transform.apply(reinterpret_cast<const T*>(row), out, elements_);
        });
      std::int64_t label = 0;
      bool too_big = false;
      const unsigned char* lp =
          labels_cached_ ? lstage_.data() + static_cast<std::size_t>(unique_[s]) * lkind_.size
                         : lstage_.data() + s * lkind_.size;
      visit_kind(lkind_.code, [&](auto tag) {
        using T = decltype(tag);
        T v;
        std::memcpy(&v, lp, sizeof v);
        if constexpr (std::is_same_v<T, std::uint64_t>)
          too_big = v > static_cast<std::uint64_t>(INT64_MAX);
        label = static_cast<std::int64_t>(v);
      });
      if (too_big || label < 0 || label > INT32_MAX || (num_classes_ > 0 && label >= num_classes_))
        raise<IoError>(op, "'" + file_ + "' dataset '" + labels_name_ + "': label " +
                               (too_big ? std::string("> 2^63") : std::to_string(label)) +
                               " of sample " + std::to_string(unique_[s]) + " is outside [0, " +
                               (num_classes_ > 0 ? std::to_string(num_classes_) : "2^31") + ")");
      labels[i] = static_cast<std::int32_t>(label);
    }
  }

 private:
  // How a dataset's elements are staged: in their own (native) type whenever we can convert it
  // ourselves, because an H5Dread with a type conversion costs HDF5 a conversion buffer per call;
  // other types (big-endian, odd sizes) are converted by HDF5 to `memtype`.
  enum class Kind : unsigned char { u8, i8, u16, i16, u32, i32, u64, i64, f32, f64 };
  struct ElementKind {
    Kind code = Kind::u8;
    hid_t memtype = -1;  // predefined HDF5 type, never closed
    std::size_t size = 1;
    bool exact = true;  // memtype has the file type's layout (no conversion)
  };

  template <class F>
  static void visit_kind(Kind k, F&& f) {
    switch (k) {
      case Kind::u8: f(std::uint8_t{}); break;
      case Kind::i8: f(std::int8_t{}); break;
      case Kind::u16: f(std::uint16_t{}); break;
      case Kind::i16: f(std::int16_t{}); break;
      case Kind::u32: f(std::uint32_t{}); break;
      case Kind::i32: f(std::int32_t{}); break;
      case Kind::u64: f(std::uint64_t{}); break;
      case Kind::i64: f(std::int64_t{}); break;
      case Kind::f32: f(float{}); break;
      case Kind::f64: f(double{}); break;
    }
  }

  ElementKind element_kind(hid_t dset, const std::string& name, bool integer_fallback) {
    const char* op = "Hdf5Dataset";
    detail::H5Handle type(H5Dget_type(dset), H5Tclose);
    DTRAIN_CHECK_H5(type.get(), op, "'" << file_ << "' dataset '" << name << "'");
    const H5T_class_t c = H5Tget_class(type.get());
    const std::size_t size = H5Tget_size(type.get());
    const bool little = H5Tget_order(type.get()) == H5T_ORDER_LE;
    const bool is_signed = c == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_2;
    // The fast paths assume a little-endian host (what HDF5's native types are on x86 and ARM).
    if (little && c == H5T_INTEGER) {
      switch (size) {
        case 1:
          return is_signed ? ElementKind{Kind::i8, H5T_NATIVE_INT8, 1}
                           : ElementKind{Kind::u8, H5T_NATIVE_UINT8, 1};
        case 2:
          return is_signed ? ElementKind{Kind::i16, H5T_NATIVE_INT16, 2}
                           : ElementKind{Kind::u16, H5T_NATIVE_UINT16, 2};
        case 4:
          return is_signed ? ElementKind{Kind::i32, H5T_NATIVE_INT32, 4}
                           : ElementKind{Kind::u32, H5T_NATIVE_UINT32, 4};
        case 8:
          return is_signed ? ElementKind{Kind::i64, H5T_NATIVE_INT64, 8}
                           : ElementKind{Kind::u64, H5T_NATIVE_UINT64, 8};
        default: break;
      }
    }
    if (little && c == H5T_FLOAT && H5Tequal(type.get(), H5T_IEEE_F32LE) > 0)
      return ElementKind{Kind::f32, H5T_NATIVE_FLOAT, 4};
    if (little && c == H5T_FLOAT && H5Tequal(type.get(), H5T_IEEE_F64LE) > 0)
      return ElementKind{Kind::f64, H5T_NATIVE_DOUBLE, 8};
    return integer_fallback ? ElementKind{Kind::i64, H5T_NATIVE_INT64, 8, false}
                            : ElementKind{Kind::f32, H5T_NATIVE_FLOAT, 4, false};
  }

  bool direct() const noexcept { return direct_fd_ >= 0 || direct_mpi_ != MPI_FILE_NULL; }

  // Reads the feature rows in unique_ (sorted) into fstage_ with pread (POSIX driver) or
  // MPI_File_read_at (MPI-IO driver), one call per run.
  void read_rows_direct() {
    const std::size_t row = elements_ * fkind_.size, u = unique_.size();
    for (std::size_t k = 0; k < u;) {
      std::size_t e = k + 1;
      while (e < u && unique_[e] == unique_[e - 1] + 1) ++e;
      unsigned char* dst = fstage_.data() + k * row;
      std::size_t want = (e - k) * row;
      std::uint64_t at = direct_offset_ + static_cast<std::uint64_t>(unique_[k]) * row;
      while (want > 0) {
        std::string problem;
        ssize_t got = 0;
        if (direct_fd_ >= 0) {
          got = ::pread(direct_fd_, dst, want, static_cast<off_t>(at));
          if (got < 0 && errno == EINTR) continue;
          if (got < 0) problem = std::strerror(errno);
        } else {
          const int n = static_cast<int>(std::min<std::size_t>(want, std::size_t(1) << 30));
          MPI_Status st;
          const int rc =
              MPI_File_read_at(direct_mpi_, static_cast<MPI_Offset>(at), dst, n, MPI_BYTE, &st);
          int count = 0;
          if (rc == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &count);
          got = count;
          if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING] = {0};
            int len = 0;
            MPI_Error_string(rc, text, &len);
            problem = std::string("MPI_File_read_at: ") + text;
            got = -1;
          }
        }
        if (got <= 0)
          raise<IoError>("Hdf5Dataset::read",
                         "'" + file_ + "' dataset '" + features_name_ + "': reading rows " +
                             std::to_string(unique_[k]) + ".." + std::to_string(unique_[e - 1]) +
                             ": " + (got < 0 ? problem : std::string("file truncated")));
        dst += got;
        at += static_cast<std::uint64_t>(got);
        want -= static_cast<std::size_t>(got);
      }
      k = e;
    }
  }

  // Reads the rows in unique_ (sorted) into `buf`, in that order.
  void read_rows(hid_t dset, hid_t space, hid_t memtype, void* buf, const Shape& fshape,
                 const std::string& name) {
    const char* op = "Hdf5Dataset::read";
    const int rank = static_cast<int>(fshape.size());
    std::vector<hsize_t> start(rank, 0), count(fshape.begin(), fshape.end());
    std::vector<hsize_t> mstart(rank, 0), mdims(fshape.begin(), fshape.end());
    const std::size_t u = unique_.size();
    mdims[0] = static_cast<hsize_t>(u > 0 ? u : 1);
    detail::H5Handle mspace(H5Screate_simple(rank, mdims.data(), nullptr), H5Sclose);
    DTRAIN_CHECK_H5(mspace.get(), op, "'" << file_ << "' dataset '" << name << "'");
    if (!opt_.collective) {
      // One H5Dread per run of consecutive rows, in file order. HDF5 1.10 maps an irregular
      // union selection onto chunks very slowly (milliseconds per batch), while a simple
      // hyperslab per run costs microseconds; sorted runs also visit each chunk once per batch.
      for (std::size_t k = 0; k < u;) {
        std::size_t e = k + 1;
        while (e < u && unique_[e] == unique_[e - 1] + 1) ++e;
        start[0] = static_cast<hsize_t>(unique_[k]);
        count[0] = mdims[0] = static_cast<hsize_t>(e - k);
        mstart[0] = static_cast<hsize_t>(k);
        DTRAIN_CHECK_H5(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr,
                                            count.data(), nullptr),
                        op, "'" << file_ << "' dataset '" << name << "': selecting rows");
        DTRAIN_CHECK_H5(H5Sselect_hyperslab(mspace.get(), H5S_SELECT_SET, mstart.data(), nullptr,
                                            mdims.data(), nullptr),
                        op, "'" << file_ << "' dataset '" << name << "': selecting rows");
        DTRAIN_CHECK_H5(H5Dread(dset, memtype, mspace.get(), space, dxpl_.get(), buf), op,
                        "'" << file_ << "' dataset '" << name << "': reading rows " << unique_[k]
                            << ".." << unique_[e - 1]);
        k = e;
      }
      return;
    }
    // Collective: every rank makes exactly one H5Dread per batch, over the union of its runs
    // (possibly empty), so that MPI-IO can aggregate the ranks' accesses.
    DTRAIN_CHECK_H5(H5Sselect_none(space), op, "'" << file_ << "' dataset '" << name << "'");
    for (std::size_t k = 0; k < u;) {
      std::size_t e = k + 1;
      while (e < u && unique_[e] == unique_[e - 1] + 1) ++e;
      start[0] = static_cast<hsize_t>(unique_[k]);
      count[0] = static_cast<hsize_t>(e - k);
      DTRAIN_CHECK_H5(H5Sselect_hyperslab(space, k == 0 ? H5S_SELECT_SET : H5S_SELECT_OR,
                                          start.data(), nullptr, count.data(), nullptr),
                      op, "'" << file_ << "' dataset '" << name << "': selecting rows");
      k = e;
    }
    if (u == 0) DTRAIN_CHECK_H5(H5Sselect_none(mspace.get()), op, "'" << file_ << "'");
    DTRAIN_CHECK_H5(H5Dread(dset, memtype, mspace.get(), space, dxpl_.get(), buf), op,
                    "'" << file_ << "' dataset '" << name << "': reading " << u << " rows");
  }

  void open(MPI_Comm comm) {
    const char* op = "Hdf5Dataset";
    owner_ = std::this_thread::get_id();
    int mpi_up = 0, mpi_down = 0;
    MPI_Initialized(&mpi_up);
    if (mpi_up) MPI_Finalized(&mpi_down);
    int level = MPI_THREAD_SINGLE;
    if (mpi_up && !mpi_down) MPI_Query_thread(&level);
    mpi_multiple_ = mpi_up && !mpi_down && level == MPI_THREAD_MULTIPLE;
    driver_ = opt_.driver;
    if (driver_ == Hdf5Driver::automatic)
      driver_ = mpi_multiple_ ? Hdf5Driver::mpio : Hdf5Driver::posix;
    if (driver_ == Hdf5Driver::mpio)
      DTRAIN_REQUIRE(mpi_up && !mpi_down, op,
                     "'" << file_ << "': the MPI-IO driver needs MPI to be initialised");
    DTRAIN_REQUIRE(!opt_.collective || driver_ == Hdf5Driver::mpio, op,
                   "'" << file_ << "': collective reads need the MPI-IO driver (driver in use: "
                       << name_of(driver_) << ")");
    std::optional<detail::IoWatchdog> watch;
    if (driver_ == Hdf5Driver::mpio) {
      MPI_Comm_rank(comm, &rank_);
      MPI_Comm_size(comm, &ranks_);
      watch.emplace(opt_.collective_timeout_s, collective_stall("opening"));
      if (opt_.collective)
        read_watch_ = std::make_unique<detail::IoWatchdogThread>(opt_.collective_timeout_s);
    }

    struct stat st {};
    if (::stat(file_.c_str(), &st) != 0)
      raise<IoError>(op, "cannot open '" + file_ + "': " + std::strerror(errno));

    detail::H5Session session;
    detail::H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    DTRAIN_CHECK_H5(fapl.get(), op, "'" << file_ << "'");
    dxpl_ = detail::H5Handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    DTRAIN_CHECK_H5(dxpl_.get(), op, "'" << file_ << "'");
    // Data sieving reads 64 KiB around every access of a contiguous dataset; for scattered rows
    // that multiplies the bytes read by 64 KiB / row size, so it is turned off.
    DTRAIN_CHECK_H5(H5Pset_sieve_buf_size(fapl.get(), 0), op, "'" << file_ << "'");
    if (driver_ == Hdf5Driver::mpio) {
      DTRAIN_CHECK_H5(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), op, "'" << file_ << "'");
      DTRAIN_CHECK_H5(H5Pset_dxpl_mpio(dxpl_.get(), opt_.collective ? H5FD_MPIO_COLLECTIVE
                                                                    : H5FD_MPIO_INDEPENDENT),
                      op, "'" << file_ << "'");
    }
    file_id_ = detail::H5Handle(H5Fopen(file_.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    DTRAIN_CHECK_H5(
        file_id_.get(), op,
        "cannot open '" << file_ << "' as an HDF5 file (driver " << name_of(driver_) << ")");

    detail::H5Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
    DTRAIN_CHECK_H5(dapl.get(), op, "'" << file_ << "'");
    // Slot count: a prime well above the number of chunks the cache can hold, as HDF5 advises.
    DTRAIN_CHECK_H5(H5Pset_chunk_cache(dapl.get(), 100003, opt_.chunk_cache_bytes, 0.75), op,
                    "'" << file_ << "'");
    features_ = open_dataset(features_name_, dapl.get(), "features");
    {
      // A chunk larger than the cache would be re-read (and re-decompressed) for every run.
      detail::H5Handle dcpl(H5Dget_create_plist(features_.get()), H5Pclose);
      DTRAIN_CHECK_H5(dcpl.get(), op, "'" << file_ << "' dataset '" << features_name_ << "'");
      if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
        detail::H5Handle type(H5Dget_type(features_.get()), H5Tclose);
        std::vector<hsize_t> cdims(32, 1);
        const int crank = H5Pget_chunk(dcpl.get(), 32, cdims.data());
        DTRAIN_CHECK_H5(crank, op, "'" << file_ << "' dataset '" << features_name_ << "'");
        std::size_t chunk_bytes = H5Tget_size(type.get());
        for (int i = 0; i < crank; ++i)
          chunk_bytes *= static_cast<std::size_t>(cdims[static_cast<std::size_t>(i)]);
        if (chunk_bytes > opt_.chunk_cache_bytes) {
          DTRAIN_CHECK_H5(H5Pset_chunk_cache(dapl.get(), 100003, chunk_bytes, 0.75), op,
                          "'" << file_ << "'");
          features_ = open_dataset(features_name_, dapl.get(), "features");
        }
      }
    }
    labels_ = open_dataset(labels_name_, dapl.get(), "labels");

    // Features: integer or float, [N, ...].
    Shape fshape = dataset_shape(features_.get(), features_name_);
    const H5T_class_t fclass = type_class(features_.get(), features_name_, bytes_);
    if (fclass != H5T_INTEGER && fclass != H5T_FLOAT)
      raise<IoError>(op, "'" + file_ + "' dataset '" + features_name_ + "' holds " +
                             class_name(fclass) +
                             " data; expected an integer or float features dataset");
    if (fshape.size() < 2)
      raise<IoError>(op, "'" + file_ + "' dataset '" + features_name_ + "' has shape " +
                             to_string(fshape) + "; expected rank >= 2 ([samples, ...])");
    // Labels: integer, [N].
    bool label_bytes = false;
    Shape lshape = dataset_shape(labels_.get(), labels_name_);
    const H5T_class_t lclass = type_class(labels_.get(), labels_name_, label_bytes);
    if (lclass != H5T_INTEGER)
      raise<IoError>(op, "'" + file_ + "' dataset '" + labels_name_ + "' holds " +
                             class_name(lclass) + " data; expected an integer labels dataset");
    if (lshape.size() != 1)
      raise<IoError>(op, "'" + file_ + "' dataset '" + labels_name_ + "' has shape " +
                             to_string(lshape) + "; expected rank 1 ([samples])");
    if (lshape[0] != fshape[0])
      raise<IoError>(op, "'" + file_ + "': dataset '" + features_name_ + "' holds " +
                             std::to_string(fshape[0]) + " samples but '" + labels_name_ +
                             "' holds " + std::to_string(lshape[0]));
    fkind_ = element_kind(features_.get(), features_name_, false);
    lkind_ = element_kind(labels_.get(), labels_name_, true);
    bytes_ = fkind_.code == Kind::u8;
    n_ = static_cast<std::size_t>(fshape[0]);
    if (n_ * lkind_.size <= opt_.label_cache_bytes) {
      lstage_.resize(n_ * lkind_.size);
      if (n_ > 0)
        DTRAIN_CHECK_H5(
            H5Dread(labels_.get(), lkind_.memtype, H5S_ALL, H5S_ALL, dxpl_.get(), lstage_.data()),
            op, "'" << file_ << "' dataset '" << labels_name_ << "': reading labels");
      labels_cached_ = true;
    }
    file_shape_ = fshape;
    shape_.assign(fshape.begin() + 1, fshape.end());
    elements_ = element_count(shape_);

    detail::H5Handle plist(H5Dget_create_plist(features_.get()), H5Pclose);
    DTRAIN_CHECK_H5(plist.get(), op, "'" << file_ << "' dataset '" << features_name_ << "'");
    chunked_ = H5Pget_layout(plist.get()) == H5D_CHUNKED;

    fspace_ = detail::H5Handle(H5Dget_space(features_.get()), H5Sclose);
    DTRAIN_CHECK_H5(fspace_.get(), op, "'" << file_ << "'");
    lspace_ = detail::H5Handle(H5Dget_space(labels_.get()), H5Sclose);
    DTRAIN_CHECK_H5(lspace_.get(), op, "'" << file_ << "'");

    num_classes_ = opt_.num_classes;
    DTRAIN_REQUIRE(num_classes_ >= 0, op, "num_classes " << num_classes_ << " is negative");
    if (num_classes_ == 0) {
      const htri_t has = H5Aexists(labels_.get(), "num_classes");
      DTRAIN_CHECK_H5(has, op, "'" << file_ << "' dataset '" << labels_name_ << "'");
      if (has > 0) {
        detail::H5Handle attr(H5Aopen(labels_.get(), "num_classes", H5P_DEFAULT), H5Aclose);
        DTRAIN_CHECK_H5(attr.get(), op, "'" << file_ << "' dataset '" << labels_name_ << "'");
        long long value = 0;
        DTRAIN_CHECK_H5(H5Aread(attr.get(), H5T_NATIVE_LLONG, &value), op,
                        "'" << file_ << "' dataset '" << labels_name_
                            << "': attribute num_classes must be an integer scalar");
        if (value <= 0 || value > INT32_MAX)
          raise<IoError>(op, "'" + file_ + "' dataset '" + labels_name_ +
                                 "': attribute num_classes = " + std::to_string(value) +
                                 " is not a positive class count");
        num_classes_ = static_cast<int>(value);
      }
    }
    // Direct reads: a contiguous, unfiltered, internally stored dataset whose element layout is
    // the host's is one block of rows at a fixed file offset, so its rows can be read with pread()
    // at a third of the cost of an H5Dread per run (HDF5 still validated the file and gave the
    // offset through its public API).
    // With the MPI-IO driver (independent reads) the same rows are read with MPI_File_read_at
    // on a rank-private MPI file handle, so they still go through MPI-IO.
    if (opt_.direct_reads && !opt_.collective && !chunked_ && fkind_.exact &&
        H5Pget_layout(plist.get()) == H5D_CONTIGUOUS && H5Pget_external_count(plist.get()) == 0) {
      const haddr_t offset = H5Dget_offset(features_.get());
      detail::h5_error_stack();  // HADDR_UNDEF (no storage yet) is not an error here
      if (offset != HADDR_UNDEF) {
        direct_offset_ = static_cast<std::uint64_t>(offset);
        if (driver_ == Hdf5Driver::posix) {
          direct_fd_ = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
        } else if (MPI_File_open(MPI_COMM_SELF, file_.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL,
                                 &direct_mpi_) != MPI_SUCCESS) {
          direct_mpi_ = MPI_FILE_NULL;  // fall back to H5Dread
        }
      }
    }
    DTRAIN_LOG(debug, "Hdf5Dataset: '" << file_ << "' " << features_name_ << " "
                                       << to_string(fshape) << (bytes_ ? " u8" : " ->f32")
                                       << (chunked_ ? " chunked" : " contiguous") << ", driver "
                                       << name_of(driver_) << (opt_.collective ? " collective" : "")
                                       << (direct() ? " direct" : ""));
  }

  // The message of a collective section on this rank that passed its deadline.
  std::string collective_stall(const std::string& what) const {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", opt_.collective_timeout_s);
    return detail::rank_prefix(rank_) + "Hdf5Dataset: " + what + " '" + file_ +
           "' through MPI-IO did not finish within " + secs + " s; it is collective over " +
           std::to_string(ranks_) +
           " ranks, and a rank that failed or stopped before or inside it (see its own error) "
           "leaves the others waiting there" +
           (opt_.collective ? " (with collective reads every rank must read equally often)" : "") +
           ". A collective call cannot be cancelled, so the job is ended (deadline: "
           "Hdf5Options::collective_timeout_s)";
  }

  detail::H5Handle open_dataset(const std::string& name, hid_t dapl, const char* role) {
    const char* op = "Hdf5Dataset";
    // Walk the path so that a missing group or dataset is reported as such, not as an HDF5 stack.
    std::string prefix;
    std::size_t pos = 0;
    while (pos <= name.size()) {
      std::size_t next = name.find('/', pos);
      if (next == std::string::npos) next = name.size();
      const std::string part = name.substr(pos, next - pos);
      if (!part.empty()) {
        prefix += (prefix.empty() && name[0] != '/' ? "" : "/") + part;
        const htri_t exists = H5Lexists(file_id_.get(), prefix.c_str(), H5P_DEFAULT);
        if (exists <= 0) {
          detail::h5_error_stack();  // discard
          raise<IoError>(op, "'" + file_ + "' has no " + role + " dataset '" + name + "' ('" +
                                 prefix + "' does not exist)");
        }
      }
      pos = next + 1;
    }
    detail::H5Handle d(H5Dopen2(file_id_.get(), name.c_str(), dapl), H5Dclose);
    DTRAIN_CHECK_H5(
        d.get(), op,
        "'" << file_ << "': '" << name << "' is not a dataset (expected the " << role << ")");
    return d;
  }

  Shape dataset_shape(hid_t d, const std::string& name) {
    const char* op = "Hdf5Dataset";
    detail::H5Handle space(H5Dget_space(d), H5Sclose);
    DTRAIN_CHECK_H5(space.get(), op, "'" << file_ << "' dataset '" << name << "'");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    DTRAIN_CHECK_H5(rank, op, "'" << file_ << "' dataset '" << name << "'");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    if (rank > 0)
      DTRAIN_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), op,
                      "'" << file_ << "' dataset '" << name << "'");
    return Shape(dims.begin(), dims.end());
  }

  H5T_class_t type_class(hid_t d, const std::string& name, bool& is_u8) {
    const char* op = "Hdf5Dataset";
    detail::H5Handle type(H5Dget_type(d), H5Tclose);
    DTRAIN_CHECK_H5(type.get(), op, "'" << file_ << "' dataset '" << name << "'");
    const H5T_class_t c = H5Tget_class(type.get());
    is_u8 =
        c == H5T_INTEGER && H5Tget_size(type.get()) == 1 && H5Tget_sign(type.get()) == H5T_SGN_NONE;
    return c;
  }

  static std::string class_name(H5T_class_t c) {
    switch (c) {
      case H5T_INTEGER: return "integer";
      case H5T_FLOAT: return "float";
      case H5T_STRING: return "string";
      case H5T_COMPOUND: return "compound";
      case H5T_ENUM: return "enum";
      case H5T_ARRAY: return "array";
      case H5T_OPAQUE: return "opaque";
      case H5T_BITFIELD: return "bitfield";
      case H5T_REFERENCE: return "reference";
      case H5T_VLEN: return "variable-length";
      case H5T_TIME: return "time";
      default: return "unknown-class";
    }
  }

  UnwindGuard unwind_;  // first member: counts the exceptions in flight at construction
  std::string file_, features_name_, labels_name_;
  Hdf5Options opt_;
  Hdf5Driver driver_ = Hdf5Driver::posix;
  bool mpi_multiple_ = false;
  std::thread::id owner_;
  detail::H5Handle file_id_, features_, labels_, fspace_, lspace_, dxpl_;
  std::size_t n_ = 0, elements_ = 0;
  Shape shape_, file_shape_;
  bool bytes_ = false, chunked_ = false;
  int num_classes_ = 0;

  // Per-read scratch, reused across batches (guarded by mutex_).
  std::mutex mutex_;
  std::vector<std::pair<std::int64_t, std::size_t>> order_;
  std::vector<std::int64_t> unique_;
  std::vector<std::size_t> slot_of_row_;
  ElementKind fkind_, lkind_;
  std::vector<unsigned char> fstage_, lstage_;  // lstage_: all labels when labels_cached_
  bool labels_cached_ = false;
  int direct_fd_ = -1;                   // >= 0: features are read with pread (see open())
  MPI_File direct_mpi_ = MPI_FILE_NULL;  // or, with the MPI-IO driver, MPI_File_read_at
  int rank_ = -1, ranks_ = 1;            // in the file's communicator (mpio driver)
  std::size_t reads_ = 0;                // read() calls so far (for the deadline's message)
  std::unique_ptr<detail::IoWatchdogThread> read_watch_;  // collective reads' deadline
  std::uint64_t direct_offset_ = 0;
};

}  // namespace dtrain
