/* The corners of the verbs ABI that programs depend on, exercised from C against the drop-in
 * libibverbs.so.1 / librdmacm.so.1 (compiled with rdma-core's own headers, so the inline
 * data-path functions go through ibv_context::ops as they do in any program):
 *
 * - bad arguments: NULL, foreign and stale pointers, bad lengths and flags, an unknown lkey,
 *   too many SGEs, a full queue: the documented error return, errno set;
 * - file descriptors: the rdma_cm event channel and the completion channel are real
 *   descriptors that poll(2) works on; made non-blocking they fail with EAGAIN;
 * - completion events: one per arming, acknowledged before the queue is destroyed;
 * - rdma_disconnect: the queue pair's posted work is flushed (IBV_WC_WR_FLUSH_ERR) with a
 *   completion event, and both sides get RDMA_CM_EVENT_DISCONNECTED;
 * - rdma_create_qp with no CQs makes them; rdma_create_id with a NULL channel is synchronous
 *   (rdma_create_ep, rdma_connect returning once connected); rdma_migrate_id moves an id (and
 *   its unread events) to another channel, synchronous or not; rdma_destroy_id drops the
 *   id's unread events; rdma_getaddrinfo from hints alone (libfabric's verbs provider);
 * - a thread blocked in ibv_get_cq_event can be cancelled;
 * - a thread that polls an empty queue for a long time gives its core up (it sleeps in the
 *   queue) and still gets the next completion.
 *
 * Output is TAP-like: "ok N - what" or "not ok N - what (errno ...)"; the exit status is the
 * number of failures. Everything runs over 127.0.0.1 and is bounded by alarm().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int n, fails;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		int e_ = errno;                                                            \
		n++;                                                                       \
		if (cond) {                                                                \
			printf("ok %d - ", n);                                             \
			printf(__VA_ARGS__);                                               \
			printf("\n");                                                      \
		} else {                                                                   \
			printf("not ok %d - ", n);                                         \
			printf(__VA_ARGS__);                                               \
			printf(" (errno %d: %s)\n", e_, strerror(e_));                     \
			fails++;                                                           \
		}                                                                          \
		fflush(stdout);                                                            \
	} while (0)

#define REQUIRE(cond, ...)                                                                 \
	do {                                                                               \
		int ok_ = !!(cond);                                                        \
		CHECK(ok_, __VA_ARGS__);                                                   \
		if (!ok_) {                                                                \
			printf("# cannot go on\n");                                        \
			exit(100 + fails);                                                 \
		}                                                                          \
	} while (0)

/* Posts a signaled RDMA Write or Read of 10 bytes between local and remote. */
static int post_rdma(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, char *local, uint32_t lkey,
		     char *remote, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)local, 10, lkey };
	struct ibv_send_wr w = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)remote;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &w, &bad);
}

static long us_between(struct timespec a, struct timespec b)
{
	return (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
}

/* How long a wait for an event or a completion lasts at most: a bound against a hang, far
 * above the milliseconds either takes even on a loaded machine (the whole program is bounded
 * by alarm() anyway). Waits end as soon as what they wait for comes. */
#define WAIT_MS 15000

/* Polls `cq` until `max` completions are in `wc`, for at most WAIT_MS; returns how many (-1
 * if polling failed). */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int max)
{
	struct timespec t0, t;
	int got = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int k = ibv_poll_cq(cq, max - got, wc + got);
		if (k < 0)
			return -1;
		got += k;
		if (got >= max)
			return got;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (us_between(t0, t) > WAIT_MS * 1000L)
			return got;
		usleep(1000);
	}
}

/* Waits up to WAIT_MS for the next event on `ch` (whose fd may be non-blocking). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev = NULL;

	if (poll(&p, 1, WAIT_MS) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* Waits for an event of type `want`; acknowledges it unless `keep`. */
static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
					  int keep)
{
	struct rdma_cm_event *ev = next_event(ch);

	CHECK(ev && ev->event == want, "event %s (got %s)", rdma_event_str(want),
	      ev ? rdma_event_str(ev->event) : "none");
	if (ev && !keep) {
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

/* Waits up to WAIT_MS for a completion event on `ch`, polls `cq` into `wc`; returns how many. */
static int event_then_poll(struct ibv_comp_channel *ch, struct ibv_cq *cq, struct ibv_wc *wc, int max)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	if (poll(&p, 1, WAIT_MS) != 1)
		return -1;
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != cq)
		return -1;
	ibv_ack_cq_events(cq, 1);
	/* Completions may arrive after the event that announced the first. */
	return poll_for(cq, wc, max);
}

static void *blocked_reader(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;

	ibv_get_cq_event(ch, &cq, &ctx); /* never returns: cancelled */
	return NULL;
}

