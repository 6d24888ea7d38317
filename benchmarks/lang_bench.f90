! SPDX-License-Identifier: BSD-3-Clause
! lang_bench: the cost of training through the Fortran module. One run description (argument 1;
! examples/configs/heat_surrogate.yaml: the in-situ example's patch CNN, batch 4 per rank) is
! built twice on the same ranks, once through `use dtrain` and once as a C++ ConfiguredRun
! (lang_bench_cpp.cpp), and both train on the same arrays: blocks of `block` steps alternate
! between the two paths for `rounds` rounds after a warm-up (which path goes first alternates
! too), each block timed between barriers, slowest rank. Prints each path's median time per step,
! and the median over the rounds of the round's ratio (Fortran / C++): two blocks run back to back
! see the same machine, so the ratio holds on a loaded one where the times do not. Last, the cost
! of crossing the boundary alone: 100000 calls of dtrain_info(run, step=...) (Fortran wrapper,
! C entry, run lookup, the C++ call), per call.
!   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 2 lang_bench <config.yaml> [rounds] [block]
program lang_bench
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int64_t, c_char, c_null_char, c_int
  use mpi_f08
  use dtrain
  implicit none
  interface
    real(c_double) function lang_bench_cpp_steps(comm, path, x, y, batch, steps) bind(c)
      import :: c_double, c_int, c_char, c_float, c_int64_t
      integer(c_int), value :: comm
      character(kind=c_char), intent(in) :: path(*)
      real(c_float), intent(in) :: x(*), y(*)
      integer(c_int64_t), value :: batch, steps
    end function lang_bench_cpp_steps
    subroutine lang_bench_cpp_close() bind(c)
    end subroutine lang_bench_cpp_close
  end interface
  integer, parameter :: batch = 4
  type(dtrain_run) :: run
  real(c_float), allocatable :: x(:, :, :, :), y(:, :, :, :)
  real(c_double), allocatable :: tf(:), tc(:), ratio(:)
  real(c_double) :: t0, t, loss, mf, mc
  integer(c_int64_t) :: nin, nout
  character(len=512) :: config, arg
  character(kind=c_char), allocatable :: cpath(:)
  integer :: rank, nranks, rounds, block, r, k, i

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call get_command_argument(1, config)
  rounds = 15
  block = 10
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read(arg, *) rounds
  end if
  if (command_argument_count() >= 3) then
    call get_command_argument(3, arg)
    read(arg, *) block
  end if
  allocate(cpath(len_trim(config) + 1))
  do i = 1, len_trim(config)
    cpath(i) = config(i:i)
  end do
  cpath(len_trim(config) + 1) = c_null_char

  call dtrain_create(run, MPI_COMM_WORLD, trim(config))
  call dtrain_info(run, input_size=nin, output_size=nout)
  ! The in-situ example's patches: input (40, 16, 1, batch), target (32, 8, 1, batch).
  allocate(x(40, 16, 1, batch), y(32, 8, 1, batch))
  if (size(x) /= nin * batch .or. size(y) /= nout * batch) error stop 'lang_bench: config shapes'
  do i = 1, size(x)
    x(mod(i - 1, 40) + 1, mod((i - 1) / 40, 16) + 1, 1, (i - 1) / 640 + 1) = &
      real(sin(0.37d0 * i + rank), c_float)
  end do
  y = 0.1_c_float * x(5:36, 5:12, :, :)
  allocate(tf(rounds), tc(rounds), ratio(rounds))
  ! Warm-up: both paths, first allocations and the MPI connections.
  do k = 1, block
    call dtrain_train_step(run, x, y, loss)
  end do
  if (lang_bench_cpp_steps(MPI_COMM_WORLD%MPI_VAL, cpath, x, y, int(batch, c_int64_t), &
    int(block, c_int64_t)) < 0) error stop 'lang_bench: the C++ run failed'
  do r = 1, rounds
    if (mod(r, 2) == 0) call cpp_block(tc(r))
    call MPI_Barrier(MPI_COMM_WORLD)
    t0 = MPI_Wtime()
    do k = 1, block
      call dtrain_train_step(run, x, y, loss)
    end do
    t = MPI_Wtime() - t0
    call MPI_Allreduce(t, tf(r), 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
    if (mod(r, 2) == 1) call cpp_block(tc(r))
    ratio(r) = tf(r) / tc(r)
  end do
  call MPI_Barrier(MPI_COMM_WORLD)
  t0 = MPI_Wtime()
  do k = 1, 100000
    call dtrain_info(run, step=nin)
  end do
  t = (MPI_Wtime() - t0) / 100000
  mf = median(tf) / block
  mc = median(tc) / block
  if (rank == 0) then
    print '(a,i0,a,i0,a,i0,a)', '# lang_bench: ', nranks, ' ranks, batch ', batch, &
      ' per rank, ', rounds, ' rounds'
    print '(a,i0,a)', '# blocks of ', block, ' steps alternating, median of the slowest rank'
    print '(a)', '# path       time/step(us)'
    print '(a,f12.1)', 'fortran     ', mf * 1e6
    print '(a,f12.1)', 'cpp         ', mc * 1e6
    print '(a,f8.4,a,f8.4,a,f8.4)', 'ratio fortran/cpp (median of rounds) ', median(ratio), &
      '  quartiles ', quantile(ratio, 0.25d0), ' ', quantile(ratio, 0.75d0)
    print '(a,f8.3,a,f8.5,a)', 'boundary crossing (dtrain_info) ', t * 1e6, ' us per call = ', &
      t / mc * 100, ' % of the C++ step'
  end if
  call dtrain_close(run)
  call lang_bench_cpp_close()
  call MPI_Finalize()

contains

  ! One timed block of C++ steps, slowest rank.
  subroutine cpp_block(tmax)
    real(c_double), intent(out) :: tmax
    real(c_double) :: tc1
    call MPI_Barrier(MPI_COMM_WORLD)
    tc1 = lang_bench_cpp_steps(MPI_COMM_WORLD%MPI_VAL, cpath, x, y, int(batch, c_int64_t), &
      int(block, c_int64_t))
    call MPI_Allreduce(tc1, tmax, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
  end subroutine cpp_block

  real(c_double) function quantile(v, q)
    real(c_double), intent(in) :: v(:), q
    real(c_double) :: s(size(v))
    s = sorted(v)
    quantile = s(max(1, min(size(s), nint(q * (size(s) - 1)) + 1)))
  end function quantile

  function sorted(v) result(s)
    real(c_double), intent(in) :: v(:)
    real(c_double) :: s(size(v)), tmp
    integer :: a, b
    s = v
    do a = 2, size(s)
      tmp = s(a)
      b = a - 1
      do while (b >= 1)
        if (s(b) <= tmp) exit
        s(b + 1) = s(b)
        b = b - 1
      end do
      s(b + 1) = tmp
    end do
  end function sorted

  real(c_double) function median(v)
    real(c_double), intent(in) :: v(:)
    real(c_double) :: s(size(v))
    s = sorted(v)
    median = 0.5d0 * (s((size(s) + 1) / 2) + s(size(s) / 2 + 1))
  end function median

end program lang_bench
