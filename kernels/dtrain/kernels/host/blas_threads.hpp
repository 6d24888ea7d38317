// SPDX-License-Identifier: BSD-3-Clause
// dtrain: how many threads the BLAS library of each rank runs, when the user has not said.
//
// OpenBLAS left alone starts a thread per CPU in every process. Two ranks on two cores then run
// four BLAS threads, and the ranks' spinning waits (all-reduce, loader) compete with them: on
// such a machine two ranks trained slower than one. dtrain therefore sets the count once per
// process, before its first GEMM (blas::gemm and the HostBlasExec constructor call
// configure_threads), unless the user chose it:
//
//   1. DTRAIN_BLAS_THREADS=N (strict, 1..4096) sets N, whatever else is set.
//   2. OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS set: the library has read it at
//      load time; dtrain leaves it as it is.
//   3. This process's affinity mask narrower than the machine's online CPUs: the launcher bound
//      the rank (srun --cpu-bind, mpiexec -bind-to), so the mask is the rank's own share; one
//      thread per CPU in it, but no more than online CPUs / node ranks where the node's rank
//      count is known (a launcher may bind several ranks to one mask: Open MPI binds each rank
//      to its NUMA domain or package when it starts more than two).
//   4. Otherwise the mask is shared by the ranks of the job on this node: mask / node ranks
//      threads, at least 1. The node's rank count comes from the launcher's environment
//      (node_ranks_from_env); where no launcher variable says it, the rank counts as the only one.
//
// Why the launcher's environment and not the communicator: the BLAS is used before and without
// any communicator (a model can run a forward pass first; HostBlasExec needs no transport), a
// communicator sees only its own group (a sub-communicator undercounts the processes that share
// the cores), and this header, like the rest of the core, must not include MPI. The common
// launchers (node_ranks_variables) state the node-local size of the whole job, which is what
// shares the cores.
//
// OpenBLAS is recognised at run time, by weak references to openblas_set_num_threads and
// openblas_get_num_threads: they resolve where OpenBLAS is the CBLAS the program runs (also when
// an alternatives-installed libblas.so.3 is OpenBLAS under a netlib cblas.h) and are null with
// any other CBLAS. With another CBLAS dtrain sets nothing and says so in the log: its own
// variable (MKL_NUM_THREADS, BLIS_NUM_THREADS, ...) decides. OpenBLAS built with OpenMP passes
// the count to omp_set_num_threads too, so the process's OpenMP regions get the same share.
#pragma once

#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <dtrain/core/env.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>

#if defined(__GNUC__)
// OpenBLAS's run-time setter and getter (OpenBLAS's cblas.h declares them too), as weak
// references: null unless the program runs OpenBLAS.
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
}
#endif

