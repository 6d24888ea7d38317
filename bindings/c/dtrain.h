/* SPDX-License-Identifier: BSD-3-Clause */
/* dtrain's C API: a training run described by a configuration file, driven from C (C11) or, through
 * bindings/fortran/dtrain.f90, from Fortran. A thin layer of handles over dtrain::ConfiguredRun
 * (<dtrain/config/configured_run.hpp>); the implementation, bindings/c/dtrain_c.cpp, is compiled
 * into the caller's program with the caller's compilers and MPI (CMake: find_package(dtrain
 * COMPONENTS c) and target_link_libraries(app PRIVATE dtrain::c)).
 *
 * Errors: every function returns a dtrain_status (DTRAIN_OK = 0). On failure the message (rank,
 * operation, cause, as the C++ library says it) is kept for the calling thread and the run it
 * concerned; dtrain_last_error returns it. No C++ exception crosses this boundary.
 *
 * Arrays: the caller owns them; a function reads or writes them during the call only. Each array
 * comes with its element type and its shape in C order (shape[0] the slowest axis, the batch):
 * a batch of `b` samples of a model whose Input is {c, h, w} is x[b][c][h][w], shape {b, c, h, w};
 * shape {b, c*h*w} (flattened samples) is accepted too. A Fortran x(nx, ny, nchan, nbatch) is that
 * same memory, so the Fortran module passes its arrays as they are, shape reversed. Host arrays go
 * to the calls below without _device; a run made on a GPU (dtrain_create_on) also takes device
 * arrays through the _device calls. Where this file is compiled with a device policy (nvcc or
 * hipcc), each array's memory is checked against the call: a device array given to a host call,
 * or a host array to a _device call, is DTRAIN_ERR_INVALID_ARGUMENT.
 *
 * Collective calls (every rank of the run's communicator calls them in the same order): create,
 * close, train steps, save, maybe_save, restore_latest, wait_checkpoints, and with sync mode
 * fully_sharded predict and evaluate. The others are local.
 * One thread drives a run at a time. */
#ifndef DTRAIN_C_DTRAIN_H
#define DTRAIN_C_DTRAIN_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Status of every call. */
typedef enum dtrain_status {
  DTRAIN_OK = 0,
  DTRAIN_ERR_INVALID_ARGUMENT = 1, /**< bad input or misuse: null, wrong shape, bad config */
  DTRAIN_ERR_IO = 2,               /**< file system: config file, checkpoints */
  DTRAIN_ERR_TRANSPORT = 3,        /**< MPI failed */
  DTRAIN_ERR_REMOTE = 4,           /**< another rank failed */
  DTRAIN_ERR_TIMEOUT = 5,          /**< a wait passed its deadline */
  DTRAIN_ERR_DEVICE = 6,           /**< the GPU runtime failed */
  DTRAIN_ERR_OUT_OF_MEMORY = 7,    /**< an allocation failed */
  DTRAIN_ERR_CLOSED = 8,           /**< the run was closed, or never opened */
  DTRAIN_ERR_INTERNAL = 9          /**< any other failure (the message says which) */
} dtrain_status;

/** Element types of caller arrays. */
typedef enum dtrain_dtype { DTRAIN_F32 = 0, DTRAIN_F64 = 1, DTRAIN_I32 = 2 } dtrain_dtype;

/** What the in-situ store does with a sample once it is full. */
typedef enum dtrain_eviction {
  DTRAIN_EVICT_OLDEST = 0,   /**< the new sample replaces the oldest (a sliding window) */
  DTRAIN_EVICT_RESERVOIR = 1 /**< reservoir sampling: a uniform subset of all samples fed */
} dtrain_eviction;

/** Most axes of one array. */
#define DTRAIN_MAX_DIMS 8

/** Handle of one run: a plain value, copied freely. id 0 is no run; a closed run's id is never
 * reused, so a call on it fails with DTRAIN_ERR_CLOSED instead of touching freed memory. */
typedef struct dtrain_run {
  int64_t id;
} dtrain_run;