static void *reads_destroyed_channel(void *arg)
{
	struct rdma_cm_event *ev;

	rdma_get_cm_event(arg, &ev); /* never returns: the channel is gone (cancelled) */
	return NULL;
}

struct accept_args {
	struct rdma_event_channel *ch;
	int ok, down;
};

/* Accepts one connection on `ch` (for the synchronous client). */
static void *acceptor(void *arg)
{
	struct accept_args *a = arg;
	struct rdma_cm_event *ev = next_event(a->ch);
	struct ibv_qp_init_attr attr = { .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
	struct rdma_cm_id *id;

	if (!ev || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		return NULL;
	id = ev->id;
	rdma_ack_cm_event(ev);
	if (rdma_create_qp(id, NULL, &attr) || rdma_accept(id, NULL))
		return NULL;
	ev = next_event(a->ch);
	a->ok = ev && ev->event == RDMA_CM_EVENT_ESTABLISHED;
	if (ev)
		rdma_ack_cm_event(ev);
	ev = next_event(a->ch); /* the client's disconnect */
	a->down = ev && ev->event == RDMA_CM_EVENT_DISCONNECTED;
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return NULL;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	int num = 0, rc, i;
	char garbage[512];
	static char buf[4096], sbuf[4096];

	alarm(50);
	memset(garbage, 0x5a, sizeof garbage);

	/* --- the device ------------------------------------------------------------------ */
	list = ibv_get_device_list(&num);
	REQUIRE(list && num == 1 && list[1] == NULL, "one device");
	CHECK(list[0]->transport_type == IBV_TRANSPORT_IWARP && list[0]->node_type == IBV_NODE_RNIC,
	      "an iWARP RNIC named %s", ibv_get_device_name(list[0]));
	ctx = ibv_open_device(list[0]);
	REQUIRE(ctx, "ibv_open_device");
	CHECK(ibv_query_device(ctx, &dattr) == 0 && dattr.vendor_id != 0x02c9 && dattr.max_qp_rd_atom > 0,
	      "ibv_query_device: vendor 0x%x, max_qp_rd_atom %d", dattr.vendor_id, dattr.max_qp_rd_atom);
	CHECK(ibv_query_port(ctx, 1, &pattr) == 0 && pattr.state == IBV_PORT_ACTIVE &&
		      pattr.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "ibv_query_port: active, Ethernet");
	errno = 0;
	CHECK(ibv_query_port(ctx, 2, &pattr) != 0 && errno == EINVAL, "ibv_query_port of port 2: EINVAL");
	CHECK(ctx->async_fd >= 0 && fcntl(ctx->async_fd, F_GETFD) >= 0, "the async fd is a descriptor");
	fcntl(ctx->async_fd, F_SETFL, O_NONBLOCK);
	{
		struct ibv_async_event ae;
		errno = 0;
		CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN,
		      "non-blocking async fd: ibv_get_async_event fails with EAGAIN");
	}

	/* --- bad arguments ---------------------------------------------------------------- */
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "ibv_alloc_pd(NULL): EINVAL");
	errno = 0;
	CHECK(ibv_alloc_pd((struct ibv_context *)garbage) == NULL && errno == EINVAL,
	      "ibv_alloc_pd(foreign pointer): EINVAL");
	pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	errno = 0;
	CHECK(ibv_reg_mr(pd, NULL, 16, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
	      "ibv_reg_mr(NULL address): EINVAL");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
	      "ibv_reg_mr(0 bytes): EINVAL");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 16, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "ibv_reg_mr(remote write without local write): EINVAL");
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(mr && mr->addr == buf && mr->length == sizeof buf, "ibv_reg_mr");
	errno = 0;
	CHECK(ibv_dealloc_pd(pd) == EBUSY && errno == EBUSY, "ibv_dealloc_pd with a region: EBUSY");
	CHECK(ibv_dealloc_pd((struct ibv_pd *)garbage) == EINVAL, "ibv_dealloc_pd(foreign): EINVAL");
	CHECK(ibv_dereg_mr((struct ibv_mr *)garbage) == EINVAL, "ibv_dereg_mr(foreign): EINVAL");
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "ibv_create_cq(0 entries): EINVAL");
	{
		struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		struct ibv_qp_init_attr ud = { .send_cq = cq, .recv_cq = cq, .cap = { 1, 1, 1, 1, 0 },
					       .qp_type = IBV_QPT_UD };
		struct ibv_qp_init_attr rc_ = ud;
		struct ibv_wc wc;
		struct ibv_qp *qp;

		errno = 0;
		CHECK(ibv_create_qp(pd, &ud) == NULL && errno == EOPNOTSUPP, "ibv_create_qp(UD): EOPNOTSUPP");
		rc_.qp_type = IBV_QPT_RC;
		rc_.cap.max_send_sge = 1000;
		errno = 0;
		CHECK(ibv_create_qp(pd, &rc_) == NULL && errno == EINVAL, "ibv_create_qp(1000 SGEs): EINVAL");
		rc_.cap.max_send_sge = 1;
		qp = ibv_create_qp(pd, &rc_);
		CHECK(qp && qp->qp_num != 0 && qp->state == IBV_QPS_RESET, "ibv_create_qp(RC)");
		CHECK(ibv_destroy_cq(cq) == EBUSY, "ibv_destroy_cq with a queue pair: EBUSY");
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "ibv_poll_cq of an empty queue: 0");
		/* (ibv_poll_cq and the other data-path calls are inline functions that read
		   cq->context->ops themselves: a foreign pointer crashes in the caller's code, as
		   with rdma-core; a stale one that is still mapped reaches the library and is
		   refused. */
		CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0, "destroy the queue pair, then the queue");
		CHECK(ibv_destroy_qp(qp) == EINVAL, "ibv_destroy_qp twice: EINVAL");
	}
	{
		/* Shared receive queues: sizes granted, a queue pair that takes its receives from
		   one, and the refusals around them. */
		struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		struct ibv_srq_init_attr big = { .attr = { .max_wr = 1 << 30, .max_sge = 1 } };
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq_attr q;
		struct ibv_srq *srq;
		struct ibv_pd *other = ibv_alloc_pd(ctx);
		struct ibv_qp_init_attr rc_ = { .send_cq = cq, .recv_cq = cq, .cap = { 1, 0, 1, 0, 0 },
						.qp_type = IBV_QPT_RC };
		struct ibv_qp *qp, *stranger;
		struct ibv_recv_wr rwr = { .wr_id = 1 }, *bad;
		char rbuf[16];
		struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_sge sge = { .addr = (uintptr_t)rbuf, .length = sizeof rbuf, .lkey = rmr ? rmr->lkey : 0 };

		CHECK(ibv_query_device(ctx, &dattr) == 0 && dattr.max_srq > 0 && dattr.max_srq_wr > 0,
		      "ibv_query_device reports shared receive queues");
		errno = 0;
		CHECK(ibv_create_srq(pd, &big) == NULL && errno == EINVAL, "ibv_create_srq(2^30 entries): EINVAL");
		srq = ibv_create_srq(pd, &sa);
		CHECK(srq && srq->pd == pd && srq->context == ctx, "ibv_create_srq");
		CHECK(ibv_query_srq(srq, &q) == 0 && q.max_wr >= 4 && q.max_sge >= 1, "ibv_query_srq: the sizes granted");
		CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_MAX_WR) == EOPNOTSUPP, "ibv_modify_srq: EOPNOTSUPP");
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		CHECK(ibv_post_srq_recv(srq, &rwr, &bad) == 0, "ibv_post_srq_recv");
		rc_.srq = srq;
		errno = 0;
		stranger = ibv_create_qp(other, &rc_);
		CHECK(stranger == NULL && errno == EINVAL, "ibv_create_qp with another domain's SRQ: EINVAL");
		qp = ibv_create_qp(pd, &rc_);
		CHECK(qp && qp->srq == srq, "ibv_create_qp with an SRQ");
		CHECK(qp && ibv_post_recv(qp, &rwr, &bad) == EINVAL && bad == &rwr,
		      "ibv_post_recv on a queue pair with an SRQ: EINVAL");
		CHECK(ibv_destroy_srq(srq) == EBUSY, "ibv_destroy_srq with a queue pair: EBUSY");
		CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_srq(srq) == 0, "destroy the queue pair, then the SRQ");
		CHECK(ibv_destroy_srq(srq) == EINVAL, "ibv_destroy_srq twice: EINVAL");
		CHECK(ibv_dereg_mr(rmr) == 0 && ibv_dealloc_pd(other) == 0 && ibv_destroy_cq(cq) == 0,
		      "free the region, the other domain and the queue");
	}
	errno = 0;
	CHECK(rdma_bind_addr(NULL, NULL) == -1 && errno == EINVAL, "rdma_bind_addr(NULL): -1, EINVAL");
	errno = 0;
	CHECK(rdma_ack_cm_event((struct rdma_cm_event *)garbage) == -1 && errno == EINVAL,
	      "rdma_ack_cm_event(foreign): -1, EINVAL");

	/* --- a connection over 127.0.0.1 --------------------------------------------------- */
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id, *cid, *sid;
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct rdma_cm_event *ev;
	struct ibv_comp_channel *schan;
	struct ibv_cq *scq;
	struct ibv_pd *spd;
	struct ibv_mr *smr;
	struct ibv_wc wc[8];

	REQUIRE(sch && cch, "rdma_create_event_channel");
	REQUIRE(rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(rdma_bind_addr(listen_id, (struct sockaddr *)&sin) == 0 && rdma_listen(listen_id, 4) == 0,
		"rdma_bind_addr, rdma_listen");
	sin.sin_port = rdma_get_src_port(listen_id);
	CHECK(sin.sin_port != 0, "listening on port %d", ntohs(sin.sin_port));
	fcntl(sch->fd, F_SETFL, O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(sch, &ev) == -1 && errno == EAGAIN,
	      "non-blocking event channel, nothing queued: EAGAIN");

	REQUIRE(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
	errno = 0;
	CHECK(rdma_resolve_route(cid, 1000) == -1 && errno == EINVAL, "rdma_resolve_route before the address: EINVAL");
	CHECK(rdma_resolve_addr(cid, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
	expect_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(cid->verbs != NULL && rdma_get_local_addr(cid)->sa_family == AF_INET, "the id has a device and a source");
	CHECK(rdma_resolve_route(cid, 2000) == 0, "rdma_resolve_route");
	expect_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	{
		struct ibv_qp_init_attr attr = { .cap = { 4, 4, 2, 1, 0 }, .qp_type = IBV_QPT_RC };
		REQUIRE(rdma_create_qp(cid, NULL, &attr) == 0, "rdma_create_qp with no PD and no CQs");
		CHECK(cid->qp && cid->pd && cid->send_cq && cid->recv_cq && cid->send_cq_channel &&
			      cid->recv_cq_channel && attr.send_cq == cid->send_cq,
		      "it made a PD, CQs and completion channels");
	}
	static char cbuf[4096];
	struct ibv_mr *cmr = ibv_reg_mr(cid->pd, cbuf, sizeof cbuf,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(cmr, "client region");
	{
		struct ibv_sge sge = { (uintptr_t)cbuf + 2048, 64, cmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(cid->qp, &rwr, &bad) == 0, "client posts a receive before connecting");
	}
	{
		struct rdma_conn_param p = { .private_data = "hello", .private_data_len = 5,
					     .responder_resources = 1, .initiator_depth = 1 };
		CHECK(rdma_connect(cid, &p) == 0, "rdma_connect");
	}
	ev = expect_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST, 1);
	REQUIRE(ev, "connection request");
	CHECK(ev->listen_id == listen_id && ev->param.conn.private_data_len == 5 &&
		      memcmp(ev->param.conn.private_data, "hello", 5) == 0,
	      "the request carries the listener and the private data");
	sid = ev->id;
	CHECK(sid->verbs != NULL && sid->context == listen_id->context, "the new id has a device context");
	rdma_ack_cm_event(ev);

	spd = ibv_alloc_pd(sid->verbs);
	schan = ibv_create_comp_channel(sid->verbs);
	scq = ibv_create_cq(sid->verbs, 16, (void *)0x1234, schan, 0);
	smr = ibv_reg_mr(spd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							  IBV_ACCESS_REMOTE_READ);
	REQUIRE(spd && schan && scq && smr, "server PD, channel, CQ, region");
	CHECK(fcntl(schan->fd, F_GETFD) >= 0, "the completion channel's fd is a descriptor");
	{
		struct ibv_qp_init_attr attr = { .send_cq = scq, .recv_cq = scq, .cap = { 4, 4, 2, 1, 0 },
						 .qp_type = IBV_QPT_RC };
		REQUIRE(rdma_create_qp(sid, spd, &attr) == 0, "server rdma_create_qp");
	}
	for (i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)sbuf + 64 * i, 64, smr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		rc = ibv_post_recv(sid->qp, &rwr, &bad);
		CHECK(rc == 0, "server posts receive %d before accepting", i);
	}
	{
		struct ibv_sge sge = { (uintptr_t)sbuf, 64, smr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
		errno = 0;
		rc = ibv_post_recv(sid->qp, &rwr, &bad);
		CHECK(rc == ENOMEM && errno == ENOMEM && bad == &rwr, "a fifth receive (queue of 4): ENOMEM, bad_wr");
	}
	{
		struct rdma_conn_param p = { .private_data = "world", .private_data_len = 5,
					     .responder_resources = 1, .initiator_depth = 1 };
		CHECK(rdma_accept(sid, &p) == 0, "rdma_accept");
	}
	expect_event(sch, RDMA_CM_EVENT_ESTABLISHED, 0);
	ev = expect_event(cch, RDMA_CM_EVENT_ESTABLISHED, 1);
	CHECK(ev && ev->param.conn.private_data_len >= 5 && memcmp(ev->param.conn.private_data, "world", 5) == 0,
	      "the client sees the server's private data");
	if (ev)
		rdma_ack_cm_event(ev);

	/* Bad work requests on a live queue pair. */
	{
		struct ibv_sge sge = { (uintptr_t)cbuf, 4, cmr->lkey + 0x1000 };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
		errno = 0;
		rc = ibv_post_send(cid->qp, &wr, &bad);
		CHECK(rc == EINVAL && errno == EINVAL && bad == &wr, "a send with an unknown lkey: EINVAL, bad_wr");
		sge.lkey = cmr->lkey;
		sge.addr = (uintptr_t)cbuf + sizeof cbuf - 2;
		bad = NULL;
		rc = ibv_post_send(cid->qp, &wr, &bad);
		CHECK(rc == EINVAL && bad == &wr, "a send past the region's end: EINVAL");
		struct ibv_sge three[3] = { { (uintptr_t)cbuf, 1, cmr->lkey }, { (uintptr_t)cbuf, 1, cmr->lkey },
					    { (uintptr_t)cbuf, 1, cmr->lkey } };
		wr.sg_list = three;
		wr.num_sge = 3;
		bad = NULL;
		rc = ibv_post_send(cid->qp, &wr, &bad);
		CHECK(rc == EINVAL && bad == &wr, "three SGEs on a queue pair of two: EINVAL");
		wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr.num_sge = 1;
		rc = ibv_post_send(cid->qp, &wr, &bad);
		CHECK(rc == EINVAL, "an atomic (RFC 7306 is not negotiated over rdma_cm): EINVAL");
	}

	/* A Send, announced on the server's completion channel. */
	fcntl(schan->fd, F_SETFL, O_NONBLOCK);
	{
		struct ibv_cq *c;
		void *x;
		errno = 0;
		CHECK(ibv_get_cq_event(schan, &c, &x) == -1 && errno == EAGAIN,
		      "non-blocking completion channel, no event: EAGAIN");
	}
	CHECK(ibv_req_notify_cq(scq, 0) == 0, "arm the server's CQ");
	memcpy(cbuf, "ping", 4);
	{
		struct ibv_sge sge = { (uintptr_t)cbuf, 4, cmr->lkey };
		struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		CHECK(ibv_post_send(cid->qp, &wr, &bad) == 0, "client sends 4 bytes");
	}
	rc = event_then_poll(schan, scq, wc, 1);
	CHECK(rc == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 4 &&
		      wc[0].wr_id == 0 && wc[0].qp_num == sid->qp->qp_num && memcmp(sbuf, "ping", 4) == 0,
	      "one completion event, then the receive (wr_id 0, 4 bytes, qp_num %u)", wc[0].qp_num);
	{
		struct ibv_cq *c;
		void *x;
		errno = 0;
		CHECK(ibv_get_cq_event(schan, &c, &x) == -1 && errno == EAGAIN, "one event per arming");
	}
	rc = poll_for(cid->send_cq, wc, 1);
	CHECK(rc == 1 && wc[0].wr_id == 7 && wc[0].opcode == IBV_WC_SEND, "the client's send completes");

	/* RDMA Write into the server's region, then Read it back. */
	memcpy(cbuf + 100, "rdma-write", 10);
	{
		CHECK(post_rdma(cid->qp, 8, IBV_WR_RDMA_WRITE, cbuf + 100, cmr->lkey, sbuf + 1000, smr->rkey) == 0,
		      "RDMA Write to the server's buffer address");
		CHECK(post_rdma(cid->qp, 9, IBV_WR_RDMA_READ, cbuf + 200, cmr->lkey, sbuf + 1000, smr->rkey) == 0,
		      "RDMA Read of it");
		int got = poll_for(cid->send_cq, wc, 2);
		CHECK(got == 2 && wc[1].wr_id == 9 && wc[1].status == IBV_WC_SUCCESS &&
			      memcmp(cbuf + 200, "rdma-write", 10) == 0,
		      "the Read brings back what the Write placed");
	}

	/* A thread polling an empty queue for 300 ms sleeps in it after IWARP_POLL_IDLE_US
	 * (200 us): it uses a fraction of the core (a spinning poller uses all of it, less
	 * what others take), then its next poll loop still sees a completion. */
	{
		struct timespec w0, w1, c0, c1;
		clock_gettime(CLOCK_MONOTONIC, &w0);
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
		long polls = 0, wall_us = 0;
		rc = 0;
		while (rc == 0 && wall_us < 300000) {
			rc = ibv_poll_cq(cid->send_cq, 1, wc);
			polls++;
			clock_gettime(CLOCK_MONOTONIC, &w1);
			wall_us = us_between(w0, w1);
		}
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
		long cpu_us = us_between(c0, c1);
		CHECK(rc == 0 && cpu_us < wall_us / 2,
		      "polling an empty queue for %ld ms took %ld ms of CPU in %ld polls", wall_us / 1000,
		      cpu_us / 1000, polls);
		CHECK(post_rdma(cid->qp, 10, IBV_WR_RDMA_WRITE, cbuf + 100, cmr->lkey, sbuf + 1000, smr->rkey) == 0,
		      "an RDMA Write after the idle spell");
		rc = 0;
		for (wall_us = 0; rc == 0 && wall_us < WAIT_MS * 1000L;) {
			rc = ibv_poll_cq(cid->send_cq, 1, wc);
			clock_gettime(CLOCK_MONOTONIC, &w1);
			wall_us = us_between(w0, w1);
		}
		CHECK(rc == 1 && wc[0].wr_id == 10 && wc[0].status == IBV_WC_SUCCESS,
		      "the idle poller's loop gets its completion");
	}

	/* rdma_disconnect: flushes, a completion event, DISCONNECTED on both sides. */
	fcntl(schan->fd, F_SETFL, 0);
	CHECK(ibv_req_notify_cq(scq, 0) == 0, "arm the server's CQ again");
	CHECK(ibv_req_notify_cq(cid->recv_cq, 0) == 0, "arm the client's receive CQ");
	CHECK(rdma_disconnect(cid) == 0, "client rdma_disconnect");
	expect_event(cch, RDMA_CM_EVENT_DISCONNECTED, 0);
	expect_event(sch, RDMA_CM_EVENT_DISCONNECTED, 0);
	rc = event_then_poll(cid->recv_cq_channel, cid->recv_cq, wc, 1);
	CHECK(rc == 1 && wc[0].wr_id == 100 && wc[0].status == IBV_WC_WR_FLUSH_ERR,
	      "the client's posted receive is flushed, with an event (status %s)",
	      rc == 1 ? ibv_wc_status_str(wc[0].status) : "-");
	rc = event_then_poll(schan, scq, wc, 3);
	CHECK(rc == 3 && wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[2].status == IBV_WC_WR_FLUSH_ERR &&
		      wc[0].wr_id == 1 && wc[2].wr_id == 3,
	      "the server's three receives are flushed (peer's disconnect), with an event");
	CHECK(rdma_disconnect(sid) == 0, "server rdma_disconnect after the peer's: 0");
	CHECK(cid->qp->state == IBV_QPS_ERR, "the client's queue pair is in ERR");
	{
		struct ibv_sge sge = { (uintptr_t)cbuf, 4, cmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 55, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(cid->qp, &rwr, &bad) == 0, "posting to a queue pair in ERR is accepted");
		rc = poll_for(cid->recv_cq, wc, 1);
		CHECK(rc == 1 && wc[0].wr_id == 55 && wc[0].status == IBV_WC_WR_FLUSH_ERR, "... and flushed");
	}

	/* Teardown, in rping's order. */
	ibv_dereg_mr(cmr);
	rdma_destroy_qp(cid);
	CHECK(cid->qp == NULL && cid->send_cq == NULL, "rdma_destroy_qp also destroys the CQs it made");
	CHECK(rdma_destroy_id(cid) == 0, "rdma_destroy_id (client)");
	CHECK(ibv_destroy_qp(sid->qp) == 0 && sid->qp == NULL, "ibv_destroy_qp of an rdma_cm queue pair");
	CHECK(ibv_destroy_cq(scq) == 0, "ibv_destroy_cq after its events were acknowledged");
	CHECK(ibv_destroy_comp_channel(schan) == 0, "ibv_destroy_comp_channel");
	ibv_dereg_mr(smr);
	CHECK(ibv_dealloc_pd(spd) == 0, "ibv_dealloc_pd");
	CHECK(rdma_destroy_id(sid) == 0, "rdma_destroy_id (server side)");

	/* --- a thread blocked in ibv_get_cq_event is cancelled ------------------------------ */
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		pthread_t t;
		void *res = NULL;
		REQUIRE(ch && pthread_create(&t, NULL, blocked_reader, ch) == 0, "a thread waits for a CQ event");
		usleep(100000);
		CHECK(pthread_cancel(t) == 0 && pthread_join(t, &res) == 0 && res == PTHREAD_CANCELED,
		      "pthread_cancel ends it (read is a cancellation point)");
		CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy its channel");
	}

	/* --- synchronous ids: rdma_create_ep and a blocking rdma_connect ------------------- */
	{
		struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
		struct ibv_qp_init_attr attr = { .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
		struct rdma_cm_id *ep;
		struct accept_args a = { .ch = sch };
		pthread_t t;
		char port[16];

		fcntl(sch->fd, F_SETFL, 0);
		snprintf(port, sizeof port, "%d", ntohs(sin.sin_port));
		REQUIRE(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0 && res && res->ai_dst_addr,
			"rdma_getaddrinfo");
		REQUIRE(rdma_create_ep(&ep, res, NULL, &attr) == 0, "rdma_create_ep (synchronous, with a QP)");
		CHECK(ep->channel != NULL && ep->qp != NULL, "the endpoint has a private channel and a QP");
		pthread_create(&t, NULL, acceptor, &a);
		CHECK(rdma_connect(ep, NULL) == 0, "rdma_connect returns once connected (synchronous id)");
		/* Closed at once, often before the server's rdma_accept has queued ESTABLISHED: the
		   server still sees ESTABLISHED, then DISCONNECTED, as rdma_cm orders them. */
		rdma_disconnect(ep);
		pthread_join(t, NULL);
		CHECK(a.ok, "the server saw the connection established");
		CHECK(a.down, "... then disconnected");
		rdma_destroy_ep(ep);
		rdma_freeaddrinfo(res);
	}

	/* --- libfabric's verbs provider: rdma_getaddrinfo from the hints alone, and ids created
	   synchronous, then moved to its event channel, whose events then come there --- */
	{
		struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(4791) };
		struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE | RAI_FAMILY, .ai_family = AF_INET,
					       .ai_qp_type = IBV_QPT_RC, .ai_port_space = RDMA_PS_TCP };
		struct rdma_addrinfo *res = NULL;
		struct rdma_event_channel *mch = rdma_create_event_channel(), *ach = rdma_create_event_channel();
		struct rdma_cm_id *mid, *aid;
		struct rdma_cm_event *stale = NULL;

		src.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		hints.ai_src_addr = (struct sockaddr *)&src;
		hints.ai_src_len = sizeof src;
		CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res && (res->ai_flags & RAI_PASSIVE) &&
			      res->ai_family == AF_INET && res->ai_src_len == sizeof src &&
			      memcmp(res->ai_src_addr, &src, sizeof src) == 0 && !res->ai_dst_addr,
		      "rdma_getaddrinfo(NULL, NULL, hints): the hints' source address, passive");
		rdma_freeaddrinfo(res);
		res = NULL;
		CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL,
		      "rdma_getaddrinfo with no node, service or hints: EINVAL");
		hints.ai_flags = RAI_FAMILY;
		CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res) == 0 && res && res->ai_dst_addr &&
			      res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC &&
			      res->ai_port_space == RDMA_PS_TCP &&
			      ((struct sockaddr_in *)res->ai_dst_addr)->sin_port == htons(7471) &&
			      res->ai_src_len == sizeof src && !(res->ai_flags & RAI_PASSIVE),
		      "rdma_getaddrinfo(node, service, hints): the destination, the hints' source kept");
		rdma_freeaddrinfo(res);

		REQUIRE(mch && ach && rdma_create_id(NULL, &mid, NULL, RDMA_PS_TCP) == 0, "a synchronous id");
		CHECK(rdma_resolve_addr(mid, NULL, (struct sockaddr *)&sin, 2000) == 0,
		      "rdma_resolve_addr returns with the address resolved (synchronous id)");
		CHECK(rdma_migrate_id(mid, mch) == 0 && mid->channel == mch, "rdma_migrate_id to a channel");
		CHECK(rdma_resolve_route(mid, 2000) == 0, "rdma_resolve_route returns at once (asynchronous now)");
		expect_event(mch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
		CHECK(rdma_migrate_id(mid, NULL) == 0 && mid->channel != mch,
		      "rdma_migrate_id(NULL): a private channel (synchronous again)");
		CHECK(rdma_migrate_id(mid, NULL) == -1 && errno == EINVAL, "... and not once more: EINVAL");
		rdma_destroy_id(mid);

		fcntl(ach->fd, F_SETFL, O_NONBLOCK);
		REQUIRE(rdma_create_id(ach, &aid, NULL, RDMA_PS_TCP) == 0, "an asynchronous id");
		CHECK(rdma_resolve_addr(aid, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
		CHECK(rdma_migrate_id(aid, mch) == 0, "rdma_migrate_id before its event was read");
		expect_event(mch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
		CHECK(rdma_get_cm_event(ach, &stale) == -1 && errno == EAGAIN,
		      "the event moved with the id: the old channel has none");
		rdma_destroy_id(aid);
		REQUIRE(rdma_create_id(ach, &aid, NULL, RDMA_PS_TCP) == 0, "another asynchronous id");
		CHECK(rdma_resolve_addr(aid, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
		CHECK(rdma_destroy_id(aid) == 0, "rdma_destroy_id before its event was read");
		CHECK(rdma_get_cm_event(ach, &stale) == -1 && errno == EAGAIN,
		      "the destroyed id's event is gone (never an event for a destroyed id)");
		rdma_destroy_event_channel(ach);
		rdma_destroy_event_channel(mch);
	}

	/* --- a listener closed and opened again on its port (perftest's server does this
	   between its control and data connections): a connect in between waits for the new
	   one (IWARP_CONNECT_RETRY_MS, 1 s by default) instead of being refused at once --- */
	{
		struct ibv_qp_init_attr attr = { .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
		struct rdma_cm_id *late, *nobody;
		struct timespec t0, t1;

		fcntl(sch->fd, F_SETFL, O_NONBLOCK);
		CHECK(rdma_destroy_id(listen_id) == 0, "the listener is destroyed");
		REQUIRE(rdma_create_id(cch, &late, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (late client)");
		CHECK(rdma_resolve_addr(late, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
		expect_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
		CHECK(rdma_resolve_route(late, 2000) == 0, "rdma_resolve_route");
		expect_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
		REQUIRE(rdma_create_qp(late, NULL, &attr) == 0, "rdma_create_qp (late client)");
		CHECK(rdma_connect(late, NULL) == 0, "rdma_connect while nothing listens on the port");
		usleep(200000);
		REQUIRE(rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP) == 0 &&
				rdma_bind_addr(listen_id, (struct sockaddr *)&sin) == 0 &&
				rdma_listen(listen_id, 4) == 0,
			"a new listener on the same port, 200 ms later");
		ev = expect_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST, 1);
		if (ev) {
			sid = ev->id;
			rdma_ack_cm_event(ev);
			struct ibv_qp_init_attr sattr = { .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
			CHECK(rdma_create_qp(sid, NULL, &sattr) == 0 && rdma_accept(sid, NULL) == 0,
			      "the new listener accepts the waiting client");
			expect_event(cch, RDMA_CM_EVENT_ESTABLISHED, 0);
			expect_event(sch, RDMA_CM_EVENT_ESTABLISHED, 0);
			rdma_disconnect(late);
			expect_event(cch, RDMA_CM_EVENT_DISCONNECTED, 0);
			expect_event(sch, RDMA_CM_EVENT_DISCONNECTED, 0);
			rdma_destroy_qp(sid);
			rdma_destroy_id(sid);
		}
		rdma_destroy_qp(late);
		rdma_destroy_id(late);

		/* Nobody comes back: the connect is refused once the retry time is over. */
		CHECK(rdma_destroy_id(listen_id) == 0, "the new listener is destroyed too");
		REQUIRE(rdma_create_id(cch, &nobody, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (third client)");
		CHECK(rdma_resolve_addr(nobody, NULL, (struct sockaddr *)&sin, 2000) == 0, "rdma_resolve_addr");
		expect_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
		CHECK(rdma_resolve_route(nobody, 2000) == 0, "rdma_resolve_route");
		expect_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
		attr.send_cq = attr.recv_cq = NULL; /* (rdma_create_qp filled in the late client's) */
		REQUIRE(rdma_create_qp(nobody, NULL, &attr) == 0, "rdma_create_qp (third client)");
		clock_gettime(CLOCK_MONOTONIC, &t0);
		CHECK(rdma_connect(nobody, NULL) == 0, "rdma_connect to a port nobody listens on");
		ev = expect_event(cch, RDMA_CM_EVENT_REJECTED, 1);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		CHECK(ev && ev->status == -ECONNREFUSED, "REJECTED with -ECONNREFUSED, as the kernel's iWARP CM");
		CHECK(t1.tv_sec - t0.tv_sec + (t1.tv_nsec - t0.tv_nsec) / 1e9 >= 0.9,
		      "... after the retry time (%.2f s)", t1.tv_sec - t0.tv_sec + (t1.tv_nsec - t0.tv_nsec) / 1e9);
		if (ev)
			rdma_ack_cm_event(ev);
		rdma_destroy_qp(nobody);
		rdma_destroy_id(nobody);
	}

	/* --- a thread that reads a channel after its destruction waits (as on rdma-core's event
	   file, where no event comes), rather than failing: rping's event thread does that when
	   the main thread tears down first --------------------------------------------------- */
	{
		struct rdma_event_channel *gone = rdma_create_event_channel();
		pthread_t t;
		void *res = NULL;
		REQUIRE(gone, "rdma_create_event_channel");
		rdma_destroy_event_channel(gone);
		REQUIRE(pthread_create(&t, NULL, reads_destroyed_channel, gone) == 0, "a thread reads it");
		usleep(100000);
		CHECK(pthread_tryjoin_np(t, &res) == EBUSY, "it is still waiting 100 ms later");
		CHECK(pthread_cancel(t) == 0 && pthread_join(t, &res) == 0 && res == PTHREAD_CANCELED,
		      "pthread_cancel ends it");
	}

	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("# %d checks, %d failed\n", n, fails);
	return fails;
}