namespace dtrain {
namespace blas {

/// Reads one environment variable: its value, or nothing when unset or empty (as env::get).
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

/// The variables, in this order, from which node_ranks_from_env takes the number of the job's
/// ranks on this node: MPICH's and Intel MPI's Hydra, Open MPI, MVAPICH's mpirun_rsh, Cray PALS
/// and other PMI launchers, then Slurm's srun (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID).
inline constexpr const char* node_ranks_variables[] = {
    "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE",
    "SLURM_STEP_TASKS_PER_NODE"};

/// The variables that give this process's rank in the job (to log on rank 0 only).
inline constexpr const char* launcher_rank_variables[] = {
    "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"};

/// Thread-count variables of the BLAS library and OpenMP that, when set, leave the library as
/// it is (OpenBLAS reads all three at load time).
inline constexpr const char* library_thread_variables[] = {"OPENBLAS_NUM_THREADS",
                                                           "GOTO_NUM_THREADS", "OMP_NUM_THREADS"};

/// Everything the choice depends on. Plain value type.
struct ThreadInputs {
  int requested = 0;                ///< DTRAIN_BLAS_THREADS, 0 when unset
  std::string library_variable;     ///< the first library_thread_variables entry set, or ""
  int mask_cpus = 1;                ///< CPUs in this process's affinity mask
  int online_cpus = 1;              ///< CPUs online on the machine
  int node_ranks = 0;               ///< the job's ranks on this node, 0 when unknown
  std::string node_ranks_variable;  ///< where node_ranks came from ("" when unknown)
};

/// Which rule decided (the numbered list at the top of this header).
enum class ThreadRule { requested, library_variable, bound_mask, shared_mask, only_rank };

/// The decision. threads == 0: leave the library as it is configured.
struct ThreadChoice {
  int threads = 0;
  ThreadRule rule = ThreadRule::only_rank;
  std::string why;  ///< one sentence naming the inputs that decided, for the log
};

/// The BLAS threads of one rank for `in`. Pure; local.
inline ThreadChoice choose_threads(const ThreadInputs& in) {
  using dtrain::detail::concat;
  const int mask = std::max(1, in.mask_cpus);
  const int online = std::max(mask, in.online_cpus);
  const char* unset = "no thread count is set and ";
  ThreadChoice c;
  if (in.requested > 0) {
    c.threads = in.requested;
    c.rule = ThreadRule::requested;
    c.why = concat("as DTRAIN_BLAS_THREADS=", in.requested, " says");
  } else if (!in.library_variable.empty()) {
    c.rule = ThreadRule::library_variable;
    c.why = in.library_variable + " is set: the library keeps the count it read at load time";
  } else if (mask < online) {
    const int share = in.node_ranks > 1 ? std::max(1, online / in.node_ranks) : mask;
    c.threads = std::min(mask, share);
    c.rule = ThreadRule::bound_mask;
    c.why = mask <= share
                ? concat(unset, "this rank's affinity mask holds ", mask, " of the ", online,
                         " online CPUs (the launcher bound the rank): one thread per CPU of it")
                : concat(unset, "this rank's affinity mask holds ", mask, " of the ", online,
                         " online CPUs, but the ", in.node_ranks, " ranks on this node (",
                         in.node_ranks_variable, "=", in.node_ranks, ") leave each ", share,
                         " (the launcher bound several ranks to the same CPUs)");
  } else if (in.node_ranks > 1) {
    c.threads = std::max(1, mask / in.node_ranks);
    c.rule = ThreadRule::shared_mask;
    c.why = concat(unset, "the ", mask, " CPUs of the affinity mask are shared by ", in.node_ranks,
                   " ranks on this node (", in.node_ranks_variable, "=", in.node_ranks, ")");
  } else {
    c.threads = mask;
    c.rule = ThreadRule::only_rank;
    c.why = in.node_ranks == 1
                ? concat(unset, "this is the only rank on this node (", in.node_ranks_variable,
                         "=1): one thread per CPU of the affinity mask (", mask, ")")
                : concat(unset,
                         "no launcher variable gives the ranks on this node (MPI_LOCALNRANKS, "
                         "OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_STEP_TASKS_PER_NODE...): counted as "
                         "the only one, one thread per CPU of the affinity mask (",
                         mask, ")");
  }
  return c;
}

namespace detail {

// A launcher's count: digits only, in [lo, 2^20]. Launcher variables are not dtrain's: a value that
// does not parse is skipped (the next variable is tried), never an error.
inline int launcher_count(const std::string& v, int lo) {
  if (v.empty() || v.size() > 8) return -1;
  long n = 0;
  for (char ch : v) {
    if (ch < '0' || ch > '9') return -1;
    n = n * 10 + (ch - '0');
  }
  return n >= lo && n <= (1L << 20) ? static_cast<int>(n) : -1;
}

// Slurm's per-node task list ("2(x3),1": three nodes of 2 tasks, then one of 1) at node index
// `node`; with no index (-1), the count when every node has the same. -1 when the list does not
// parse as a whole or the index is past it.
inline int slurm_tasks_on_node(const std::string& list, int node) {
  int index = 0, found = -1, uniform = -1;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    std::size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    int repeat = 1;
    const std::size_t paren = item.find('(');
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        return -1;
      repeat = launcher_count(item.substr(paren + 2, item.size() - paren - 3), 1);
      item.resize(paren);
    }
    const int tasks = launcher_count(item, 0);
    if (tasks < 0 || repeat < 0) return -1;
    if (node >= index && node - index < repeat) found = tasks;
    uniform = index == 0 ? tasks : (uniform == tasks ? tasks : -2);
    index += repeat;
    pos = end + 1;
  }
  if (node >= 0) return found;
  return uniform >= 0 ? uniform : -1;
}

}  // namespace detail