/** Collective over `comm` (duplicated: the run never matches the caller's messages). Reads the
 * configuration file `config_path` and builds the run it describes: model (initialised from the
 * file's seed), optimizer, gradient sync, checkpointer. MPI must be initialised. Nothing is
 * restored: call dtrain_restore_latest. On failure *run is {0}. */
int dtrain_create(MPI_Comm comm, const char* config_path, dtrain_run* run);
/** As dtrain_create, with a Fortran communicator handle (MPI_Comm_f2c). */
int dtrain_create_f(MPI_Fint comm, const char* config_path, dtrain_run* run);

/** dtrain_create_on's `device` for a run on the host. */
#define DTRAIN_HOST (-1)
/** Collective. As dtrain_create, on `device`: DTRAIN_HOST (the host, as dtrain_create) or a GPU
 * of this rank's node by its ordinal (0, 1, ...: the model, gradients and optimizer state in its
 * memory, its kernels on a stream of the run's own). A GPU needs this file compiled as CUDA or
 * HIP (nvcc, hipcc); otherwise, or for a device this rank does not see,
 * DTRAIN_ERR_INVALID_ARGUMENT. Every rank names a device that exists for it. */
int dtrain_create_on(MPI_Comm comm, const char* config_path, int device, dtrain_run* run);
/** As dtrain_create_on, with a Fortran communicator handle (MPI_Comm_f2c). */
int dtrain_create_on_f(MPI_Fint comm, const char* config_path, int device, dtrain_run* run);
/** Local. The run's device: DTRAIN_HOST or the GPU's ordinal. */
int dtrain_device(dtrain_run run, int* device);
/** Collective. Waits for checkpoint writes still running, frees the run and sets run->id to 0;
 * the run's id stays closed forever. Closing {0} is DTRAIN_OK (nothing to do). */
int dtrain_close(dtrain_run* run);

/** The calling thread's message of its last failed call on `run` (any run id, closed ones
 * included), or of its last failed call that named no valid run (create, id 0) when `run`
 * holds no message: "" when there is none. Valid until this thread's next failing call. Never
 * null. Local. */
const char* dtrain_last_error(dtrain_run run);
/** Copies dtrain_last_error(run) into buf (at most size-1 bytes and a terminating 0; nothing
 * when size is 0); *length (if not null) receives the message's full length. Local. */
int dtrain_copy_last_error(dtrain_run run, char* buf, size_t size, size_t* length);

/** Local. Elements of one input sample and of one output sample (the model's shapes), the
 * model's element type (DTRAIN_F32 or DTRAIN_F64), the optimizer steps taken (restored by
 * dtrain_restore_latest), the number of learnable scalars, this rank and the rank count. */
int dtrain_input_size(dtrain_run run, int64_t* elements);
int dtrain_output_size(dtrain_run run, int64_t* elements);
int dtrain_model_dtype(dtrain_run run, int* dtype);
int dtrain_step(dtrain_run run, int64_t* step);
int dtrain_parameter_count(dtrain_run run, int64_t* count);
int dtrain_rank(dtrain_run run, int* rank, int* size);

/** Collective. One optimizer step on this rank's batch: x (dtype F32 or F64, shape {b, input
 * shape...}) and targets: class labels (I32, shape {b}) or values (F32/F64, shape {b, output
 * shape...}), as the configured loss needs. Arrays of the other float type than the model's are
 * converted (copied); the model's own type is read in place. *loss (if not null) receives the
 * mean loss of this rank's batch. */
int dtrain_train_step(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                      const int64_t* x_shape, const void* targets, int t_dtype, int t_ndim,
                      const int64_t* t_shape, double* loss);
/** Collective. As dtrain_train_step, on device arrays of a run made on a GPU: x and targets in
 * device memory (cudaMalloc / hipMalloc, managed memory, CUDA Fortran device arrays, OpenACC
 * `host_data use_device`), of the model's element type (no conversion on the device; labels
 * I32), read in place on the run's stream. The device work that writes them must be complete
 * (e.g. cudaStreamSynchronize) before the call; they may be changed once it returns. Class labels
 * are copied to the host to be checked. */
int dtrain_train_step_device(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                             const int64_t* x_shape, const void* targets, int t_dtype, int t_ndim,
                             const int64_t* t_shape, double* loss);
