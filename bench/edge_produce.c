// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * edge_produce.c - the edge's cost per transport record (issue 60): the agent writing its segment
 * files against the agent producing the same records to Kafka itself (librdkafka, in-process).
 * Driven by bench/edge_produce.py, which compares both with the Python shipper beside the agent.
 *
 *   edge_produce write   MANIFEST OUTDIR [--drain N] [--pace-ms MS]
 *   edge_produce produce MANIFEST BOOTSTRAP [--pace-ms MS]
 *
 * MANIFEST: one segment a line, "<node_id>\t<name>\t<path>": the agent's rotated segments
 * (<YYYY-MM-DDTHHMM>.jsonl) of the transport stream. Every segment is read into memory before
 * the clock starts: the records are the agent's bytes, already formatted (formatting costs the
 * agent the same in both cases: export/edge/translog.c format_record, into a buffer).
 *
 * write: export/edge/translog.c's write path, the same calls in the same order, on the records'
 * bytes: per segment, openat .<name>.part (O_CREAT|O_TRUNC), records appended to a 64 KiB buffer
 * (OUT_BUF) that is pwritten when a record might not fit (len + RECORD_MAX > OUT_BUF); after every
 * N records (a drain of the ring: the agent drains every 200 ms) the buffer is pwritten and the
 * file fdatasynced; at the segment's end: pwrite, fsync, close, renameat to <name>, fsync of the
 * folder. --drain 0: one drain per segment (the fewest syncs the agent could do).
 *
 * produce: librdkafka (Debian's) in the agent: one producer, idempotent, acks=all, the shipper's
 * settings (export/edge/shipper.py: linger.ms 20, lz4, the murmur2_random partitioner), topic
 * ccs.transport, the record's bytes without the newline as the value, the node as the key, and the
 * shipper's headers (ccs.stream, ccs.hour, ccs.origin <stream>/<node>/<name>:<line>, ccs.identity
 * node_id/conn_id: the agent knows the conn_id; here it is read from the line), copied
 * (RD_KAFKA_MSG_F_COPY: the agent's buffer is reused). The clock covers rd_kafka_new to the
 * flush that has every record acknowledged, and rd_kafka_destroy; its setup (rd_kafka_new until
 * the cluster's metadata is fetched: what a long-running agent pays once) is reported apart too.
 *
 * --pace-ms MS: a record every MS ms (nanosleep between records; the sleep costs no CPU), so the
 * cost of a record arriving alone (the agent at a fleet's real rate: 1,500 connections a node-hour
 * is one record every 2.4 s, so each 200 ms drain holds at most one) is measured too.
 *
 * Prints one JSON line: records, user_s, sys_s, wall_s (getrusage(RUSAGE_SELF): every thread,
 * librdkafka's included), and for produce the records not delivered (must be 0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <librdkafka/rdkafka.h>

#define OUT_BUF (64 * 1024)   /* translog.c */
#define RECORD_MAX 4096       /* translog.c */

struct seg {
	char node[128];
	char name[64];
	char *data;               /* the segment's bytes */
	size_t len;
};

static struct seg *segs;
static size_t n_segs;
static long long n_records;

static void die(const char *what)
{
	fprintf(stderr, "edge_produce: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void load(const char *manifest)
{
	FILE *f = fopen(manifest, "r");
	char line[4096], *node, *name, *path;
	size_t cap = 0;
	struct stat st;
	int fd;

	if (!f)
		die(manifest);
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		node = strtok(line, "\t");
		name = strtok(NULL, "\t");
		path = strtok(NULL, "\t");
		if (!node || !name || !path)
			continue;
		if (n_segs == cap) {
			cap = cap ? 2 * cap : 1024;
			segs = realloc(segs, cap * sizeof(*segs));
		}
		struct seg *s = &segs[n_segs++];
		snprintf(s->node, sizeof(s->node), "%s", node);
		snprintf(s->name, sizeof(s->name), "%s", name);
		fd = open(path, O_RDONLY);
		if (fd < 0 || fstat(fd, &st))
			die(path);
		s->data = malloc((size_t)st.st_size + 1);
		s->len = 0;
		while (s->len < (size_t)st.st_size) {
			ssize_t k = read(fd, s->data + s->len, (size_t)st.st_size - s->len);
			if (k <= 0)
				die(path);
			s->len += (size_t)k;
		}
		close(fd);
		for (size_t i = 0; i < s->len; i++)
			n_records += s->data[i] == '\n';
	}
	fclose(f);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void pace(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};

	if (ms > 0)
		while (nanosleep(&t, &t) && errno == EINTR)
			;
}

/* the load's own CPU (reading the manifest and the segments) is taken off what is reported */
static struct rusage base;

static void report_since(const char *mode, double wall, long long failed, const char *extra)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	printf("{\"mode\": \"%s\", \"records\": %lld, \"segments\": %zu, \"user_s\": %.6f, \"sys_s\": %.6f, "
	       "\"wall_s\": %.6f, \"failed\": %lld%s}\n", mode, n_records, n_segs,
	       (ru.ru_utime.tv_sec - base.ru_utime.tv_sec) + (ru.ru_utime.tv_usec - base.ru_utime.tv_usec) / 1e6,
	       (ru.ru_stime.tv_sec - base.ru_stime.tv_sec) + (ru.ru_stime.tv_usec - base.ru_stime.tv_usec) / 1e6,
	       wall, failed, extra);
}

/* ---- write: translog.c's path ------------------------------------------------------------------ */
struct out {
	int fd;
	off_t good;
	size_t len;
	char *buf;
};

static long long write_failed;

static void out_flush(struct out *o)
{
	size_t w = 0;
	ssize_t k;

	while (w < o->len) {
		k = pwrite(o->fd, o->buf + w, o->len - w, o->good + (off_t)w);
		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			write_failed++;
			break;
		}
		w += (size_t)k;
	}
	o->good += (off_t)w;
	o->len = 0;
}

static int do_write(const char *outdir, long drain, long pace_ms)
{
	struct out o = {.fd = -1, .buf = malloc(OUT_BUF)};
	char part[96];
	int dir_fd;
	double t0;
	long since_sync;

	if (mkdir(outdir, 0755) && errno != EEXIST)
		die(outdir);
	dir_fd = open(outdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dir_fd < 0)
		die(outdir);
	getrusage(RUSAGE_SELF, &base);
	t0 = now_s();
	for (size_t i = 0; i < n_segs; i++) {
		struct seg *s = &segs[i];
		char *p = s->data, *end = s->data + s->len, *nl;

		snprintf(part, sizeof(part), ".%s.part", s->name);
		o.fd = openat(dir_fd, part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (o.fd < 0)
			die(part);
		if (fsync(dir_fd))   /* translog.c: the new .part's entry lasts */
			write_failed++;
		o.good = 0;
		o.len = 0;
		since_sync = 0;
		while (p < end) {
			nl = memchr(p, '\n', (size_t)(end - p));
			size_t n = nl ? (size_t)(nl - p + 1) : (size_t)(end - p);

			pace(pace_ms);
			if (o.len + RECORD_MAX > OUT_BUF)
				out_flush(&o);
			memcpy(o.buf + o.len, p, n);   /* format_record writes the record here */
			o.len += n;
			p += n;
			if (drain > 0 && ++since_sync >= drain) {   /* a drain: flush_all */
				out_flush(&o);
				if (fdatasync(o.fd))
					write_failed++;
				since_sync = 0;
			}
		}
		out_flush(&o);                                     /* close_segment -> out_close */
		if (fsync(o.fd))
			write_failed++;
		if (close(o.fd))
			write_failed++;
		if (renameat(dir_fd, part, dir_fd, s->name))
			die("rename");
		if (fsync(dir_fd))
			write_failed++;
	}
	char extra[96];
	snprintf(extra, sizeof(extra), ", \"drain_records\": %ld, \"pace_ms\": %ld", drain, pace_ms);
	report_since("write", now_s() - t0, write_failed, extra);
	return write_failed != 0;
}

/* ---- produce: librdkafka in the agent ---------------------------------------------------------- */
static long long delivered, undelivered;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void)rk;
	(void)opaque;
	if (m->err) {
		if (undelivered++ < 5)
			fprintf(stderr, "edge_produce: not delivered: %s\n", rd_kafka_err2str(m->err));
	} else {
		delivered++;
	}
}

static void set(rd_kafka_conf_t *c, const char *k, const char *v)
{
	char err[256];

	if (rd_kafka_conf_set(c, k, v, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
		fprintf(stderr, "edge_produce: %s=%s: %s\n", k, v, err);
		exit(1);
	}
}

/* the identity header: "<node_id>/<conn_id>" (contract.IDENTITY), the conn_id read from the line */
static size_t identity(char *out, size_t cap, const char *node, const char *line, size_t n)
{
	static const char key[] = "\"conn_id\":";
	const char *p = memmem(line, n, key, sizeof(key) - 1), *end = line + n, *q;

	if (!p)
		return 0;
	p += sizeof(key) - 1;
	while (p < end && (*p == ' ' || *p == '"'))
		p++;
	for (q = p; q < end && *q != '"' && *q != ',' && *q != '}'; q++)
		;
	return (size_t)snprintf(out, cap, "%s/%.*s", node, (int)(q - p), p);
}

static int do_produce(const char *bootstrap, long pace_ms)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char err[512], origin[256], ident[256], hour[16];
	double t0;
	rd_kafka_resp_err_t e;

	getrusage(RUSAGE_SELF, &base);
	t0 = now_s();
	conf = rd_kafka_conf_new();
	set(conf, "bootstrap.servers", bootstrap);
	set(conf, "enable.idempotence", "true");
	set(conf, "acks", "all");
	set(conf, "linger.ms", "20");
	set(conf, "compression.type", "lz4");
	set(conf, "partitioner", "murmur2_random");
	set(conf, "message.timeout.ms", "120000");
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (!rk) {
		fprintf(stderr, "edge_produce: rd_kafka_new: %s\n", err);
		return 1;
	}
	/* connected: the cluster's metadata fetched (what a long-running agent paid once) */
	const struct rd_kafka_metadata *md;
	struct rusage setup;

	e = rd_kafka_metadata(rk, 0, NULL, &md, 30000);
	if (e) {
		fprintf(stderr, "edge_produce: metadata: %s\n", rd_kafka_err2str(e));
		return 1;
	}
	rd_kafka_metadata_destroy(md);
	getrusage(RUSAGE_SELF, &setup);
	double setup_wall = now_s() - t0;
	for (size_t i = 0; i < n_segs; i++) {
		struct seg *s = &segs[i];
		char *p = s->data, *end = s->data + s->len, *nl;
		long line_no = 0;

		snprintf(hour, sizeof(hour), "%.13s", s->name);   /* <YYYY-MM-DDTHH> of <...THHMM>.jsonl */
		while (p < end) {
			nl = memchr(p, '\n', (size_t)(end - p));
			size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
			size_t ni = identity(ident, sizeof(ident), s->node, p, n);
			int no = snprintf(origin, sizeof(origin), "transport/%s/%s:%ld", s->node, s->name, ++line_no);

			pace(pace_ms);
			do {
				e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("ccs.transport"),
						      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
						      RD_KAFKA_V_KEY(s->node, strlen(s->node)), RD_KAFKA_V_VALUE(p, n),
						      RD_KAFKA_V_HEADER("ccs.stream", "transport", 9),
						      RD_KAFKA_V_HEADER("ccs.hour", hour, (ssize_t)strlen(hour)),
						      RD_KAFKA_V_HEADER("ccs.origin", origin, no),
						      RD_KAFKA_V_HEADER("ccs.identity", ident, (ssize_t)ni),
						      RD_KAFKA_V_END);
				if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
					rd_kafka_poll(rk, 100);   /* the local queue is full: let it drain */
			} while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
			if (e) {
				fprintf(stderr, "edge_produce: produce: %s\n", rd_kafka_err2str(e));
				undelivered++;
			}
			rd_kafka_poll(rk, 0);
			p += n + (nl ? 1 : 0);
		}
	}
	e = rd_kafka_flush(rk, 120000);
	if (e)
		fprintf(stderr, "edge_produce: flush: %s (%d left)\n", rd_kafka_err2str(e), rd_kafka_outq_len(rk));
	rd_kafka_destroy(rk);
	char extra[320];
	snprintf(extra, sizeof(extra), ", \"delivered\": %lld, \"pace_ms\": %ld, \"librdkafka\": \"%s\", "
		 "\"setup_user_s\": %.6f, \"setup_sys_s\": %.6f, \"setup_wall_s\": %.6f", delivered, pace_ms,
		 rd_kafka_version_str(),
		 (setup.ru_utime.tv_sec - base.ru_utime.tv_sec) + (setup.ru_utime.tv_usec - base.ru_utime.tv_usec) / 1e6,
		 (setup.ru_stime.tv_sec - base.ru_stime.tv_sec) + (setup.ru_stime.tv_usec - base.ru_stime.tv_usec) / 1e6,
		 setup_wall);
	report_since("produce", now_s() - t0, undelivered + (n_records - delivered - undelivered), extra);
	return delivered != n_records;
}

int main(int argc, char **argv)
{
	long drain = 0, pace_ms = 0;

	if (argc < 4) {
		fprintf(stderr, "usage: edge_produce write MANIFEST OUTDIR [--drain N] [--pace-ms MS]\n"
				"       edge_produce produce MANIFEST BOOTSTRAP [--pace-ms MS]\n");
		return 2;
	}
	for (int i = 4; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--drain"))
			drain = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--pace-ms"))
			pace_ms = atol(argv[i + 1]);
	}
	load(argv[2]);
	if (!strcmp(argv[1], "write"))
		return do_write(argv[3], drain, pace_ms);
	if (!strcmp(argv[1], "produce"))
		return do_produce(argv[3], pace_ms);
	fprintf(stderr, "edge_produce: unknown mode %s\n", argv[1]);
	return 2;
}
