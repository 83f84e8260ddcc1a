/* A two-rank MPI ping-pong: latency and bandwidth over message sizes, every message checked.
 *
 *   mpicc -O2 -o pingpong tests/mpi/pingpong.c
 *   mpirun -np 2 ./pingpong [MAX_BYTES [ITERS]]     (defaults: 4 MiB, 200)
 *
 * For each size from 1 byte to MAX_BYTES (powers of two): rank 0 sends a buffer to rank 1,
 * which checks it and sends back its bytes each plus one, which rank 0 checks. The pattern
 * depends on the size and the iteration, so a stale or misplaced message is caught. A few
 * warm-up round trips precede the timed ones; large sizes run fewer iterations (at least 10).
 * Rank 0 prints one line per size: bytes, iterations, the one-way latency (half the mean
 * round trip, microseconds) and the bandwidth that gives (MB/s, 10^6 bytes), and a last line
 * "pingpong: OK, N messages checked". A mismatch prints the first bad byte and aborts the job
 * with a non-zero status.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char expected(size_t size, int iter, size_t i, int reply)
{
	return (unsigned char)((i * 131u + size * 7u + (unsigned)iter * 29u + 17u) + (reply ? 1u : 0u));
}

static void fill(unsigned char *buf, size_t size, int iter, int reply)
{
	for (size_t i = 0; i < size; i++)
		buf[i] = expected(size, iter, i, reply);
}

static void check(const unsigned char *buf, size_t size, int iter, int reply, int rank)
{
	for (size_t i = 0; i < size; i++) {
		if (buf[i] != expected(size, iter, i, reply)) {
			fprintf(stderr,
				"pingpong: rank %d: size %zu iteration %d: byte %zu is 0x%02x, expected 0x%02x\n",
				rank, size, iter, i, buf[i], expected(size, iter, i, reply));
			MPI_Abort(MPI_COMM_WORLD, 3);
		}
	}
}

int main(int argc, char **argv)
{
	int rank, nranks;
	size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)4 << 20;
	int iters = argc > 2 ? atoi(argv[2]) : 200;
	long checked = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks != 2 || max < 1 || max > ((size_t)1 << 30) || iters < 1) {
		if (rank == 0)
			fprintf(stderr, "pingpong: run with -np 2; MAX_BYTES 1..1 GiB, ITERS >= 1\n");
		MPI_Finalize();
		return 2;
	}
	unsigned char *buf = malloc(max);
	if (!buf) {
		fprintf(stderr, "pingpong: rank %d: no memory for %zu bytes\n", rank, max);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	if (rank == 0)
		printf("%12s %8s %14s %12s\n", "bytes", "iters", "latency_us", "MB/s");
	for (size_t size = 1; size <= max; size *= 2) {
		int n = iters;
		/* About 64 MiB each way at most per size, and at least 10 round trips. */
		if ((size_t)n * size > ((size_t)64 << 20))
			n = (int)(((size_t)64 << 20) / size);
		if (n < 10)
			n = 10;
		int warmup = n < 20 ? 2 : 5;
		double t0 = 0;
		MPI_Barrier(MPI_COMM_WORLD);
		for (int it = 0; it < warmup + n; it++) {
			if (it == warmup)
				t0 = MPI_Wtime();
			if (rank == 0) {
				fill(buf, size, it, 0);
				MPI_Send(buf, (int)size, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				memset(buf, 0, size);
				MPI_Recv(buf, (int)size, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check(buf, size, it, 1, rank);
			} else {
				memset(buf, 0, size);
				MPI_Recv(buf, (int)size, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check(buf, size, it, 0, rank);
				fill(buf, size, it, 1);
				MPI_Send(buf, (int)size, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
			checked++;
		}
		double one_way = (MPI_Wtime() - t0) / n / 2;
		if (rank == 0)
			printf("%12zu %8d %14.2f %12.2f\n", size, n, one_way * 1e6, (double)size / one_way / 1e6);
		if (size > max / 2)
			break;
	}
	long total = 0;
	MPI_Reduce(&checked, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("pingpong: OK, %ld messages checked\n", total);
		/* Out now, whatever MPI_Finalize does (a run bounded by time is judged on it). */
		fflush(stdout);
	}
	free(buf);
	MPI_Finalize();
	return 0;
}
