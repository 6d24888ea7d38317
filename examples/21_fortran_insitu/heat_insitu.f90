! Example 21: a Fortran MPI solver trains a CNN surrogate of its own field while it runs, through
! `use dtrain` and a configuration file (examples/configs/heat_surrogate.yaml).
!
! The solver: u_t = D (u_xx + u_yy) on a periodic nx x ny grid, explicit five-point steps
! (r = D dt / dx^2), rows split over the ranks of MPI_COMM_WORLD, each rank holding its rows plus
! `halo` ghost rows either side, kept current by its own halo exchange (MPI_Sendrecv), and `halo`
! wrapped columns either side. Every `horizon` steps each rank cuts its rows into patches of
! `prow` rows with `halo` cells of context on every side, scales each by its own mean and RMS, and
! feeds (patch, change of its inner cells over the last `horizon` steps) to its in-situ store; every
! `train_every` steps it takes `opt_steps` optimizer steps on batches drawn from the store. The
! model (four unpadded 3 x 3 convolutions: a receptive field of 9 x 9 = 2 halo + 1) maps a patch
! x(nx + 2 halo, prow + 2 halo, 1, b) to the change of its inner cells y(nx, prow, 1, b): Fortran
! arrays as they are, which dtrain reads as channels-first samples [b][1][prow+2h][nx+2h].
!
! Checkpoints: dtrain saves model, optimizer and store (dtrain_save) every `ckpt_every` steps,
! and in the same file the solver's own state, registered once with dtrain_checkpoint_array (the
! field, its snapshot, the step and the initial heat), so a run stopped anywhere (--stop-after)
! resumes from the newest checkpoint and ends in the same bits. At the end the surrogate is rolled out n_roll x horizon steps from the
! final field and its error is printed beside persistence's (the field unchanged); it must be at
! most half of it. Four applications: beyond them the learned operator amplifies modes that the
! smooth training fields never excite (about 2x per application). Exit 1 when a check fails.
!
!   mpiexec.mpich -n 2 fortran_insitu examples/configs/heat_surrogate.yaml [--steps 240]
!                                     [--stop-after N]
module heat_solver
  use, intrinsic :: iso_fortran_env, only: real64
  use mpi_f08
  implicit none
  private

  !> The rank's share of the grid: columns 1..nx (wrapped: 1-h..nx+h), rows 1..rows (ghost rows
  !> 1-h..0 and rows+1..rows+h), global row of local row 1 is row0 + 1.
  type, public :: grid
    integer :: nx = 0, ny = 0, rows = 0, row0 = 0, h = 0, rank = 0, size = 1
  end type grid

  public :: make_grid, exchange, step, initial_field, total, distance2

