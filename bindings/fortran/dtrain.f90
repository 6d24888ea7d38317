! SPDX-License-Identifier: BSD-3-Clause
! dtrain's Fortran module: `use dtrain`. A thin ISO_C_BINDING layer over the C API
! (bindings/c/dtrain.h), compiled by the user's own Fortran compiler (CMake: find_package(dtrain
! COMPONENTS fortran), target_link_libraries(app PRIVATE dtrain::fortran)).
!
! Arrays are passed as they are: a batch x(nx, ny, nchan, nbatch) is, in memory, the C order
! [nbatch][nchan][ny][nx] that a model with Input{nchan, ny, nx} reads, so nothing is copied; the
! module passes each array's shape reversed. The last axis is always the batch. Targets are
! y(..., nbatch) of the same rank as x, y(nbatch) (one value per sample), or integer(c_int32_t)
! class labels(nbatch), 0-based as in every language. Dummy arrays are assumed-rank (any rank) and
! CONTIGUOUS: a contiguous actual argument is passed in place; a non-contiguous one (a strided
! section) is copied in (and for predict's output, back out) by the compiler, the standard's rule.
! real(c_float) and real(c_double) arrays are accepted whatever the model's type (the other type
! is converted). Device arrays (a run made with `device`) go through dtrain_train_step_device and
! dtrain_predict_device as C addresses with their shapes.
!
! Fortran 2018 (assumed-rank dummies, C_LOC of an assumed-type array): gfortran builds it with
! -std=f2018 (or without -std); -std=f2008 refuses assumed-rank.
!
! Errors: every procedure has optional `stat` (DTRAIN_OK = 0 on success, else a DTRAIN_ERR_*
! code) and `errmsg` (the message: rank, operation, cause), as Fortran's allocate. Without `stat`
! a failure prints its message to error_unit and calls MPI_Abort on MPI_COMM_WORLD.
module dtrain
  use, intrinsic :: iso_c_binding, only: c_int, c_int32_t, c_int64_t, c_float, c_double, &
    c_char, c_ptr, c_null_ptr, c_null_char, c_loc, c_size_t
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi_f08, only: MPI_Comm, MPI_COMM_WORLD, MPI_Abort
  implicit none
  private

  !> Handle of one run (a value; id 0 is no run). Closed runs' ids are never reused.
  type, bind(c), public :: dtrain_run
    integer(c_int64_t) :: id = 0
  end type dtrain_run

  integer, parameter, public :: DTRAIN_OK = 0, DTRAIN_ERR_INVALID_ARGUMENT = 1, &
    DTRAIN_ERR_IO = 2, DTRAIN_ERR_TRANSPORT = 3, DTRAIN_ERR_REMOTE = 4, DTRAIN_ERR_TIMEOUT = 5, &
    DTRAIN_ERR_DEVICE = 6, DTRAIN_ERR_OUT_OF_MEMORY = 7, DTRAIN_ERR_CLOSED = 8, &
    DTRAIN_ERR_INTERNAL = 9
  integer, parameter, public :: DTRAIN_EVICT_OLDEST = 0, DTRAIN_EVICT_RESERVOIR = 1
  !> Element types of the device procedures' arrays (dtrain_train_step_device,
  !> dtrain_predict_device): real(c_float), real(c_double), integer(c_int32_t) labels.
  integer, parameter, public :: DTRAIN_F32 = 0, DTRAIN_F64 = 1, DTRAIN_I32 = 2
  !> dtrain_create's `device` for a run on the host (the default); 0, 1, ...: that GPU.
  integer, parameter, public :: DTRAIN_HOST = -1

  public :: dtrain_create, dtrain_close, dtrain_info, dtrain_train_step, dtrain_predict, &
    dtrain_evaluate, dtrain_copy_parameters, dtrain_save, dtrain_maybe_save, &
    dtrain_restore_latest, dtrain_wait_checkpoints, dtrain_store_open, dtrain_store_add, &
    dtrain_store_size, dtrain_train_step_from_store, dtrain_last_error, &
    dtrain_train_step_device, dtrain_predict_device, dtrain_checkpoint_array

  !> Collective. dtrain_create(run, comm, config_path [, stat, errmsg, device]): the run described
  !> by the file, on an integer or type(MPI_Comm) communicator, on the host (device absent or
  !> DTRAIN_HOST) or on GPU `device` of this rank's node.
  interface dtrain_create
    module procedure create_int, create_f08
  end interface dtrain_create

  !> Local. dtrain_copy_parameters(run, p [, stat, errmsg]): the whole model's parameters into
  !> p(n), n = the parameter count (dtrain_info), real(c_float) or real(c_double).
  interface dtrain_copy_parameters
    module procedure copy_parameters_f, copy_parameters_d
  end interface dtrain_copy_parameters

  !> Collective. dtrain_train_step(run, x, y [, loss, stat, errmsg]): one optimizer step on this
  !> rank's batch x(..., nbatch) against targets y(..., nbatch), y(nbatch) or labels(nbatch).
  !> Local (collective when fully sharded). dtrain_predict(run, x, y [, stat, errmsg]): the
  !> model's output for x into y. dtrain_evaluate(run, x, y [, loss, accuracy, stat, errmsg]):
  !> loss and, with labels, accuracy (-1 otherwise).
  !> Local. dtrain_store_add(run, x, y [, stat, errmsg]): copies pairs into the in-situ store.
  !> Arrays of any rank (assumed-rank dummies), x and values y of one kind, real(c_float) or
  !> real(c_double); labels integer(c_int32_t).
  interface dtrain_train_step
    module procedure train_f, train_f_labels, train_d, train_d_labels
  end interface dtrain_train_step
  interface dtrain_predict
    module procedure predict_f, predict_d
  end interface dtrain_predict
  interface dtrain_evaluate
    module procedure evaluate_f, evaluate_f_labels, evaluate_d, evaluate_d_labels
  end interface dtrain_evaluate
  interface dtrain_store_add
    module procedure store_add_f, store_add_d
  end interface dtrain_store_add

  !> Local. dtrain_checkpoint_array(run, name, a [, stat, errmsg]): every later save holds this
  !> rank's values of array `a` (any rank, real(c_float), real(c_double) or integer(c_int32_t)),
  !> and dtrain_restore_latest loads them back into it: the solver's own state in the same
  !> checkpoint as the model. `a` must be contiguous, declared with TARGET (or allocatable with
  !> TARGET, or a pointer), and live until dtrain_close; register it before
  !> dtrain_restore_latest, with the name and size of the run that saved.
  interface dtrain_checkpoint_array
    module procedure checkpoint_array_f, checkpoint_array_d, checkpoint_array_i
  end interface dtrain_checkpoint_array

  interface
    integer(c_int) function c_create_on_f(comm, path, device, run) &
        bind(c, name='dtrain_create_on_f')
      import :: c_int, c_char, dtrain_run
      integer(c_int), value :: comm, device
      character(kind=c_char), intent(in) :: path(*)
      type(dtrain_run), intent(out) :: run
    end function c_create_on_f
    integer(c_int) function c_close(run) bind(c, name='dtrain_close')
      import :: c_int, dtrain_run
      type(dtrain_run), intent(inout) :: run
    end function c_close
    integer(c_int) function c_copy_last_error(run, buf, size, length) &
        bind(c, name='dtrain_copy_last_error')
      import :: c_int, c_char, c_size_t, dtrain_run
      type(dtrain_run), value :: run
      character(kind=c_char), intent(out) :: buf(*)
      integer(c_size_t), value :: size
      integer(c_size_t), intent(out) :: length
    end function c_copy_last_error
    integer(c_int) function c_input_size(run, v) bind(c, name='dtrain_input_size')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: v
    end function c_input_size
    integer(c_int) function c_output_size(run, v) bind(c, name='dtrain_output_size')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: v
    end function c_output_size
    integer(c_int) function c_step(run, v) bind(c, name='dtrain_step')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: v
    end function c_step
    integer(c_int) function c_parameter_count(run, v) bind(c, name='dtrain_parameter_count')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: v
    end function c_parameter_count
    integer(c_int) function c_rank(run, rank, size) bind(c, name='dtrain_rank')
      import :: c_int, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int), intent(out) :: rank, size
    end function c_rank
    integer(c_int) function c_train_step(run, x, xt, xn, xs, t, tt, tn, ts, loss) &
        bind(c, name='dtrain_train_step')
      import :: c_int, c_int64_t, c_ptr, c_double, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, t
      integer(c_int), value :: xt, xn, tt, tn
      integer(c_int64_t), intent(in) :: xs(*), ts(*)
      real(c_double), intent(out) :: loss
    end function c_train_step
    integer(c_int) function c_predict(run, x, xt, xn, xs, y, yt, yn, ys) &
        bind(c, name='dtrain_predict')
      import :: c_int, c_int64_t, c_ptr, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, y
      integer(c_int), value :: xt, xn, yt, yn
      integer(c_int64_t), intent(in) :: xs(*), ys(*)
    end function c_predict
    integer(c_int) function c_train_step_device(run, x, xt, xn, xs, t, tt, tn, ts, loss) &
        bind(c, name='dtrain_train_step_device')
      import :: c_int, c_int64_t, c_ptr, c_double, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, t
      integer(c_int), value :: xt, xn, tt, tn
      integer(c_int64_t), intent(in) :: xs(*), ts(*)
      real(c_double), intent(out) :: loss
    end function c_train_step_device
    integer(c_int) function c_predict_device(run, x, xt, xn, xs, y, yt, yn, ys) &
        bind(c, name='dtrain_predict_device')
      import :: c_int, c_int64_t, c_ptr, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, y
      integer(c_int), value :: xt, xn, yt, yn
      integer(c_int64_t), intent(in) :: xs(*), ys(*)
    end function c_predict_device
    integer(c_int) function c_evaluate(run, x, xt, xn, xs, t, tt, tn, ts, loss, accuracy) &
        bind(c, name='dtrain_evaluate')
      import :: c_int, c_int64_t, c_ptr, c_double, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, t
      integer(c_int), value :: xt, xn, tt, tn
      integer(c_int64_t), intent(in) :: xs(*), ts(*)
      real(c_double), intent(out) :: loss, accuracy
    end function c_evaluate
    integer(c_int) function c_store_add(run, x, xt, xn, xs, t, tt, tn, ts) &
        bind(c, name='dtrain_store_add')
      import :: c_int, c_int64_t, c_ptr, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: x, t
      integer(c_int), value :: xt, xn, tt, tn
      integer(c_int64_t), intent(in) :: xs(*), ts(*)
    end function c_store_add
    integer(c_int) function c_copy_parameters(run, out, dtype, count) &
        bind(c, name='dtrain_copy_parameters')
      import :: c_int, c_int64_t, c_ptr, dtrain_run
      type(dtrain_run), value :: run
      type(c_ptr), value :: out
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: count
    end function c_copy_parameters
    integer(c_int) function c_save(run) bind(c, name='dtrain_save')
      import :: c_int, dtrain_run
      type(dtrain_run), value :: run
    end function c_save
    integer(c_int) function c_maybe_save(run, saved) bind(c, name='dtrain_maybe_save')
      import :: c_int, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int), intent(out) :: saved
    end function c_maybe_save
    integer(c_int) function c_restore_latest(run, step) bind(c, name='dtrain_restore_latest')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: step
    end function c_restore_latest
    integer(c_int) function c_wait_checkpoints(run) bind(c, name='dtrain_wait_checkpoints')
      import :: c_int, dtrain_run
      type(dtrain_run), value :: run
    end function c_wait_checkpoints
    integer(c_int) function c_checkpoint_array(run, name, data, dtype, count) &
        bind(c, name='dtrain_checkpoint_array')
      import :: c_int, c_int64_t, c_char, c_ptr, dtrain_run
      type(dtrain_run), value :: run
      character(kind=c_char), intent(in) :: name(*)
      type(c_ptr), value :: data
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: count
    end function c_checkpoint_array
    integer(c_int) function c_store_open(run, capacity, eviction, normalise) &
        bind(c, name='dtrain_store_open')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), value :: capacity
      integer(c_int), value :: eviction, normalise
    end function c_store_open
    integer(c_int) function c_store_size(run, stored, fed) bind(c, name='dtrain_store_size')
      import :: c_int, c_int64_t, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), intent(out) :: stored, fed
    end function c_store_size
    integer(c_int) function c_train_step_from_store(run, batch, loss) &
        bind(c, name='dtrain_train_step_from_store')
      import :: c_int, c_int64_t, c_double, dtrain_run
      type(dtrain_run), value :: run
      integer(c_int64_t), value :: batch
      real(c_double), intent(out) :: loss
    end function c_train_step_from_store
  end interface

