! MPI_Allreduce, MPI_Iallreduce and MPI_Reduce from Fortran (the mpi_f08 bindings) on INTEGER,
! INTEGER(8), REAL, DOUBLE PRECISION, MPI_2INTEGER and LOGICAL (under MPI_LAND, MPI_LOR and
! MPI_LXOR, as a convergence test asks every rank): the component combines Fortran's types in
! the NIC as it does C's. The inputs are small integers, exact in every type, so each result is
! known. Prints "fortran reductions: N ok" on rank 0 (N checks on all ranks), else the failures.
program reduce
    use mpi_f08
    implicit none
    integer, parameter :: rounds = 20
    integer :: rank, nprocs, round, j, ierror, failures, checks, total_failures, total_checks
    integer :: ints(4), int_sums(4), mins(4)
    integer(kind=8) :: longs(2), long_maxes(2)
    real :: reals(8), real_sums(8)
    double precision :: doubles(4), double_sums(4), one, one_sum
    integer :: pairs(2, 2), located(2, 2), r
    logical :: flags(3), all_set(3), any_set(3), odd_set(3)
    type(MPI_Request) :: request

    call MPI_Init(ierror)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierror)
    call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierror)
    failures = 0
    checks = 0
    do round = 1, rounds
        do j = 1, 4
            ints(j) = rank + j * round
            doubles(j) = dble(rank * j + round)
        end do
        do j = 1, 8
            reals(j) = real(rank * j - round)
        end do
        do j = 1, 2
            longs(j) = int(rank, 8) * 1000000000_8 * j + round
            pairs(1, j) = mod(rank + j + round, 3)
            pairs(2, j) = rank
        end do
        one = dble(rank + round)
        do j = 1, 3
            flags(j) = mod(rank + j + round, 3) /= 0
        end do

        call MPI_Allreduce(ints, int_sums, 4, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierror)
        do j = 1, 4
            call expect(int_sums(j) == nprocs * (nprocs - 1) / 2 + nprocs * j * round)
        end do
        call MPI_Allreduce(longs, long_maxes, 2, MPI_INTEGER8, MPI_MAX, MPI_COMM_WORLD, ierror)
        do j = 1, 2
            call expect(long_maxes(j) == int(nprocs - 1, 8) * 1000000000_8 * j + round)
        end do
        call MPI_Allreduce(reals, real_sums, 8, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierror)
        do j = 1, 8
            call expect(real_sums(j) == real(j * nprocs * (nprocs - 1) / 2 - nprocs * round))
        end do
        call MPI_Iallreduce(doubles, double_sums, 4, MPI_DOUBLE_PRECISION, MPI_SUM, &
                            MPI_COMM_WORLD, request, ierror)
        call MPI_Wait(request, MPI_STATUS_IGNORE, ierror)
        do j = 1, 4
            call expect(double_sums(j) == dble(j * nprocs * (nprocs - 1) / 2 + nprocs * round))
        end do
        call MPI_Allreduce(one, one_sum, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierror)
        call expect(one_sum == dble(nprocs * (nprocs - 1) / 2 + nprocs * round))
        call MPI_Allreduce(pairs, located, 2, MPI_2INTEGER, MPI_MINLOC, MPI_COMM_WORLD, ierror)
        do j = 1, 2
            call expect(located(1, j) == least(j + round) .and. &
                        located(2, j) == first_at(j + round, least(j + round)))
        end do
        call MPI_Allreduce(flags, all_set, 3, MPI_LOGICAL, MPI_LAND, MPI_COMM_WORLD, ierror)
        call MPI_Allreduce(flags, any_set, 3, MPI_LOGICAL, MPI_LOR, MPI_COMM_WORLD, ierror)
        call MPI_Allreduce(flags, odd_set, 3, MPI_LOGICAL, MPI_LXOR, MPI_COMM_WORLD, ierror)
        do j = 1, 3
            call expect((all_set(j) .eqv. (set_on(j + round) == nprocs)) .and. &
                        (any_set(j) .eqv. (set_on(j + round) > 0)) .and. &
                        (odd_set(j) .eqv. (mod(set_on(j + round), 2) == 1)))
        end do
        call MPI_Reduce(ints, mins, 4, MPI_INTEGER, MPI_MIN, mod(round, nprocs), &
                        MPI_COMM_WORLD, ierror)
        if (rank == mod(round, nprocs)) then
            do j = 1, 4
                call expect(mins(j) == j * round)
            end do
        end if
    end do

    call MPI_Reduce(failures, total_failures, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierror)
    call MPI_Reduce(checks, total_checks, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierror)
    if (rank == 0) then
        if (total_failures == 0) then
            print '(a,i0,a)', 'fortran reductions: ', total_checks, ' ok'
        else
            print '(a,i0,a,i0,a)', 'fortran reductions: ', total_failures, ' of ', &
                total_checks, ' checks failed'
        end if
    end if
    call MPI_Finalize(ierror)
    if (rank == 0 .and. total_failures /= 0) stop 1

contains

    ! The least of mod(r + shift, 3) over the ranks r.
    integer function least(shift)
        integer, intent(in) :: shift
        least = 3
        do r = 0, nprocs - 1
            least = min(least, mod(r + shift, 3))
        end do
    end function least

    ! How many ranks r have mod(r + shift, 3) /= 0 (their flag set).
    integer function set_on(shift)
        integer, intent(in) :: shift
        set_on = 0
        do r = 0, nprocs - 1
            if (mod(r + shift, 3) /= 0) set_on = set_on + 1
        end do
    end function set_on

    ! The smallest rank r whose mod(r + shift, 3) is `value`.
    integer function first_at(shift, value)
        integer, intent(in) :: shift, value
        do first_at = 0, nprocs - 1
            if (mod(first_at + shift, 3) == value) return
        end do
    end function first_at

    subroutine expect(holds)
        logical, intent(in) :: holds
        checks = checks + 1
        if (.not. holds) failures = failures + 1
    end subroutine expect

end program reduce
