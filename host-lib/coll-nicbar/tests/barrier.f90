! MPI_Barrier and MPI_Ibarrier from Fortran (the mpi_f08 bindings): the component serves them
! like C's. Prints "fortran: N barriers ok" on rank 0.
program barrier
    use mpi_f08
    implicit none
    integer :: rank, i, ierror
    type(MPI_Request) :: request
    type(MPI_Comm) :: dup

    call MPI_Init(ierror)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierror)
    call MPI_Comm_dup(MPI_COMM_WORLD, dup, ierror)
    do i = 1, 50
        call MPI_Barrier(MPI_COMM_WORLD, ierror)
        if (ierror /= MPI_SUCCESS) stop 1
        call MPI_Ibarrier(dup, request, ierror)
        call MPI_Wait(request, MPI_STATUS_IGNORE, ierror)
        if (ierror /= MPI_SUCCESS) stop 1
    end do
    call MPI_Comm_free(dup, ierror)
    if (rank == 0) print '(a,i0,a)', 'fortran: ', 100, ' barriers ok'
    call MPI_Finalize(ierror)
end program barrier