/** Local (collective with sync mode fully_sharded: each forward gathers parameters). Evaluation
 * forward of x into y (F32/F64, shape {b, output shape...}). */
int dtrain_predict(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                   void* y, int y_dtype, int y_ndim, const int64_t* y_shape);
/** As dtrain_predict, on device arrays of a run made on a GPU (as dtrain_train_step_device; y of
 * the model's type too): y is written when the call returns. Not with a normalising store. */
int dtrain_predict_device(dtrain_run run, const void* x, int x_dtype, int x_ndim,
                          const int64_t* x_shape, void* y, int y_dtype, int y_ndim,
                          const int64_t* y_shape);
/** Local (collective when fully sharded, as dtrain_predict). Evaluation of x against targets (as
 * dtrain_train_step): the mean loss, and with class labels the fraction classified correctly (-1
 * for value targets). Either output may be null. */
int dtrain_evaluate(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                    const void* targets, int t_dtype, int t_ndim, const int64_t* t_shape,
                    double* loss, double* accuracy);
/** Local. Copies the parameters (this rank's whole model, in the model's arena order) into out,
 * converted to `dtype` (F32 or F64); `count` must equal dtrain_parameter_count. Not with sync mode
 * fully_sharded (each rank holds a part). */
int dtrain_copy_parameters(dtrain_run run, void* out, int dtype, int64_t count);

/** Collective. Saves checkpoint dtrain_step(run) into the configured checkpoint directory. */
int dtrain_save(dtrain_run run);
/** Collective. Saves when the configured interval says the current step is due; *saved (if not
 * null) is 1 when it saved, else 0. */
int dtrain_maybe_save(dtrain_run run, int* saved);
/** Collective. Restores the newest valid checkpoint; *step receives its step, or -1 when there
 * is none (the run is then untouched). */
int dtrain_restore_latest(dtrain_run run, int64_t* step);
/** Collective. Waits (bounded) for checkpoint writes and flushes still running and reports their
 * errors. */
int dtrain_wait_checkpoints(dtrain_run run);

/** Local. Registers the caller's array `data` of `count` elements of `dtype` (F32, F64 or I32,
 * host memory) under `name` (1-64 letters, digits, '_', '-', '.'; each name once): every later
 * save holds this rank's values, and dtrain_restore_latest loads them back into the same memory,
 * which must stay valid until dtrain_close. For the solver's own state (fields, step counters), so
 * that one checkpoint holds solver and model, published at once and pruned together. Register
 * before dtrain_restore_latest, with the names and counts of the run that saved: a checkpoint
 * without them is refused, naming the array. */
int dtrain_checkpoint_array(dtrain_run run, const char* name, void* data, int dtype,
                            int64_t count);

/** Local. Opens this rank's in-situ store of up to `capacity` (input, target) pairs of the model's
 * shapes, filled by dtrain_store_add and read by dtrain_train_step_from_store. With `normalise`
 * 1, the inputs are normalised per channel by running statistics of everything fed (merged over
 * the ranks at each step from the store). Once per run; open it before dtrain_restore_latest when
 * the checkpoints hold a store: from then on checkpoints hold each rank's samples too. */
int dtrain_store_open(dtrain_run run, int64_t capacity, int eviction, int normalise);
/** Local. Copies a batch of pairs into the store (x and targets as dtrain_train_step, values
 * only). */
int dtrain_store_add(dtrain_run run, const void* x, int x_dtype, int x_ndim, const int64_t* x_shape,
                     const void* targets, int t_dtype, int t_ndim, const int64_t* t_shape);
/** Local. Pairs stored on this rank (at most the capacity) and pairs ever fed. */
int dtrain_store_size(dtrain_run run, int64_t* stored, int64_t* fed);
/** Collective. One optimizer step on `batch` pairs drawn from this rank's store (a shuffled pass
 * over its slots, reshuffled each pass, seeded from the configuration). */
int dtrain_train_step_from_store(dtrain_run run, int64_t batch, double* loss);

#ifdef __cplusplus
}
#endif

#endif /* DTRAIN_C_DTRAIN_H */