contains

  function make_grid(nx, ny, h) result(g)
    integer, intent(in) :: nx, ny, h
    type(grid) :: g
    call MPI_Comm_rank(MPI_COMM_WORLD, g%rank)
    call MPI_Comm_size(MPI_COMM_WORLD, g%size)
    g%nx = nx
    g%ny = ny
    g%h = h
    g%row0 = ny * g%rank / g%size
    g%rows = ny * (g%rank + 1) / g%size - g%row0
  end function make_grid

  !> Wraps the columns and exchanges `h` ghost rows with the neighbours (periodic in both axes).
  subroutine exchange(g, u)
    type(grid), intent(in) :: g
    real(real64), intent(inout) :: u(1 - g%h:, 1 - g%h:)
    integer :: up, down, n
    u(1 - g%h:0, 1:g%rows) = u(g%nx - g%h + 1:g%nx, 1:g%rows)
    u(g%nx + 1:g%nx + g%h, 1:g%rows) = u(1:g%h, 1:g%rows)
    up = modulo(g%rank - 1, g%size)
    down = modulo(g%rank + 1, g%size)
    n = (g%nx + 2 * g%h) * g%h
    call MPI_Sendrecv(u(:, g%rows - g%h + 1:g%rows), n, MPI_DOUBLE_PRECISION, down, 1, &
      u(:, 1 - g%h:0), n, MPI_DOUBLE_PRECISION, up, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    call MPI_Sendrecv(u(:, 1:g%h), n, MPI_DOUBLE_PRECISION, up, 2, &
      u(:, g%rows + 1:g%rows + g%h), n, MPI_DOUBLE_PRECISION, down, 2, MPI_COMM_WORLD, &
      MPI_STATUS_IGNORE)
  end subroutine exchange

  !> One explicit step with diffusion number r, then the exchange.
  subroutine step(g, u, tmp, r)
    type(grid), intent(in) :: g
    real(real64), intent(inout) :: u(1 - g%h:, 1 - g%h:), tmp(1 - g%h:, 1 - g%h:)
    real(real64), intent(in) :: r
    integer :: i, j
    do j = 1, g%rows
      do i = 1, g%nx
        tmp(i, j) = u(i, j) + r * (u(i - 1, j) + u(i + 1, j) + u(i, j - 1) + u(i, j + 1) &
          - 4 * u(i, j))
      end do
    end do
    u(1:g%nx, 1:g%rows) = tmp(1:g%nx, 1:g%rows)
    call exchange(g, u)
  end subroutine step

  !> Warm and cold Gaussian blobs on 1, at places fixed by the global grid (any rank count).
  subroutine initial_field(g, u)
    type(grid), intent(in) :: g
    real(real64), intent(out) :: u(1 - g%h:, 1 - g%h:)
    integer :: i, j, k
    real(real64) :: cx, cy, s, a, dx, dy
    u = 1
    do k = 0, 11
      cx = modulo(17.3_real64 * k + 5, real(g%nx, real64))
      cy = modulo(29.1_real64 * k + 11, real(g%ny, real64))
      s = 2 + modulo(1.7_real64 * k, 3.0_real64)
      a = merge(1.0_real64, -1.0_real64, mod(k, 2) == 0) * (0.5_real64 + 0.05_real64 * k)
      do j = 1, g%rows
        do i = 1, g%nx
          dx = abs(i - 1 - cx)
          dx = min(dx, g%nx - dx)
          dy = abs(g%row0 + j - 1 - cy)
          dy = min(dy, g%ny - dy)
          u(i, j) = u(i, j) + a * exp(-(dx * dx + dy * dy) / (2 * s * s))
        end do
      end do
    end do
    call exchange(g, u)
  end subroutine initial_field

  !> Collective: the sum of the field over the whole grid.
  function total(g, u) result(t)
    type(grid), intent(in) :: g
    real(real64), intent(in) :: u(1 - g%h:, 1 - g%h:)
    real(real64) :: t
    t = sum(u(1:g%nx, 1:g%rows))
    call MPI_Allreduce(MPI_IN_PLACE, t, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  end function total

  !> Collective: the squared distance of two fields over the whole grid.
  function distance2(g, a, b) result(d)
    type(grid), intent(in) :: g
    real(real64), intent(in) :: a(1 - g%h:, 1 - g%h:), b(1 - g%h:, 1 - g%h:)
    real(real64) :: d
    d = sum((a(1:g%nx, 1:g%rows) - b(1:g%nx, 1:g%rows))**2)
    call MPI_Allreduce(MPI_IN_PLACE, d, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  end function distance2

end module heat_solver

program fortran_insitu
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int64_t
  use, intrinsic :: iso_fortran_env, only: real64, output_unit, error_unit
  use mpi_f08
  use dtrain
  use heat_solver
  implicit none

  ! Grid, patch rows, halo (the model's reach), diffusion number, steps between samples, between
  ! training rounds, optimizer steps per round, batch, store capacity, checkpoint interval,
  ! surrogate applications in the final rollout, and the margin over persistence.
  integer, parameter :: nx = 32, ny = 48, prow = 8, h = 4, horizon = 4, train_every = 4
  integer, parameter :: opt_steps = 4, batch = 8, capacity = 64, ckpt_every = 40, n_roll = 4
  real(real64), parameter :: r = 0.2_real64, margin = 0.5_real64

  type(grid) :: g
  type(dtrain_run) :: run
  character(len=1024) :: config, arg
  integer :: steps, stop_after, it, provided, np, p, k
  integer(c_int64_t) :: restored, stored, opt_step
  real(real64), allocatable, target :: u(:, :), snap(:, :)
  real(real64), allocatable :: tmp(:, :), v(:, :), f(:, :)
  ! The solver's scalars in its checkpoints: step, initial heat, first and last loss.
  real(real64), target :: state(4)
  real(c_float), allocatable :: x(:, :, :, :), y(:, :, :, :)
  real(real64), allocatable :: scale(:)
  real(real64) :: initial_total, drift, change, err_cnn, err_persist, first_loss, loss
  logical :: ok

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided)
  steps = 240
  stop_after = -1
  config = ''
  k = 1
  do while (k <= command_argument_count())
    call get_command_argument(k, arg)
    select case (trim(arg))
    case ('--steps')
      k = k + 1
      call get_command_argument(k, arg)
      read (arg, *) steps
    case ('--stop-after')
      k = k + 1
      call get_command_argument(k, arg)
      read (arg, *) stop_after
    case default
      config = arg
    end select
    k = k + 1
  end do
  g = make_grid(nx, ny, h)
  if (len_trim(config) == 0 .or. mod(g%rows, prow) /= 0) then
    if (g%rank == 0) write (error_unit, '(a,i0,a)') 'usage: fortran_insitu CONFIG [--steps N] &
      &[--stop-after N], on a rank count that splits ', ny, ' rows into multiples of 8'
    call MPI_Finalize()
    stop 2
  end if
  np = g%rows / prow  ! patches per rank

  allocate (u(1 - h:nx + h, 1 - h:g%rows + h), source=0.0_real64)
  allocate (snap, tmp, v, f, mold=u)
  allocate (x(nx + 2 * h, prow + 2 * h, 1, np), y(nx, prow, 1, np), scale(np))

  ! The run described by the file: model, optimizer, gradient all-reduce, checkpoint directory.
  call dtrain_create(run, MPI_COMM_WORLD, trim(config))
  call dtrain_store_open(run, capacity)
  call dtrain_checkpoint_array(run, 'u', u)
  call dtrain_checkpoint_array(run, 'snap', snap)
  call dtrain_checkpoint_array(run, 'state', state)
  call dtrain_restore_latest(run, restored)
  first_loss = -1
  if (restored >= 0) then
    it = nint(state(1))
    initial_total = state(2)
    first_loss = state(3)
    loss = state(4)
    if (g%rank == 0) write (output_unit, '(a,i0,a,i0)') 'resumed at step ', it, &
      ' from checkpoint ', restored
  else
    it = 0
    call initial_field(g, u)
    snap = u
    initial_total = total(g, u)
  end if
  call dtrain_info(run, parameter_count=opt_step)
  if (g%rank == 0) write (output_unit, '(a,i0,a,i0,a,i0,a,i0,a,i0,a)') 'heat_insitu: ', g%size, &
    ' ranks, ', nx, 'x', ny, ' grid, ', np, ' patches per rank, CNN ', opt_step, ' parameters'

  loss = 0
  do while (it < steps)
    if (it == stop_after) then
      if (g%rank == 0) write (output_unit, '(a,i0,a)') 'stopping at step ', it, &
        ' without saving (--stop-after)'
      call dtrain_close(run)
      call MPI_Finalize()
      stop
    end if
    call dtrain_store_size(run, stored)
    if (mod(it, train_every) == 0 .and. stored >= batch) then
      do k = 1, opt_steps
        call dtrain_train_step_from_store(run, batch, loss)
      end do
      if (first_loss < 0) first_loss = loss
    end if
    call step(g, u, tmp, r)
    it = it + 1
    if (mod(it, horizon) == 0) then
      ! The pair: the snapshot taken `horizon` steps ago and its change since, per patch.
      call patches(snap, x, scale)
      do p = 1, np
        y(:, :, 1, p) = real((u(1:nx, (p - 1) * prow + 1:p * prow) &
          - snap(1:nx, (p - 1) * prow + 1:p * prow)) / (scale(p) * r * horizon), c_float)
      end do
      call dtrain_store_add(run, x, y)
      snap = u
    end if
    if (mod(it, 40) == 0 .and. g%rank == 0) write (output_unit, '(a,i5,a,es10.3)') 'step ', it, &
      '  loss ', loss
    if (mod(it, ckpt_every) == 0 .and. it < steps) call save_state()
  end do
  call save_state()
  drift = abs(total(g, u) - initial_total) / abs(initial_total)

  ! Rollout from the final field: the solver's n_roll * horizon steps (the reference), the
  ! surrogate applied n_roll times, and persistence; errors relative to the field's change.
  v = u
  do k = 1, n_roll * horizon
    call step(g, v, tmp, r)
  end do
  change = distance2(g, v, u)
  f = u
  do k = 1, n_roll
    call patches(f, x, scale)
    call dtrain_predict(run, x, y)
    do p = 1, np
      f(1:nx, (p - 1) * prow + 1:p * prow) = f(1:nx, (p - 1) * prow + 1:p * prow) &
        + real(y(:, :, 1, p), real64) * scale(p) * r * horizon
    end do
    call exchange(g, f)
  end do
  err_cnn = sqrt(distance2(g, f, v) / change)
  err_persist = sqrt(distance2(g, u, v) / change)
  call dtrain_info(run, step=opt_step)
  ok = drift < 1e-12_real64 .and. err_cnn < margin * err_persist
  if (g%rank == 0) then
    write (output_unit, '(a,es9.2,a)') 'total heat relative drift ', drift, &
      merge(' (conserved)    ', ' (NOT CONSERVED)', drift < 1e-12_real64)
    write (output_unit, '(a,i0,a,es10.3,a,es10.3)') 'training: ', opt_step, &
      ' optimizer steps, loss first ', first_loss, ', last ', loss
    write (output_unit, '(a,i0,a,i0,a,f7.4,a,f7.4,a,f4.2,a,a)') 'rollout: ', n_roll, ' x ', &
      horizon, ' steps, error relative to the field''s change: CNN ', err_cnn, &
      ', persistence ', err_persist, ' (CNN below ', margin, ' x persistence: ', &
      merge('ok)    ', 'FAILED)', err_cnn < margin * err_persist)
    write (output_unit, '(a,i0,a,i0)') 'final state: step ', it, ' checkpoint ', opt_step
  end if
  call dtrain_close(run)
  call MPI_Finalize()
  if (.not. ok) error stop 1

contains

  !> Each patch of field `a` (its prow rows and h cells around), scaled by its own mean and RMS.
  subroutine patches(a, xp, s)
    real(real64), intent(in) :: a(1 - h:, 1 - h:)
    real(c_float), intent(out) :: xp(:, :, :, :)
    real(real64), intent(out) :: s(:)
    real(real64) :: m
    integer :: q, j0
    do q = 1, np
      j0 = (q - 1) * prow
      associate (w => a(1 - h:nx + h, j0 + 1 - h:j0 + prow + h))
        m = sum(w) / size(w)
        s(q) = max(sqrt(sum((w - m)**2) / size(w)), 1e-30_real64)
        xp(:, :, 1, q) = real((w - m) / s(q), c_float)
      end associate
    end do
  end subroutine patches

  !> The solver's scalars into the registered array, then the checkpoint (which holds u and snap
  !> as they are now).
  subroutine save_state()
    state = [real(it, real64), initial_total, first_loss, loss]
    call dtrain_save(run)
  end subroutine save_state

end program fortran_insitu
