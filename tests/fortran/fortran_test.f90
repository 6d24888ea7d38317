! SPDX-License-Identifier: BSD-3-Clause
! The Fortran module on 2 ranks: the run of tests/c_api/mlp.yaml trained on the batches of
! tests/c_api/lang_data.h (the same integer formulas here), with Fortran arrays x(4, 2, nbatch)
! (the model's Input [2, 4] reversed) and y(3, nbatch); prediction against evaluation, a strided
! section (copied in by the compiler) against its contiguous copy, class labels, checkpoints and a
! restore into a run made from an integer communicator, and the error paths through stat and
! errmsg (wrong shape, bad and missing configuration files, a closed run). The device procedures
! with C addresses of the emulated device's memory (this test's build of the C API): a run on
! device 0 trains and predicts from device arrays with the bits of the host run fed the same host
! arrays. Rank 0 writes the parameters after 5 steps (float32, native order) for the same-bits
! comparison.
!   mpiexec -n 2 fortran_test <mlp.yaml> <bad_key.yaml> <params output file>
program fortran_test
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int32_t, c_int64_t, c_ptr, c_loc, &
    c_size_t
  use mpi_f08
  use dtrain
  implicit none
  ! The emulated device's memory (tests/c_api/emulated_device_c.h).
  interface
    type(c_ptr) function test_device_alloc(bytes) bind(c, name='test_device_alloc')
      import :: c_ptr, c_size_t
      integer(c_size_t), value :: bytes
    end function test_device_alloc
    subroutine test_device_free(p, bytes) bind(c, name='test_device_free')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: p
      integer(c_size_t), value :: bytes
    end subroutine test_device_free
    subroutine test_device_upload(dst, src, bytes) bind(c, name='test_device_upload')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: dst, src
      integer(c_size_t), value :: bytes
    end subroutine test_device_upload
    subroutine test_device_download(dst, src, bytes) bind(c, name='test_device_download')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: dst, src
      integer(c_size_t), value :: bytes
    end subroutine test_device_download
  end interface
  integer, parameter :: nin = 8, nout = 3, nbatch = 4, nsteps = 5
  type(dtrain_run) :: run, again, closed, dev
  real(c_float), target :: x(4, 2, nbatch), t(nout, nbatch), big(4, 2, 2 * nbatch), &
    wrong(5, 2, nbatch)
  real(c_float), allocatable :: p(:), back(:)
  real(c_float), target :: y(nout, nbatch), ys(nout, nbatch)
  real(c_double) :: loss, eval_loss, mse, accuracy, dloss
  type(c_ptr) :: dx, dt, dy
  integer(c_size_t) :: xbytes, tbytes
  integer(c_int32_t) :: labels(nbatch)
  integer(c_int64_t) :: nparams, step, insize, outsize
  character(len=512) :: config, bad, out
  character(len=256) :: msg
  integer :: rank, nranks, stat, s, failures, total, u
  logical :: saved

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  failures = 0
  call get_command_argument(1, config)
  call get_command_argument(2, bad)
  call get_command_argument(3, out)

  ! A bad file and a missing one: status and message, no run.
  msg = ''
  call dtrain_create(run, MPI_COMM_WORLD, trim(bad), stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. index(msg, 'bad_key.yaml') > 0 .and. &
    index(msg, 'bias_typo') > 0 .and. run%id == 0, 'bad configuration file: ' // trim(msg))
  call dtrain_create(run, MPI_COMM_WORLD, 'no_such_dir/run.yaml', stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_IO .and. index(msg, 'no_such_dir/run.yaml') > 0, &
    'missing file: ' // trim(msg))

  call dtrain_create(run, MPI_COMM_WORLD, trim(config))
  call dtrain_info(run, input_size=insize, output_size=outsize, parameter_count=nparams, &
    rank=s, size=nranks)
  call check(insize == nin .and. outsize == nout .and. s == rank .and. nranks == 2, 'info')
  do s = 0, nsteps - 1
    call fill(s, x, t)
    call dtrain_train_step(run, x, t, loss)
    call check(loss > 0, 'loss')
    call dtrain_maybe_save(run, saved)
    call check(saved .eqv. (s + 1 == 3), 'maybe_save interval')
  end do
  allocate(p(nparams), back(nparams))
  call dtrain_copy_parameters(run, p)
  if (rank == 0) then
    open(newunit=u, file=trim(out), access='stream', form='unformatted', status='replace')
    write(u) p
    close(u)
  end if
  call dtrain_save(run)
  call dtrain_wait_checkpoints(run)

  ! Prediction, against evaluation's loss.
  call fill(nsteps, x, t)
  call dtrain_predict(run, x, y)
  call dtrain_evaluate(run, x, t, eval_loss)
  mse = sum((real(y, c_double) - real(t, c_double))**2) / size(y)
  call check(abs(eval_loss - mse) < 1e-5_c_double * mse, 'evaluate against predict')
  ! A strided section: every other sample of `big`, copied in by the compiler.
  big = 0
  big(:, :, 1::2) = x
  call dtrain_predict(run, big(:, :, 1::2), ys)
  call check(all_same_bits(reshape(ys, [size(ys)]), reshape(y, [size(y)])), 'strided section')
  ! Class labels (0-based): mse against one-hot targets, accuracy in [0, 1].
  labels = [0, 1, 2, 1]
  call dtrain_evaluate(run, x, labels, eval_loss, accuracy)
  call check(eval_loss > 0 .and. accuracy >= 0 .and. accuracy <= 1, 'labels')

  ! A wrong shape: status and message in C order, nothing trained.
  wrong = 0
  call dtrain_train_step(run, wrong, t, stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. index(msg, 'x has shape {4, 2, 5}') > 0, &
    'wrong shape: ' // trim(msg))
  call dtrain_info(run, step=step)
  call check(step == nsteps, 'step after a refused call')

  ! A run from the integer handle restores the saved step with the same bits.
  call dtrain_create(again, MPI_COMM_WORLD%MPI_VAL, trim(config))
  call dtrain_restore_latest(again, step)
  call check(step == nsteps, 'restored step')
  call dtrain_copy_parameters(again, back)
  call check(all_same_bits(back, p), 'restored parameters')

  ! Device arrays by C address: a run on device 0 restores the same step, then trains and
  ! predicts from device copies of the host arrays `again` trains on, with the same bits.
  call dtrain_create(dev, MPI_COMM_WORLD, trim(config), device=0)
  call dtrain_restore_latest(dev, step)
  call check(step == nsteps, 'device run restored step')
  xbytes = int(storage_size(x) / 8, c_size_t) * size(x, kind=c_size_t)
  tbytes = int(storage_size(t) / 8, c_size_t) * size(t, kind=c_size_t)
  dx = test_device_alloc(xbytes)
  dt = test_device_alloc(tbytes)
  dy = test_device_alloc(tbytes)
  do s = 0, 1
    call fill(20 + s, x, t)
    call test_device_upload(dx, c_loc(x), xbytes)
    call test_device_upload(dt, c_loc(t), tbytes)
    call dtrain_train_step(again, x, t, loss)
    call dtrain_train_step_device(dev, dx, DTRAIN_F32, shape(x), dt, DTRAIN_F32, shape(t), dloss)
    call check(transfer(loss, 1_c_int64_t) == transfer(dloss, 1_c_int64_t), 'device step loss')
  end do
  call dtrain_copy_parameters(again, p)
  call dtrain_copy_parameters(dev, back)
  call check(all_same_bits(back, p), 'device step parameters')
  call dtrain_predict(again, x, y)
  call dtrain_predict_device(dev, dx, DTRAIN_F32, shape(x), dy, DTRAIN_F32, shape(y))
  call test_device_download(c_loc(ys), dy, tbytes)
  call check(all_same_bits(reshape(ys, [size(ys)]), reshape(y, [size(y)])), 'device predict')
  call dtrain_train_step_device(dev, c_loc(x), DTRAIN_F32, shape(x), dt, DTRAIN_F32, shape(t), &
    stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. &
    index(msg, 'x is not emulated device memory') > 0, 'host array on the device: ' // trim(msg))
  call dtrain_predict_device(again, dx, DTRAIN_F32, shape(x), dy, DTRAIN_F32, shape(y), &
    stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. index(msg, 'is on the host') > 0, &
    'device arrays on a host run: ' // trim(msg))
  call dtrain_close(dev)
  call test_device_free(dx, xbytes)
  call test_device_free(dt, tbytes)
  call test_device_free(dy, tbytes)

  ! The caller's arrays in the checkpoint (example 21 saves and restores them): a strided
  ! section is refused (a copy of it would not outlive the call), and a name given twice.
  call dtrain_checkpoint_array(run, 'big', big(1:4:2, :, :), stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. index(msg, "'big' is not contiguous") > 0, &
    'strided array: ' // trim(msg))
  call dtrain_checkpoint_array(run, 'x', x, stat=stat)
  call check(stat == DTRAIN_OK, 'x registered')
  call dtrain_checkpoint_array(run, 'x', x, stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_INVALID_ARGUMENT .and. &
    index(msg, "'x' is registered already") > 0, 'registered twice: ' // trim(msg))

  closed = run
  call dtrain_close(run)
  call check(run%id == 0, 'close resets the handle')
  call dtrain_train_step(closed, x, t, stat=stat, errmsg=msg)
  call check(stat == DTRAIN_ERR_CLOSED .and. index(msg, 'was closed') > 0, &
    'closed run: ' // trim(msg))
  call dtrain_close(again)

  call MPI_Allreduce(failures, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (total == 0) then
      print '(a)', 'fortran_test: ok'
    else
      print '(a,i0,a)', 'fortran_test: FAILED (', total, ' failed checks)'
    end if
  end if
  call MPI_Finalize()
  if (total /= 0) error stop 1

contains

  ! Sample b of step s on this rank (0-based), as lang_data.h: x(:, :, b+1) holds input elements
  ! 0..7 in C order (element i = 4 c + w at x(w+1, c+1, b+1)), t(:, b+1) the targets.
  subroutine fill(s, x, t)
    integer, intent(in) :: s
    real(c_float), intent(out) :: x(4, 2, nbatch), t(nout, nbatch)
    integer :: b, c, w, i, j
    do b = 0, nbatch - 1
      do c = 0, 1
        do w = 0, 3
          i = c * 4 + w
          x(w + 1, c + 1, b + 1) = &
            real(mod(rank * 7919 + s * 131 + b * 17 + i * 3, 97) - 48, c_float) / 48.0_c_float
        end do
      end do
      do j = 0, nout - 1
        t(j + 1, b + 1) = &
          real(mod(rank * 7919 + s * 131 + b * 17 + j * 5 + 1, 89) - 44, c_float) / 44.0_c_float
      end do
    end do
  end subroutine fill

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      write(*, '(a,i0,a,a)') 'rank ', rank, ': check failed: ', what
      failures = failures + 1
    end if
  end subroutine check

  logical function all_same_bits(a, b)
    real(c_float), intent(in) :: a(:), b(:)
    integer :: k
    all_same_bits = size(a) == size(b)
    do k = 1, min(size(a), size(b))
      all_same_bits = all_same_bits .and. transfer(a(k), 1) == transfer(b(k), 1)
    end do
  end function all_same_bits

end program fortran_test