contains

  !> Local. The calling thread's message of its last failed call on `run` ('' when none).
  function dtrain_last_error(run) result(msg)
    type(dtrain_run), intent(in) :: run
    character(len=:), allocatable :: msg
    character(kind=c_char) :: probe(1)
    character(kind=c_char), allocatable :: buf(:)
    integer(c_size_t) :: n, m
    integer(c_int) :: rc
    integer :: i
    n = 0
    rc = c_copy_last_error(run, probe, 1_c_size_t, n)
    m = n + 1
    allocate(buf(m))
    rc = c_copy_last_error(run, buf, m, n)
    allocate(character(len=int(n)) :: msg)
    do i = 1, int(n)
      msg(i:i) = buf(i)
    end do
  end function dtrain_last_error

  ! The end of every call: stat and errmsg as the caller asked, or print and abort.
  subroutine finish(run, rc, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer(c_int), intent(in) :: rc
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    if (present(stat)) stat = int(rc)
    if (rc == DTRAIN_OK) return
    if (present(errmsg)) errmsg = dtrain_last_error(run)
    if (.not. present(stat)) then
      write(error_unit, '(a)') dtrain_last_error(run)
      call MPI_Abort(MPI_COMM_WORLD, int(rc))
    end if
  end subroutine finish

  function c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char) :: c(len(s) + 1)
    integer :: i
    do i = 1, len(s)
      c(i) = s(i:i)
    end do
    c(len(s) + 1) = c_null_char
  end function c_string

  pure function reversed(s) result(r)
    integer(c_int64_t), intent(in) :: s(:)
    integer(c_int64_t) :: r(size(s))
    r = s(size(s):1:-1)
  end function reversed

  subroutine create_int(run, comm, config_path, stat, errmsg, device)
    type(dtrain_run), intent(out) :: run
    integer, intent(in) :: comm
    character(len=*), intent(in) :: config_path
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer, intent(in), optional :: device
    call finish(run, c_create_on_f(int(comm, c_int), c_string(config_path), &
      device_or_host(device), run), stat, errmsg)
  end subroutine create_int

  subroutine create_f08(run, comm, config_path, stat, errmsg, device)
    type(dtrain_run), intent(out) :: run
    type(MPI_Comm), intent(in) :: comm
    character(len=*), intent(in) :: config_path
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer, intent(in), optional :: device
    call finish(run, c_create_on_f(int(comm%MPI_VAL, c_int), c_string(config_path), &
      device_or_host(device), run), stat, errmsg)
  end subroutine create_f08

  pure integer(c_int) function device_or_host(device)
    integer, intent(in), optional :: device
    device_or_host = int(DTRAIN_HOST, c_int)
    if (present(device)) device_or_host = int(device, c_int)
  end function device_or_host

  !> Collective. Waits for checkpoint writes, frees the run and sets run%id to 0.
  subroutine dtrain_close(run, stat, errmsg)
    type(dtrain_run), intent(inout) :: run
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(dtrain_run) :: was
    was = run
    call finish(was, c_close(run), stat, errmsg)
  end subroutine dtrain_close

  !> Local. Elements of one input and one output sample, optimizer steps taken, learnable
  !> scalars, this rank and the rank count: each optional.
  subroutine dtrain_info(run, input_size, output_size, step, parameter_count, rank, size, &
      stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer(c_int64_t), intent(out), optional :: input_size, output_size, step, parameter_count
    integer, intent(out), optional :: rank, size
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: v
    integer(c_int) :: rc, r, s
    rc = c_input_size(run, v)
    if (rc == DTRAIN_OK .and. present(input_size)) input_size = v
    if (rc == DTRAIN_OK) rc = c_output_size(run, v)
    if (rc == DTRAIN_OK .and. present(output_size)) output_size = v
    if (rc == DTRAIN_OK) rc = c_step(run, v)
    if (rc == DTRAIN_OK .and. present(step)) step = v
    if (rc == DTRAIN_OK) rc = c_parameter_count(run, v)
    if (rc == DTRAIN_OK .and. present(parameter_count)) parameter_count = v
    if (rc == DTRAIN_OK) rc = c_rank(run, r, s)
    if (rc == DTRAIN_OK .and. present(rank)) rank = int(r)
    if (rc == DTRAIN_OK .and. present(size)) size = int(s)
    call finish(run, rc, stat, errmsg)
  end subroutine dtrain_info

  ! The array procedures' common ends: C addresses, element types and Fortran shapes (passed to C
  ! reversed); `device` picks the C API's device entry point.
  subroutine train_any(run, device, xp, xt, xs, tp, tt, ts, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    logical, intent(in) :: device
    type(c_ptr), intent(in) :: xp, tp
    integer, intent(in) :: xt, tt
    integer(c_int64_t), intent(in) :: xs(:), ts(:)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: l
    integer(c_int) :: rc
    l = 0
    if (device) then
      rc = c_train_step_device(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), tp, &
        int(tt, c_int), size(ts, kind=c_int), reversed(ts), l)
    else
      rc = c_train_step(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), tp, &
        int(tt, c_int), size(ts, kind=c_int), reversed(ts), l)
    end if
    if (present(loss)) loss = l
    call finish(run, rc, stat, errmsg)
  end subroutine train_any

  subroutine predict_any(run, device, xp, xt, xs, yp, yt, ys, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    logical, intent(in) :: device
    type(c_ptr), intent(in) :: xp, yp
    integer, intent(in) :: xt, yt
    integer(c_int64_t), intent(in) :: xs(:), ys(:)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: rc
    if (device) then
      rc = c_predict_device(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), yp, &
        int(yt, c_int), size(ys, kind=c_int), reversed(ys))
    else
      rc = c_predict(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), yp, &
        int(yt, c_int), size(ys, kind=c_int), reversed(ys))
    end if
    call finish(run, rc, stat, errmsg)
  end subroutine predict_any

  subroutine evaluate_any(run, xp, xt, xs, tp, tt, ts, loss, accuracy, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    type(c_ptr), intent(in) :: xp, tp
    integer, intent(in) :: xt, tt
    integer(c_int64_t), intent(in) :: xs(:), ts(:)
    real(c_double), intent(out), optional :: loss, accuracy
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: l, a
    integer(c_int) :: rc
    l = 0
    a = -1
    rc = c_evaluate(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), tp, &
      int(tt, c_int), size(ts, kind=c_int), reversed(ts), l, a)
    if (present(loss)) loss = l
    if (present(accuracy)) accuracy = a
    call finish(run, rc, stat, errmsg)
  end subroutine evaluate_any

  subroutine store_add_any(run, xp, xt, xs, tp, tt, ts, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    type(c_ptr), intent(in) :: xp, tp
    integer, intent(in) :: xt, tt
    integer(c_int64_t), intent(in) :: xs(:), ts(:)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call finish(run, c_store_add(run, xp, int(xt, c_int), size(xs, kind=c_int), reversed(xs), tp, &
      int(tt, c_int), size(ts, kind=c_int), reversed(ts)), stat, errmsg)
  end subroutine store_add_any

  ! The C address of a contiguous array of any type and rank (null when it has no elements).
  type(c_ptr) function address(a)
    type(*), intent(in), target, contiguous :: a(..)
    address = c_null_ptr
    if (size(a) > 0) address = c_loc(a)
  end function address

  subroutine copy_parameters_f(run, p, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(inout), target, contiguous :: p(:)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: pp
    pp = c_null_ptr
    if (size(p) > 0) pp = c_loc(p)
    call finish(run, c_copy_parameters(run, pp, int(DTRAIN_F32, c_int), &
      size(p, kind=c_int64_t)), stat, errmsg)
  end subroutine copy_parameters_f

  subroutine copy_parameters_d(run, p, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(inout), target, contiguous :: p(:)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: pp
    pp = c_null_ptr
    if (size(p) > 0) pp = c_loc(p)
    call finish(run, c_copy_parameters(run, pp, int(DTRAIN_F64, c_int), &
      size(p, kind=c_int64_t)), stat, errmsg)
  end subroutine copy_parameters_d

  !> Collective. Saves checkpoint `step` of the run into the configured directory.
  subroutine dtrain_save(run, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call finish(run, c_save(run), stat, errmsg)
  end subroutine dtrain_save

  !> Collective. Saves when the configured interval says so; `saved` tells whether it did.
  subroutine dtrain_maybe_save(run, saved, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    logical, intent(out), optional :: saved
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: s, rc
    s = 0
    rc = c_maybe_save(run, s)
    if (present(saved)) saved = s /= 0
    call finish(run, rc, stat, errmsg)
  end subroutine dtrain_maybe_save

  !> Collective. Restores the newest valid checkpoint; `step` is its step, -1 when none.
  subroutine dtrain_restore_latest(run, step, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer(c_int64_t), intent(out), optional :: step
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: s
    integer(c_int) :: rc
    s = -1
    rc = c_restore_latest(run, s)
    if (present(step)) step = s
    call finish(run, rc, stat, errmsg)
  end subroutine dtrain_restore_latest

  !> Collective. Waits (bounded) for checkpoint writes and flushes, reporting their errors.
  subroutine dtrain_wait_checkpoints(run, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call finish(run, c_wait_checkpoints(run), stat, errmsg)
  end subroutine dtrain_wait_checkpoints

  ! dtrain_checkpoint_array's common end: the array's address (a copy made for a non-contiguous
  ! actual would not outlive the call, so such an array is refused here).
  subroutine checkpoint_array_any(run, name, p, dtype, n, contiguous_ok, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: p
    integer, intent(in) :: dtype
    integer(c_int64_t), intent(in) :: n
    logical, intent(in) :: contiguous_ok
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    character(len=*), parameter :: why = ' is not contiguous: a registered array must be one &
      &block of memory that stays where it is'
    if (.not. contiguous_ok) then
      if (present(stat)) stat = DTRAIN_ERR_INVALID_ARGUMENT
      if (present(errmsg)) errmsg = "dtrain_checkpoint_array: '" // name // "'" // why
      if (.not. present(stat)) then
        write(error_unit, '(a)') "dtrain_checkpoint_array: '" // name // "'" // why
        call MPI_Abort(MPI_COMM_WORLD, int(DTRAIN_ERR_INVALID_ARGUMENT))
      end if
      return
    end if
    call finish(run, c_checkpoint_array(run, c_string(name), p, int(dtype, c_int), n), stat, &
      errmsg)
  end subroutine checkpoint_array_any

  subroutine checkpoint_array_f(run, name, a, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    character(len=*), intent(in) :: name
    real(c_float), intent(inout), target :: a(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: p
    p = c_null_ptr
    if (is_contiguous(a) .and. size(a) > 0) p = c_loc(a)
    call checkpoint_array_any(run, name, p, DTRAIN_F32, size(a, kind=c_int64_t), &
      is_contiguous(a), stat, errmsg)
  end subroutine checkpoint_array_f

  subroutine checkpoint_array_d(run, name, a, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    character(len=*), intent(in) :: name
    real(c_double), intent(inout), target :: a(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: p
    p = c_null_ptr
    if (is_contiguous(a) .and. size(a) > 0) p = c_loc(a)
    call checkpoint_array_any(run, name, p, DTRAIN_F64, size(a, kind=c_int64_t), &
      is_contiguous(a), stat, errmsg)
  end subroutine checkpoint_array_d

  subroutine checkpoint_array_i(run, name, a, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    character(len=*), intent(in) :: name
    integer(c_int32_t), intent(inout), target :: a(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    type(c_ptr) :: p
    p = c_null_ptr
    if (is_contiguous(a) .and. size(a) > 0) p = c_loc(a)
    call checkpoint_array_any(run, name, p, DTRAIN_I32, size(a, kind=c_int64_t), &
      is_contiguous(a), stat, errmsg)
  end subroutine checkpoint_array_i

  !> Local. Opens this rank's in-situ store of `capacity` pairs (eviction DTRAIN_EVICT_OLDEST by
  !> default, or DTRAIN_EVICT_RESERVOIR); `normalise` (default .false.) normalises the inputs per
  !> channel by running statistics of everything fed on every rank.
  subroutine dtrain_store_open(run, capacity, eviction, normalise, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer, intent(in) :: capacity
    integer, intent(in), optional :: eviction
    logical, intent(in), optional :: normalise
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int) :: e, n
    e = DTRAIN_EVICT_OLDEST
    if (present(eviction)) e = int(eviction, c_int)
    n = 0
    if (present(normalise)) then
      if (normalise) n = 1
    end if
    call finish(run, c_store_open(run, int(capacity, c_int64_t), e, n), stat, errmsg)
  end subroutine dtrain_store_open

  !> Local. Pairs stored on this rank and pairs ever fed to it.
  subroutine dtrain_store_size(run, stored, fed, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer(c_int64_t), intent(out), optional :: stored, fed
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    integer(c_int64_t) :: s, f
    integer(c_int) :: rc
    rc = c_store_size(run, s, f)
    if (present(stored)) stored = s
    if (present(fed)) fed = f
    call finish(run, rc, stat, errmsg)
  end subroutine dtrain_store_size

  !> Collective. One optimizer step on `batch` pairs drawn from this rank's store.
  subroutine dtrain_train_step_from_store(run, batch, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    integer, intent(in) :: batch
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    real(c_double) :: l
    integer(c_int) :: rc
    l = 0
    rc = c_train_step_from_store(run, int(batch, c_int64_t), l)
    if (present(loss)) loss = l
    call finish(run, rc, stat, errmsg)
  end subroutine dtrain_train_step_from_store

  ! The specific procedures of the generic interfaces: one per element type of x and of y.

  subroutine train_f(run, x, y, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..), y(..)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call train_any(run, .false., address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_F32, shape(y, c_int64_t), loss, stat, errmsg)
  end subroutine train_f

  subroutine evaluate_f(run, x, y, loss, accuracy, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..), y(..)
    real(c_double), intent(out), optional :: loss, accuracy
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call evaluate_any(run, address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_F32, shape(y, c_int64_t), loss, accuracy, stat, errmsg)
  end subroutine evaluate_f

  subroutine train_f_labels(run, x, y, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..)
    integer(c_int32_t), intent(in), target, contiguous :: y(..)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call train_any(run, .false., address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_I32, shape(y, c_int64_t), loss, stat, errmsg)
  end subroutine train_f_labels

  subroutine evaluate_f_labels(run, x, y, loss, accuracy, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..)
    integer(c_int32_t), intent(in), target, contiguous :: y(..)
    real(c_double), intent(out), optional :: loss, accuracy
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call evaluate_any(run, address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_I32, shape(y, c_int64_t), loss, accuracy, stat, errmsg)
  end subroutine evaluate_f_labels

  subroutine predict_f(run, x, y, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..)
    real(c_float), intent(inout), target, contiguous :: y(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call predict_any(run, .false., address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_F32, shape(y, c_int64_t), stat, errmsg)
  end subroutine predict_f

  subroutine store_add_f(run, x, y, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_float), intent(in), target, contiguous :: x(..), y(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call store_add_any(run, address(x), DTRAIN_F32, shape(x, c_int64_t), &
      address(y), DTRAIN_F32, shape(y, c_int64_t), stat, errmsg)
  end subroutine store_add_f

  subroutine train_d(run, x, y, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..), y(..)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call train_any(run, .false., address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_F64, shape(y, c_int64_t), loss, stat, errmsg)
  end subroutine train_d

  subroutine evaluate_d(run, x, y, loss, accuracy, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..), y(..)
    real(c_double), intent(out), optional :: loss, accuracy
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call evaluate_any(run, address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_F64, shape(y, c_int64_t), loss, accuracy, stat, errmsg)
  end subroutine evaluate_d

  subroutine train_d_labels(run, x, y, loss, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..)
    integer(c_int32_t), intent(in), target, contiguous :: y(..)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call train_any(run, .false., address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_I32, shape(y, c_int64_t), loss, stat, errmsg)
  end subroutine train_d_labels

  subroutine evaluate_d_labels(run, x, y, loss, accuracy, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..)
    integer(c_int32_t), intent(in), target, contiguous :: y(..)
    real(c_double), intent(out), optional :: loss, accuracy
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call evaluate_any(run, address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_I32, shape(y, c_int64_t), loss, accuracy, stat, errmsg)
  end subroutine evaluate_d_labels

  subroutine predict_d(run, x, y, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..)
    real(c_double), intent(inout), target, contiguous :: y(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call predict_any(run, .false., address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_F64, shape(y, c_int64_t), stat, errmsg)
  end subroutine predict_d

  subroutine store_add_d(run, x, y, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    real(c_double), intent(in), target, contiguous :: x(..), y(..)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call store_add_any(run, address(x), DTRAIN_F64, shape(x, c_int64_t), &
      address(y), DTRAIN_F64, shape(y, c_int64_t), stat, errmsg)
  end subroutine store_add_d

  !> Collective. One optimizer step on device arrays, as dtrain_train_step, for a run made with a
  !> `device`: x and y are the C addresses of the arrays in that GPU's memory, x_type and y_type
  !> their element types (DTRAIN_F32 or DTRAIN_F64, the model's own: nothing is converted on the
  !> device; DTRAIN_I32 for class labels), x_shape and y_shape their Fortran shapes (shape(x)).
  !> OpenACC: c_loc(x) inside `!$acc host_data use_device(x)`; CUDA Fortran (device arrays):
  !> c_devloc(x)%cptr. Finish the device work that writes x and y first (e.g. `!$acc wait`,
  !> cudaDeviceSynchronize): the run reads them on its own stream. They may change on return.
  subroutine dtrain_train_step_device(run, x, x_type, x_shape, y, y_type, y_shape, loss, stat, &
      errmsg)
    type(dtrain_run), intent(in) :: run
    type(c_ptr), intent(in) :: x, y
    integer, intent(in) :: x_type, y_type
    integer, intent(in) :: x_shape(:), y_shape(:)
    real(c_double), intent(out), optional :: loss
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call train_any(run, .true., x, x_type, int(x_shape, c_int64_t), y, y_type, &
      int(y_shape, c_int64_t), loss, stat, errmsg)
  end subroutine dtrain_train_step_device

  !> Local (collective when fully sharded). The model's output for device array x into device
  !> array y, as dtrain_predict; arguments as dtrain_train_step_device's (y_type the model's).
  !> y is written when the call returns.
  subroutine dtrain_predict_device(run, x, x_type, x_shape, y, y_type, y_shape, stat, errmsg)
    type(dtrain_run), intent(in) :: run
    type(c_ptr), intent(in) :: x, y
    integer, intent(in) :: x_type, y_type
    integer, intent(in) :: x_shape(:), y_shape(:)
    integer, intent(out), optional :: stat
    character(len=*), intent(inout), optional :: errmsg
    call predict_any(run, .true., x, x_type, int(x_shape, c_int64_t), y, y_type, &
      int(y_shape, c_int64_t), stat, errmsg)
  end subroutine dtrain_predict_device

end module dtrain
