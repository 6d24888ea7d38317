! An outside Fortran project against the installed package: two optimizer steps of the run in
! run.yaml (argument 1) on 2 ranks, the loss falling, and a wrong shape refused through stat.
program consumer_fortran
  use, intrinsic :: iso_c_binding, only: c_double
  use mpi_f08
  use dtrain
  implicit none
  type(dtrain_run) :: run
  real(c_double) :: x(4, 8), y(2, 8), wrong(3, 8), first, loss
  character(len=256) :: path, msg
  integer :: i, stat, rank

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call get_command_argument(1, path)
  call dtrain_create(run, MPI_COMM_WORLD, trim(path))
  do i = 1, 8
    x(:, i) = [real(c_double) :: i, -i, 2 * i, 1] / 8
    y(:, i) = [sum(x(:, i)), x(1, i) - x(2, i)]
  end do
  call dtrain_train_step(run, x, y, first)
  do i = 1, 20
    call dtrain_train_step(run, x, y, loss)
  end do
  wrong = 0
  call dtrain_train_step(run, wrong, y, stat=stat, errmsg=msg)
  call dtrain_close(run)
  if (rank == 0) print '(a,es10.3,a,es10.3)', 'consumer_fortran: loss ', first, ' -> ', loss
  call MPI_Finalize()
  if (.not. (loss < first .and. stat == DTRAIN_ERR_INVALID_ARGUMENT .and. &
    index(msg, 'x has shape {8, 3}') > 0)) error stop 1
end program consumer_fortran