/// The job's ranks on this node as the launcher's environment states it (node_ranks_variables,
/// first that parses), with the variable's name; {0, ""} when none does. Local, pure given `get`.
inline std::pair<int, std::string> node_ranks_from_env(const EnvLookup& get) {
  for (const char* name : node_ranks_variables) {
    const auto v = get(name);
    if (!v) continue;
    int n = -1;
    if (std::string(name) == "SLURM_STEP_TASKS_PER_NODE") {
      const auto id = get("SLURM_NODEID");
      const int node = id ? detail::launcher_count(*id, 0) : -1;
      if (id && node < 0) continue;
      n = detail::slurm_tasks_on_node(*v, node);
    } else {
      n = detail::launcher_count(*v, 1);
    }
    if (n >= 1) return {n, name};
  }
  return {0, ""};
}

/// This process's rank in the job from the launcher's environment, -1 when none says it.
inline int launcher_rank(const EnvLookup& get) {
  for (const char* name : launcher_rank_variables)
    if (const auto v = get(name)) {
      const int r = detail::launcher_count(*v, 0);
      if (r >= 0) return r;
    }
  return -1;
}

/// DTRAIN_BLAS_THREADS through `get` (0 when unset or empty). Throws InvalidArgument naming the
/// variable unless the value is a whole number in 1..4096 (env::parse_int).
inline int requested_threads(const EnvLookup& get) {
  const auto v = get("DTRAIN_BLAS_THREADS");
  return v ? static_cast<int>(env::parse_int("DTRAIN_BLAS_THREADS", *v, 1, 4096)) : 0;
}

/// CPUs in this process's affinity mask (its main thread's: what the launcher set at exec),
/// or the online CPUs where the mask cannot be read.
inline int affinity_cpus() {
#if defined(__linux__)
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(n));
    if (!set) break;
    const std::size_t bytes = CPU_ALLOC_SIZE(static_cast<std::size_t>(n));
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(::getpid(), bytes, set);
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return count > 0 ? count : 1;
    if (errno != EINVAL) break;  // EINVAL: the kernel's mask is wider than `n` bits
  }
#endif
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

/// CPUs online on the machine.
inline int online_cpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : affinity_cpus();
}

/// The inputs of this process: environment through `get`, mask and online CPUs of the machine.
/// Throws InvalidArgument for a malformed DTRAIN_BLAS_THREADS.
inline ThreadInputs thread_inputs(const EnvLookup& get) {
  ThreadInputs in;
  in.requested = requested_threads(get);
  for (const char* name : library_thread_variables)
    if (get(name)) {
      in.library_variable = name;
      break;
    }
  in.mask_cpus = affinity_cpus();
  in.online_cpus = online_cpus();
  auto nr = node_ranks_from_env(get);
  in.node_ranks = nr.first;
  in.node_ranks_variable = std::move(nr.second);
  return in;
}

/// True when the program runs OpenBLAS (its thread setter resolved).
inline bool openblas_linked() noexcept {
#if defined(__GNUC__)
  return openblas_set_num_threads != nullptr && openblas_get_num_threads != nullptr;
#else
  return false;
#endif
}

/// OpenBLAS's current thread count, 0 when the program does not run OpenBLAS.
inline int library_threads() noexcept {
#if defined(__GNUC__)
  return openblas_linked() ? openblas_get_num_threads() : 0;
#else
  return 0;
#endif
}

/// Sets OpenBLAS to `n` threads and returns the count it then reports (it caps `n` at its
/// build's limit; a single-threaded build stays at 1); 0, and nothing set, with another CBLAS.
/// Process-wide (OpenBLAS keeps one count for all threads); configure_threads calls it once,
/// before dtrain's first GEMM.
inline int apply_threads(int n) noexcept {
#if defined(__GNUC__)
  if (!openblas_linked() || n < 1) return 0;
  openblas_set_num_threads(n);
  return openblas_get_num_threads();
#else
  (void)n;
  return 0;
#endif
}

/// Whether OpenBLAS kernels for `core` (openblas_get_corename(), any case) use narrower vectors
/// than a CPU with AVX2 and FMA runs: the SSE-only families and Sandybridge (AVX without FMA). A
/// dynamic-architecture OpenBLAS falls back to one of them on a CPU newer than its build (Debian
/// 12's 0.3.21 picks Prescott on an AVX-512 Xeon: its dense layers ran 3x slower than with
/// OPENBLAS_CORETYPE=SkylakeX, benchmarks/RESULTS.md "Whole models"). Pure function.
inline bool openblas_core_below_cpu(std::string core, bool cpu_has_avx2_fma) {
  if (!cpu_has_avx2_fma) return false;
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  });
  for (const char* old :
       {"katmai", "coppermine", "northwood", "banias", "prescott", "core2", "penryn", "dunnington",
        "nehalem", "atom", "opteron", "barcelona", "bobcat", "sandybridge"})
    if (core.rfind(old, 0) == 0) return true;
  return false;
}

