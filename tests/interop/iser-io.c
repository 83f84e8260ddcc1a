/*
 * iser-io: writes a known pattern over the first MIB MiB of an iSCSI LUN with libiscsi, reads
 * it back and compares, and prints the write and read rates. The URL decides the transport:
 * iser://HOST/IQN/LUN runs iSER (libiscsi's initiator on libibverbs/librdmacm: with
 * LD_LIBRARY_PATH naming the drop-in libraries, this stack's engine), iscsi://HOST:PORT/IQN/LUN
 * runs iSCSI over TCP. One command in flight at a time, CHUNK KiB per WRITE16/READ16.
 *
 *   iser-io URL MIB [CHUNK_KIB]
 *
 * Output, one line each: "capacity BLOCKS x BLOCKSIZE", "write BYTES bytes SECONDS s MIBPS MiB/s",
 * "read BYTES bytes SECONDS s MIBPS MiB/s", "verified BYTES bytes". Exit status 0 only when
 * every command succeeded and every byte read back is the byte written; 1 on a mismatch
 * (the first differing offset is printed), 2 on any other failure.
 *
 * Built by tests/interop/run-iser.sh (cc ... -liscsi).
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The byte at offset off of the pattern: a mix of the offset's bits, so that a block written
 * at the wrong place, a stale or zero block, or a shifted buffer all show as a mismatch. */
static uint8_t pattern(uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ULL;

	return (uint8_t)(x >> (8 * (off & 7)));
}

static int task_ok(struct iscsi_context *iscsi, struct scsi_task *task, const char *what)
{
	if (task == NULL) {
		fprintf(stderr, "%s: %s\n", what, iscsi_get_error(iscsi));
		return 0;
	}
	if (task->status != SCSI_STATUS_GOOD) {
		fprintf(stderr, "%s: SCSI status %d: %s\n", what, task->status,
			iscsi_get_error(iscsi));
		scsi_free_scsi_task(task);
		return 0;
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct iscsi_context *iscsi;
	struct iscsi_url *url;
	struct scsi_task *task;
	struct scsi_readcapacity16 *rc16;
	uint64_t total, off, blocks;
	uint32_t bs, chunk;
	unsigned char *buf;
	double t0, tw, tr;

	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: %s URL MIB [CHUNK_KIB]\n", argv[0]);
		return 2;
	}
	total = strtoull(argv[2], NULL, 0) << 20;
	chunk = (argc == 4 ? (uint32_t)strtoul(argv[3], NULL, 0) : 256) << 10;
	if (total == 0 || chunk == 0 || total % chunk != 0) {
		fprintf(stderr, "MIB and CHUNK_KIB must be positive, MIB a multiple of CHUNK_KIB\n");
		return 2;
	}
	iscsi = iscsi_create_context("iqn.2026-01.org.iwarp:iser-io");
	if (iscsi == NULL) {
		fprintf(stderr, "iscsi_create_context failed\n");
		return 2;
	}
	url = iscsi_parse_full_url(iscsi, argv[1]);
	if (url == NULL) {
		fprintf(stderr, "bad URL %s: %s\n", argv[1], iscsi_get_error(iscsi));
		return 2;
	}
	iscsi_set_targetname(iscsi, url->target);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
	iscsi_set_noautoreconnect(iscsi, 1);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
		fprintf(stderr, "login to %s failed: %s\n", argv[1], iscsi_get_error(iscsi));
		return 2;
	}

	task = iscsi_readcapacity16_sync(iscsi, url->lun);
	if (!task_ok(iscsi, task, "READ CAPACITY(16)"))
		return 2;
	rc16 = scsi_datain_unmarshall(task);
	if (rc16 == NULL || rc16->block_length == 0) {
		fprintf(stderr, "READ CAPACITY(16): no answer to decode\n");
		return 2;
	}
	bs = rc16->block_length;
	blocks = rc16->returned_lba + 1;
	scsi_free_scsi_task(task);
	printf("capacity %llu x %u\n", (unsigned long long)blocks, bs);
	if (chunk % bs != 0 || total > blocks * bs) {
		fprintf(stderr, "%llu bytes in chunks of %u do not fit the LUN's blocks\n",
			(unsigned long long)total, chunk);
		return 2;
	}

	buf = malloc(chunk);
	if (buf == NULL)
		return 2;
	t0 = now();
	for (off = 0; off < total; off += chunk) {
		for (uint32_t i = 0; i < chunk; i++)
			buf[i] = pattern(off + i);
		task = iscsi_write16_sync(iscsi, url->lun, off / bs, buf, chunk, bs, 0, 0, 0, 0, 0);
		if (!task_ok(iscsi, task, "WRITE(16)"))
			return 2;
		scsi_free_scsi_task(task);
	}
	tw = now() - t0;
	printf("write %llu bytes %.3f s %.2f MiB/s\n", (unsigned long long)total, tw,
	       (double)total / 1048576.0 / tw);

	tr = 0;
	for (off = 0; off < total; off += chunk) {
		double t1 = now();

		task = iscsi_read16_sync(iscsi, url->lun, off / bs, chunk, bs, 0, 0, 0, 0, 0);
		tr += now() - t1;
		if (!task_ok(iscsi, task, "READ(16)"))
			return 2;
		if (task->datain.size != (int)chunk) {
			fprintf(stderr, "READ(16) at %llu: %d bytes, expected %u\n",
				(unsigned long long)off, task->datain.size, chunk);
			return 1;
		}
		for (uint32_t i = 0; i < chunk; i++) {
			if (task->datain.data[i] != pattern(off + i)) {
				fprintf(stderr, "mismatch at byte %llu: read 0x%02x, wrote 0x%02x\n",
					(unsigned long long)(off + i), task->datain.data[i],
					pattern(off + i));
				return 1;
			}
		}
		scsi_free_scsi_task(task);
	}
	printf("read %llu bytes %.3f s %.2f MiB/s\n", (unsigned long long)total, tr,
	       (double)total / 1048576.0 / tr);
	printf("verified %llu bytes\n", (unsigned long long)total);

	free(buf);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	return 0;
}