/// What configure_threads did. Plain value type.
struct ThreadSetting {
  ThreadChoice choice;
  bool openblas = false;    ///< the program runs OpenBLAS
  int library_threads = 0;  ///< OpenBLAS's count afterwards (0 with another CBLAS)
  std::string core;         ///< OpenBLAS's kernel family (openblas_get_corename), else empty
};

namespace detail {
inline ThreadSetting configure_threads_now() {
  const EnvLookup get = [](const char* name) { return env::get(name); };
  ThreadSetting s;
  s.choice = choose_threads(thread_inputs(get));
  s.openblas = openblas_linked();
  if (s.choice.threads > 0) s.library_threads = apply_threads(s.choice.threads);
  if (!s.openblas)
    s.library_threads = 0;
  else if (s.choice.threads == 0)
    s.library_threads = library_threads();

  // One line for the job: info on rank 0 (or where no launcher gives a rank), debug elsewhere
  // and where the user's own variable decided; a warning where DTRAIN_BLAS_THREADS cannot be
  // applied.
  const int rank = launcher_rank(get);
#if defined(__GNUC__)
  if (s.openblas && openblas_get_corename != nullptr && openblas_get_corename() != nullptr)
    s.core = openblas_get_corename();
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // Loaded with the library, the kernels cannot be changed from here: say what to set.
  const LogLevel slow_level = rank > 0 ? LogLevel::debug : LogLevel::warn;
  if (openblas_core_below_cpu(s.core, avx2_fma) && log_enabled(slow_level)) {
    dtrain::detail::RankScope scope(rank >= 0 ? rank : dtrain::detail::thread_rank());
    dtrain::log(slow_level,
                dtrain::detail::concat(
                    "OpenBLAS runs its ", s.core,
                    " kernels on a CPU with AVX2 and FMA (its build does not know this CPU); set "
                    "OPENBLAS_CORETYPE=Haswell, or SkylakeX where the CPU has AVX-512, in the "
                    "job's environment (OpenBLAS reads it when the program starts)"));
  }
#endif
  LogLevel level = rank > 0 ? LogLevel::debug : LogLevel::info;
  if (s.choice.rule == ThreadRule::library_variable) level = LogLevel::debug;
  if (!s.openblas && s.choice.rule == ThreadRule::requested && rank <= 0) level = LogLevel::warn;
  if (!log_enabled(level)) return s;
  using dtrain::detail::concat;
  std::string line;
  if (!s.openblas)
    line = concat(
        "BLAS threads not set: the linked CBLAS is not OpenBLAS, so its own variable "
        "(MKL_NUM_THREADS, BLIS_NUM_THREADS...) decides",
        s.choice.threads > 0 ? concat("; dtrain would run ", s.choice.threads, ", ", s.choice.why)
                             : concat("; ", s.choice.why));
  else if (s.choice.threads == 0)
    line = concat("BLAS threads: ", s.library_threads,
                  " (OpenBLAS), not set by dtrain: ", s.choice.why);
  else
    line = concat("BLAS threads: ", s.library_threads, " (OpenBLAS), ", s.choice.why,
                  s.library_threads != s.choice.threads
                      ? concat(" (asked for ", s.choice.threads, "; OpenBLAS's build allows ",
                               s.library_threads, ")")
                      : std::string(),
                  s.choice.rule == ThreadRule::requested
                      ? std::string()
                      : std::string("; DTRAIN_BLAS_THREADS=N sets another count"));
  dtrain::detail::RankScope scope(rank >= 0 ? rank : dtrain::detail::thread_rank());
  dtrain::log(level, line);
  return s;
}
}  // namespace detail

/// Sets this process's BLAS threads as the rules at the top of this header say, once per
/// process (later calls return the first result at the cost of one guard check), and logs the
/// count and the reason once. Local; thread-safe (concurrent first callers wait for the first).
/// Throws InvalidArgument for a malformed DTRAIN_BLAS_THREADS (and throws again on the next
/// call: nothing is set until it parses).
inline const ThreadSetting& configure_threads() {
  static const ThreadSetting setting = detail::configure_threads_now();
  return setting;
}

}  // namespace blas
}  // namespace dtrain
