// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * translog.c - the transport log: records of sampled connections, from the ring buffer
 * (ccs_events) to <out>/transport/<node_id>/, one JSON object a line with the fields of
 * ccselect/contract.py TRANSPORT_FIELDS (log, run); and the TTL watchdog (run).
 *
 * Files (ccselect/contract.py, the rotated layout of issue 26): with rotate_minutes R (default
 * 1), segments <YYYY-MM-DDTHHMM>.jsonl named by the UTC minute they start at (a multiple of R),
 * holding the records whose ts_end_ms falls in them. A segment is written hidden, as
 * .<name>.part, and renamed into place once complete: R minutes + SEG_GRACE_MS after its start,
 * or when the agent stops (SIGTERM, SIGINT, the end of a drain). A record for a segment already
 * closed (it came late, or an earlier run closed it) goes to <YYYY-MM-DDTHHMM>.<seq>.jsonl, the
 * first seq whose file and .part are both free. With R = 0, the hourly <YYYY-MM-DDTHH>.jsonl
 * of ts_end_ms, appended to.
 *
 * The log is a ledger (ccs_log, status "log"): a record taken from the ring is either written
 * whole or counted lost. Records are formatted into a buffer per file and written with pwrite at
 * the file's last whole record (`good`); a write that fails part-way (ENOSPC) keeps the whole
 * records that made it, truncates the rest and counts the others lost, so a file never holds a
 * partial line and the next write, when space returns, starts on a line of its own. Every failed
 * file call is counted; the agent goes on (degraded, saying so) and enforcement never depends on it.
 * The ring is read in place (struct ring) and its records released to the kernel only once they
 * are written and synced: a killed agent loses none (a kill between the two repeats a few). A
 * killed agent's .part is renamed into place by the agent running once its segment is over.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "agent.h"

/* segments open at once: the current one, the previous one in its grace, a late record's */
#define SEG_OPEN_MAX 4
/* a segment closes this long after its end: records of connections that closed just before the
 * boundary are still on their way through the ring (drained every 200 ms) */
#define SEG_GRACE_MS 2000
/* the largest .<seq> the contract's file name takes (ccselect/contract.py FILE_NAME) */
#define SEG_SEQ_MAX 999999

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* a file the log writes: its descriptor, its length up to the last whole record, and the
 * records formatted but not yet written */
struct out {
	int fd;          /* -1: not open */
	off_t good;      /* bytes of whole records written */
	bool cut;        /* a failed write may have left bytes after `good`: truncate at close */
	bool unsynced;   /* written since its last fdatasync */
	size_t len;      /* bytes in buf */
	unsigned n;      /* records in buf */
	char *buf;       /* OUT_BUF bytes */
};

/* records are written when a file's buffer is full and after every drain of the ring */
#define OUT_BUF (64 * 1024)
/* the largest record: ~750 bytes of keys and numbers + 2 escaped node ids + ip + cc + boot */
#define RECORD_MAX 4096

struct segment {
	struct out o;
	long long start_min;   /* unix minute the segment starts at */
	char name[48];         /* the final name, <YYYY-MM-DDTHHMM>[.<seq>].jsonl */
	char part[56];         /* the name while written, .<name>.part */
};

struct logger {
	const char *out;
	char dir[PATH_MAX];
	int dir_fd;
	char boot[9];
	char node_json[6 * 128];  /* the node id, JSON-escaped (no quotes) */
	int rotate_minutes;       /* the config's: segments of that many minutes; 0 = hourly files */
	__s64 boot_to_real_ns;
	struct out hourly;        /* rotate_minutes 0: the hourly file */
	char hour_name[32];
	long long hour;           /* unix hour of the open file */
	struct segment seg[SEG_OPEN_MAX];
	int n_seg;
	unsigned long long written;   /* records written whole by this run */
	struct ccs_log_state st;      /* the ledger: ccs_log[0] plus this run's counts */
	int ledger_fd;                /* ccs_log, -1 with a pin dir from before it */
	bool dirty;                   /* st changed since it was last written to ccs_log */
};

static int mkdirs(const char *path)
{
	char tmp[PATH_MAX], *p;

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			if (mkdir(tmp, 0755) && errno != EEXIST)
				return -errno;
			*p = '/';
		}
	}
	if (mkdir(tmp, 0755) && errno != EEXIST)
		return -errno;
	return 0;
}

/* append-only formatting helpers for log_event (no bounds: the caller's buffer fits a record) */
static inline char *put_s(char *p, const char *s)
{
	size_t n = strlen(s);

	memcpy(p, s, n);
	return p + n;
}

static inline char *put_u(char *p, unsigned long long v)
{
	char t[20];
	int i = 0;

	do {
		t[i++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (i)
		*p++ = t[--i];
	return p;
}

static inline char *put_i(char *p, long long v)
{
	if (v < 0) {
		*p++ = '-';
		return put_u(p, 0ULL - (unsigned long long)v);
	}
	return put_u(p, (unsigned long long)v);
}

static inline char *put_hex16(char *p, unsigned long long v)
{
	static const char hx[] = "0123456789abcdef";

	for (int i = 15; i >= 0; i--)
		*p++ = hx[(v >> (4 * i)) & 0xf];
	return p;
}

/* the ledger into ccs_log (when it changed); the program never reads it */
static void ledger_save(struct logger *lg)
{
	__u32 zero = 0;

	if (lg->dirty && lg->ledger_fd >= 0 &&
	    !bpf_map_update_elem(lg->ledger_fd, &zero, &lg->st, BPF_ANY))
		lg->dirty = false;
}

/*
 * A failed file call: counted, remembered for status, said on stderr when the log turns degraded
 * (not once per record: a full volume fails every write until space returns).
 */
static void log_failed(struct logger *lg, const char *op, const char *file, int err)
{
	if (!lg->st.degraded)
		fprintf(stderr, "ccs-edge: transport log degraded: %s %s/%s: %s (records lost are "
			"counted: status \"log\"; enforcement goes on)\n", op, lg->dir, file, strerror(err));
	lg->st.errors++;
	lg->st.degraded = 1;
	lg->st.last_errno = err;
	lg->st.last_error_unix = (__u64)time(NULL);
	snprintf(lg->st.last_op, sizeof(lg->st.last_op), "%s %s", op, file);
	lg->dirty = true;
}

static void log_lost(struct logger *lg, unsigned n)
{
	lg->st.lost += n;
	lg->dirty = true;
}

static void log_written(struct logger *lg, unsigned n)
{
	if (lg->st.degraded && n) {
		fprintf(stderr, "ccs-edge: transport log writes again (%llu records lost, %llu errors "
			"so far)\n", (unsigned long long)lg->st.lost, (unsigned long long)lg->st.errors);
		lg->st.degraded = 0;
	}
	lg->st.written += n;
	lg->written += n;
	lg->dirty = true;
}

static void out_open(struct out *o, int fd, off_t good)
{
	o->fd = fd;
	o->good = good;
	o->cut = false;
	o->unsynced = false;
	o->len = 0;
	o->n = 0;
}

/*
 * Write the buffered records at the file's last whole record. On a failure part-way, the whole
 * records that made it stay (counted written), the bytes after them are cut, the rest is counted
 * lost: the file ends on a whole line, and the next write starts a line of its own.
 */
static void out_flush(struct logger *lg, struct out *o, const char *name)
{
	size_t w = 0, keep;
	unsigned n_keep = 0;
	ssize_t k;
	int err = 0;

	if (!o->len)
		return;
	while (w < o->len) {
		k = pwrite(o->fd, o->buf + w, o->len - w, o->good + (off_t)w);
		if (k <= 0) {
			err = k < 0 ? errno : ENOSPC;
			if (err == EINTR)
				continue;
			break;
		}
		w += (size_t)k;
	}
	o->unsynced = true;
	if (!err) {
		o->good += (off_t)w;
		log_written(lg, o->n);
	} else {
		for (keep = w; keep && o->buf[keep - 1] != '\n'; keep--)
			;
		for (size_t i = 0; i < keep; i++)
			n_keep += o->buf[i] == '\n';
		o->good += (off_t)keep;
		o->cut = true;
		if (!ftruncate(o->fd, o->good))
			o->cut = false;
		log_failed(lg, "write", name, err);
		lg->st.written += n_keep;
		lg->written += n_keep;
		log_lost(lg, o->n - n_keep);
	}
	o->len = 0;
	o->n = 0;
}

/*
 * The buffered records written, the file cut at its last whole record, synced and closed; false
 * when it could not be cut (it may end in a partial line). A failed fsync or close is counted.
 */
static bool out_close(struct logger *lg, struct out *o, const char *name)
{
	bool whole = true;

	out_flush(lg, o, name);
	if (o->cut && ftruncate(o->fd, o->good)) {
		log_failed(lg, "truncate", name, errno);
		whole = false;
	}
	if (fsync(o->fd))
		log_failed(lg, "fsync", name, errno);
	if (close(o->fd))
		log_failed(lg, "close", name, errno);
	o->fd = -1;
	return whole;
}

/* the end of a file of `size` bytes at its last whole line: after the last newline within its last
 * 4 KiB (a record is < 2.5 KiB); 0 for a file without one; size when 4 KiB hold no newline, or
 * when it cannot be read (nothing is cut then) */
static off_t whole_end(int fd, off_t size)
{
	char tail[RECORD_MAX];
	off_t from = size > (off_t)sizeof(tail) ? size - (off_t)sizeof(tail) : 0;
	ssize_t n = pread(fd, tail, (size_t)(size - from), from);

	if (n != size - from)
		return size;
	while (n > 0 && tail[n - 1] != '\n')
		n--;
	return n > 0 ? from + n : from ? size : 0;
}

/* the JSONL file of a unix hour: <dir>/<YYYY-MM-DDTHH>.jsonl (UTC), written after its end */
static struct out *open_hour(struct logger *lg, long long hour)
{
	time_t hsec = (time_t)(hour * 3600);
	struct tm tm;
	off_t end;
	int fd;

	if (lg->hourly.fd >= 0)
		out_close(lg, &lg->hourly, lg->hour_name);
	gmtime_r(&hsec, &tm);
	snprintf(lg->hour_name, sizeof(lg->hour_name), "%04d-%02d-%02dT%02d.jsonl",
		 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour);
	fd = openat(lg->dir_fd, lg->hour_name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	/* appended to at its last whole line: a partial one a killed agent left is written over */
	end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
	if (end > 0)
		end = whole_end(fd, end);
	if (end < 0 || ftruncate(fd, end)) {
		log_failed(lg, "open", lg->hour_name, errno);
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	out_open(&lg->hourly, fd, end);
	lg->hour = hour;
	return &lg->hourly;
}

/* "<YYYY-MM-DDTHHMM>[.<seq>].jsonl" of a segment starting at unix minute start_min */
static void segment_name(char *out, size_t n, long long start_min, int seq)
{
	time_t t = (time_t)(start_min * 60);
	struct tm tm;
	int k;

	gmtime_r(&t, &tm);
	k = snprintf(out, n, "%04d-%02d-%02dT%02d%02d", tm.tm_year + 1900, tm.tm_mon + 1,
		     tm.tm_mday, tm.tm_hour, tm.tm_min);
	snprintf(out + k, n - k, seq ? ".%d.jsonl" : ".jsonl", seq);
}

/*
 * Close a segment: its records written, cut at the last whole record, fsync, close, rename
 * .<name>.part to <name> (then fsync the folder: the rename lasts). A segment none of whose
 * records could be written goes (never an empty file). A failure is counted, and the .part left.
 */
static void close_segment(struct logger *lg, int i)
{
	struct segment s = lg->seg[i];
	const char *part = s.part;

	lg->seg[i] = lg->seg[--lg->n_seg];
	lg->seg[lg->n_seg].o.buf = s.o.buf;   /* the freed slot keeps a buffer */
	if (!out_close(lg, &s.o, part))
		return;   /* a partial line it could not cut: recover_part cuts it later */
	if (s.o.good == 0) {
		unlinkat(lg->dir_fd, part, 0);
		return;
	}
	if (renameat(lg->dir_fd, part, lg->dir_fd, s.name)) {
		log_failed(lg, "rename", part, errno);
		return;
	}
	if (fsync(lg->dir_fd))
		log_failed(lg, "fsync", ".", errno);
}

/* close the segments whose end + grace has passed by wall clock (every one when `all`) */
static void close_segments(struct logger *lg, bool all)
{
	long long now_ms = (long long)(clock_ns(CLOCK_REALTIME) / 1000000);
	int i;

	for (i = lg->n_seg - 1; i >= 0; i--)
		if (all || now_ms >= (lg->seg[i].start_min + lg->rotate_minutes) * 60000 + SEG_GRACE_MS)
			close_segment(lg, i);
}

/*
 * The open segment starting at start_min, opened on its first record (an empty segment is never
 * created) as .<name>.part under the first name whose file and .part are both free: seq 0 the
 * first time, then .1, .2, ... for a segment closed before (a late record, an earlier run).
 * NULL (the failure counted) when it cannot be opened.
 */
static struct segment *segment_of(struct logger *lg, long long start_min)
{
	char part[sizeof(lg->seg[0].name) + 8];
	struct segment *s;
	int i, fd = -1, seq, oldest = 0;

	for (i = 0; i < lg->n_seg; i++)
		if (lg->seg[i].start_min == start_min)
			return &lg->seg[i];
	if (lg->n_seg == SEG_OPEN_MAX) {   /* records far apart in time: close the oldest */
		for (i = 1; i < lg->n_seg; i++)
			if (lg->seg[i].start_min < lg->seg[oldest].start_min)
				oldest = i;
		close_segment(lg, oldest);
	}
	s = &lg->seg[lg->n_seg];
	for (seq = 0; seq <= SEG_SEQ_MAX; seq++) {
		segment_name(s->name, sizeof(s->name), start_min, seq);
		snprintf(part, sizeof(part), ".%s.part", s->name);
		if (!faccessat(lg->dir_fd, s->name, F_OK, AT_SYMLINK_NOFOLLOW))
			continue;   /* closed before: the next seq */
		if (errno != ENOENT)
			break;
		fd = openat(lg->dir_fd, part, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		log_failed(lg, seq > SEG_SEQ_MAX ? "no free .<seq> for" : "open", part,
			   seq > SEG_SEQ_MAX ? ENOSPC : errno);
		return NULL;
	}
	if (fsync(lg->dir_fd))   /* the new .part's entry lasts, with the records synced into it */
		log_failed(lg, "fsync", ".", errno);
	out_open(&s->o, fd, 0);
	snprintf(s->part, sizeof(s->part), "%s", part);
	s->start_min = start_min;
	lg->n_seg++;
	return s;
}

/*
 * A .part left by an agent that was killed (SIGKILL, a crash): once its segment has ended, cut a
 * partly written last line and rename it into place, as a close would have; an empty one goes.
 */
static void recover_part(struct logger *lg, const char *part, long long now_ms)
{
	char name[NAME_MAX + 1];
	struct tm tm = {};
	long long start_ms, span_min = lg->rotate_minutes ? lg->rotate_minutes : 60;
	off_t size, keep;
	int fd;

	snprintf(name, sizeof(name), "%.*s", (int)strlen(part) - 6, part + 1);
	if (sscanf(name, "%4d-%2d-%2dT%2d%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
		   &tm.tm_min) != 5 || strlen(name) < 21)
		return;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	start_ms = (long long)timegm(&tm) * 1000;
	if (now_ms < start_ms + span_min * 60000 + SEG_GRACE_MS ||
	    !faccessat(lg->dir_fd, name, F_OK, AT_SYMLINK_NOFOLLOW))
		return;   /* not over yet (maybe another writer's), or its name is taken */
	fd = openat(lg->dir_fd, part, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	if (size < 0) {
		close(fd);
		return;
	}
	keep = whole_end(fd, size);
	if (keep < size && ftruncate(fd, keep))
		keep = size;
	fsync(fd);
	close(fd);
	if (keep == 0)
		unlinkat(lg->dir_fd, part, 0);
	else if (!renameat(lg->dir_fd, part, lg->dir_fd, name))
		fprintf(stderr, "ccs-edge: recovered %s/%s (%lld bytes cut)\n", lg->dir, name,
			(long long)(size - keep));
}

static void recover_parts(struct logger *lg)
{
	long long now_ms = (long long)(clock_ns(CLOCK_REALTIME) / 1000000);
	int fd = dup(lg->dir_fd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	size_t n;
	int i;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(d);   /* a dup shares the offset the last pass left at the end */
	while ((e = readdir(d))) {
		n = strlen(e->d_name);
		if (e->d_name[0] != '.' || n <= 12 || strcmp(e->d_name + n - 11, ".jsonl.part"))
			continue;
		for (i = 0; i < lg->n_seg && strcmp(lg->seg[i].part, e->d_name); i++)
			;
		if (i == lg->n_seg)   /* not one of ours, open */
			recover_part(lg, e->d_name, now_ms);
	}
	closedir(d);
	fsync(lg->dir_fd);
}

/*
 * One record as a JSON line at p; returns its end. Hand-rolled formatting (one fwrite per
 * record): fprintf with 25 conversions was ~2 us a record, on the same 2 cores as the
 * connections being logged. The caller's buffer fits a record: ~750 bytes of keys and numbers
 * + 2 JSON-escaped node ids (< 6 * 128 each) + ip + cc + boot. The cc name is the kernel's
 * (printable), the node id is escaped once at start.
 */
static char *format_record(char *p, const struct logger *lg, const struct ccs_conn *c,
			   long long start_ms, long long end_ms)
{
	char ip[INET6_ADDRSTRLEN] = "", cc[17];

	inet_ntop(c->family == 4 ? AF_INET : AF_INET6, c->addr, ip, sizeof(ip));
	memcpy(cc, c->cc, 16);
	cc[16] = 0;
	p = put_s(p, "{\"conn_id\": \"");
	p = put_s(p, lg->node_json);
	*p++ = '-';
	p = put_s(p, lg->boot);
	p = put_hex16(p, c->cookie);
	p = put_s(p, "\", \"node_id\": \"");
	p = put_s(p, lg->node_json);
	p = put_s(p, "\", \"ts_start_ms\": ");
	p = put_i(p, start_ms);
	p = put_s(p, ", \"ts_end_ms\": ");
	p = put_i(p, end_ms);
	p = put_s(p, ", \"client_ip\": \"");
	p = put_s(p, ip);
	p = put_s(p, "\", \"client_port\": ");
	p = put_u(p, c->client_port);
	p = put_s(p, ", \"server_port\": ");
	p = put_u(p, c->server_port);
	p = put_s(p, ", \"cc\": \"");
	p = put_s(p, cc);
	p = put_s(p, "\", \"decision\": \"");
	p = put_s(p, c->decision <= CCS_DEC__MAX ? ccs_decision_names[c->decision] : "default");
	p = put_s(p, "\", \"table_version\": ");
	if (c->has_table) {
		*p++ = '"';
		p = put_u(p, c->table_version);
		*p++ = '"';
	} else {
		p = put_s(p, "null");
	}
	p = put_s(p, ", \"mss_bytes\": ");
	p = put_u(p, c->mss_bytes);
	p = put_s(p, ", \"connection_time_us\": ");
	p = put_u(p, c->connection_time_us);
	p = put_s(p, ", \"init_snd_wnd_bytes\": ");
	p = put_u(p, c->init_snd_wnd_bytes);
	p = put_s(p, ", \"min_rtt_us\": ");
	p = put_u(p, c->min_rtt_us);
	p = put_s(p, ", \"max_snd_wnd_bytes\": ");
	p = put_u(p, c->max_snd_wnd_bytes);
	p = put_s(p, ", \"min_snd_wnd_bytes\": ");
	p = put_u(p, c->min_snd_wnd_bytes);
	p = put_s(p, ", \"min_rtt_var_us\": ");
	p = put_u(p, c->min_rtt_var_us);
	p = put_s(p, ", \"max_rtt_var_us\": ");
	p = put_u(p, c->max_rtt_var_us);
	p = put_s(p, ", \"min_rto_us\": ");
	p = put_u(p, c->min_rto_us);
	p = put_s(p, ", \"min_srtt_us\": ");
	p = put_u(p, c->min_srtt_us);
	p = put_s(p, ", \"max_srtt_us\": ");
	p = put_u(p, c->max_srtt_us);
	p = put_s(p, ", \"max_cwnd_segs\": ");
	p = put_u(p, c->max_cwnd_segs);
	p = put_s(p, ", \"bytes_acked\": ");
	p = put_u(p, c->bytes_acked);
	p = put_s(p, ", \"data_segs_out\": ");
	p = put_u(p, c->data_segs_out);
	p = put_s(p, ", \"total_retrans\": ");
	p = put_u(p, c->total_retrans);
	p = put_s(p, ", \"max_inflight_segs\": ");
	p = put_u(p, c->max_inflight_segs);
	p = put_s(p, ", \"duration_us\": ");
	p = put_u(p, c->end_boot_ns > c->start_boot_ns ? (c->end_boot_ns - c->start_boot_ns) / 1000 : 0);
	return put_s(p, "}\n");
}

/* one record from the ring into its file's buffer; it is written (or counted lost), never refused */
static int log_event(void *ctx, void *data, size_t size)
{
	struct logger *lg = ctx;
	const struct ccs_conn *c = data;
	long long start_ms, end_ms, hour;
	struct segment *s = NULL;
	struct out *o;
	const char *name;

	if (size < sizeof(*c))
		return 0;
	start_ms = ((__s64)c->start_boot_ns + lg->boot_to_real_ns) / 1000000;
	end_ms = ((__s64)c->end_boot_ns + lg->boot_to_real_ns) / 1000000;
	if (lg->rotate_minutes) {
		s = segment_of(lg, end_ms / 60000 / lg->rotate_minutes * lg->rotate_minutes);
		o = s ? &s->o : NULL;
		name = s ? s->part : "";
	} else {
		hour = end_ms / 3600000;
		o = lg->hourly.fd >= 0 && hour == lg->hour ? &lg->hourly : open_hour(lg, hour);
		name = lg->hour_name;
	}
	if (!o) {
		log_lost(lg, 1);
		return 0;
	}
	if (o->len + RECORD_MAX > OUT_BUF)
		out_flush(lg, o, name);
	o->len = (size_t)(format_record(o->buf + o->len, lg, c, start_ms, end_ms) - o->buf);
	o->n++;
	return 0;
}

/* every file's buffered records written, and synced (fdatasync) */
static void flush_all(struct logger *lg)
{
	struct out *o;

	for (int i = -1; i < lg->n_seg; i++) {
		o = i < 0 ? &lg->hourly : &lg->seg[i].o;
		if (o->fd < 0)
			continue;
		out_flush(lg, o, i < 0 ? lg->hour_name : lg->seg[i].part);
		if (o->unsynced && fdatasync(o->fd))
			log_failed(lg, "fdatasync", i < 0 ? lg->hour_name : lg->seg[i].part, errno);
		o->unsynced = false;
	}
}

/*
 * The ring buffer, read in place: the layout libbpf's ring_buffer maps (the consumer position on
 * a writable first page; the producer position on the next, then the data, mapped twice so that
 * a record never wraps), read here so that the consumer position moves past records only once
 * they are in their files and synced (or counted lost). libbpf moves it after each record's
 * callback, before anything is written: a killed agent lost the records of its last drain.
 */
struct ring {
	unsigned long *cons;    /* consumer position: the kernel may reuse the ring up to it */
	unsigned long *prod;    /* producer position */
	char *data;
	unsigned long size;     /* data bytes, a power of 2 */
	long page;
};

static int ring_open(struct ring *r, int fd)
{
	struct bpf_map_info info = {};
	__u32 len = sizeof(info);
	void *p;

	r->page = sysconf(_SC_PAGESIZE);
	if (bpf_obj_get_info_by_fd(fd, &info, &len))
		return -errno;
	r->size = info.max_entries;
	p = mmap(NULL, r->page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	r->cons = p;
	p = mmap(NULL, r->page + 2 * r->size, PROT_READ, MAP_SHARED, fd, r->page);
	if (p == MAP_FAILED)
		return -errno;
	r->prod = p;
	r->data = (char *)p + r->page;
	return 0;
}

static void ring_close(struct ring *r)
{
	if (r->cons)
		munmap(r->cons, r->page);
	if (r->prod)
		munmap(r->prod, r->page + 2 * r->size);
}

/* the records read so far written and synced, then released to the kernel */
static void ring_commit(struct ring *r, struct logger *lg, unsigned long cons)
{
	flush_all(lg);
	ledger_save(lg);
	__atomic_store_n(r->cons, cons, __ATOMIC_RELEASE);
}

/*
 * Every record the kernel has committed into its file: read into the files' buffers, written,
 * synced, and only then the consumer position moved past them (every RING_COMMIT bytes, so the
 * kernel gets room back under load). A kill between a write and the move repeats those records
 * in the next agent's files (the same conn_id): at least once, never lost. -> records read.
 */
#define RING_COMMIT (256 * 1024)

static long ring_drain(struct ring *r, struct logger *lg)
{
	unsigned long cons = __atomic_load_n(r->cons, __ATOMIC_ACQUIRE), done = cons;
	/* what is there now, once: under a load that never lets up, the caller's loop still
	 * closes segments, runs the watchdog and sees a stop between drains */
	unsigned long prod = __atomic_load_n(r->prod, __ATOMIC_ACQUIRE);
	__u32 len, *hdr;
	long n = 0;

	while (cons < prod) {
		hdr = (__u32 *)(r->data + (cons & (r->size - 1)));
		len = __atomic_load_n(hdr, __ATOMIC_ACQUIRE);
		if (len & BPF_RINGBUF_BUSY_BIT)
			break;   /* being written: the next drain */
		if (!(len & BPF_RINGBUF_DISCARD_BIT)) {
			log_event(lg, (char *)hdr + BPF_RINGBUF_HDR_SZ, len);
			n++;
		}
		len &= ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
		cons += (len + BPF_RINGBUF_HDR_SZ + 7) / 8 * 8;
		if (cons - done >= RING_COMMIT) {
			ring_commit(r, lg, cons);
			done = cons;
		}
	}
	if (cons != done || n)
		ring_commit(r, lg, cons);
	return n;
}

/* the link: warn once when it stops running the program for the configured cgroup */
static void watch_link(const struct config *cfg, bool *warned)
{
	struct link_state ls;

	link_state(cfg, &ls);
	if (ls.fd >= 0)
		close(ls.fd);
	if (!ls.attached && !*warned)
		fprintf(stderr, "ccs-edge: watchdog: not enforcing: the link is %s (cgroup %s, id now "
			"%llu, link's %llu); run `ccs-edge attach`\n", ls.state,
			cfg->cgroup[0] ? cfg->cgroup : "?", (unsigned long long)ls.path_id,
			(unsigned long long)ls.cgroup_id);
	*warned = !ls.attached;
}

/*
 * The live table's expiry: logged once, and its route CCs flushed (retried each pass until they
 * go): expired, the program no longer decides, and a route left would go on steering every
 * connection of the namespace outside the cgroup by the expired table.
 */
static void watchdog(const struct config *cfg, int ctl_fd, int meta_fd, __u64 *warned_version,
		     bool *routes_left)
{
	struct ccs_ctl ctl = {};
	struct ccs_meta m = {};
	__u32 zero = 0, slot;
	int err;

	if (bpf_map_lookup_elem(ctl_fd, &zero, &ctl) || ctl.live < 1 || ctl.live > CCS_SLOTS)
		return;
	slot = ctl.live - 1;
	if (bpf_map_lookup_elem(meta_fd, &slot, &m) || !m.valid)
		return;
	if (clock_ns(CLOCK_MONOTONIC) >= m.expires_mono_ns) {
		if (*warned_version != m.version + 1) {
			fprintf(stderr, "ccs-edge: watchdog: table %llu expired at %llu: not enforced, "
				"connections keep the default CC until a new table is loaded\n",
				(unsigned long long)m.version, (unsigned long long)m.expires_unix);
			*warned_version = m.version + 1;
			*routes_left = routes_enabled(cfg);
		}
		if (*routes_left) {
			/* under the pin-dir lock, and only if that table is still the live one: a
			 * load that just made a new table live keeps its routes */
			int lock_fd = lock_pin_dir(cfg->pin_dir);
			struct ccs_ctl now_ctl = {};

			if (lock_fd < 0 || bpf_map_lookup_elem(ctl_fd, &zero, &now_ctl) ||
			    now_ctl.generation != ctl.generation) {
				if (lock_fd >= 0)
					close(lock_fd);
				return;
			}
			err = routes_flush(cfg);
			close(lock_fd);
			if (err) {
				fprintf(stderr, "ccs-edge: watchdog: the route CCs of expired table %llu "
					"could not be flushed; trying again\n", (unsigned long long)m.version);
			} else {
				fprintf(stderr, "ccs-edge: watchdog: route CCs of expired table %llu "
					"flushed\n", (unsigned long long)m.version);
				*routes_left = false;
			}
		}
	} else {
		*warned_version = 0;
	}
}

/*
 * The logger's files under <out>/transport/<cfg->node_id>/: the boot id, the node's name
 * as JSON, the folder, the output buffers, the ledger from what earlier runs counted (a pin dir
 * from before it: this run's). 0, or -1 after printing why.
 */
static int logger_open(struct logger *lg, const struct config *cfg)
{
	char bootid[64] = "";
	__u32 zero = 0;
	FILE *bf;

	lg->rotate_minutes = cfg->rotate_minutes;
	bf = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (bf) {
		if (!fgets(bootid, sizeof(bootid), bf))
			bootid[0] = 0;
		fclose(bf);
	}
	snprintf(lg->boot, sizeof(lg->boot), "%.8s", bootid[0] ? bootid : "00000000");
	if (json_escape(lg->node_json, sizeof(lg->node_json), cfg->node_id)) {
		print_error("node_id too long");
		return -1;
	}
	snprintf(lg->dir, sizeof(lg->dir), "%s/transport/%s", lg->out, cfg->node_id);
	if (mkdirs(lg->dir)) {
		print_error("mkdir %s: %s", lg->dir, strerror(errno));
		return -1;
	}
	lg->dir_fd = open(lg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (lg->dir_fd < 0) {
		print_error("open %s: %s", lg->dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i <= SEG_OPEN_MAX; i++) {
		struct out *o = i < SEG_OPEN_MAX ? &lg->seg[i].o : &lg->hourly;

		o->fd = -1;
		o->buf = malloc(OUT_BUF);
		if (!o->buf) {
			print_error("log: out of memory");
			return -1;
		}
	}
	lg->ledger_fd = open_pinned(cfg->pin_dir, "ccs_log");
	if (lg->ledger_fd >= 0 && bpf_map_lookup_elem(lg->ledger_fd, &zero, &lg->st))
		memset(&lg->st, 0, sizeof(lg->st));
	return 0;
}

/*
 * Everything open closed into its file, the ledger saved, and what this run and all runs lost
 * said. A one-off drain that lost records (more than lost_before) failed its job: -> 1; the
 * daemon's losses are in the ledger. Else err as given.
 */
static int logger_close(struct logger *lg, bool drain, int err, __u64 lost_before)
{
	if (lg->hourly.fd >= 0)
		out_close(lg, &lg->hourly, lg->hour_name);
	close_segments(lg, true);
	ledger_save(lg);
	if (drain && !err)
		printf("%llu records\n", lg->written);
	if (lg->st.lost || lg->st.errors)
		fprintf(stderr, "ccs-edge: transport log: %llu records written, %llu lost, %llu failed "
			"file calls (all runs: status \"log\")%s\n", (unsigned long long)lg->st.written,
			(unsigned long long)lg->st.lost, (unsigned long long)lg->st.errors,
			lg->st.degraded ? ", degraded" : "");
	if (drain && lg->st.lost > lost_before)
		err = 1;
	for (int i = 0; i <= SEG_OPEN_MAX; i++)
		free(i < SEG_OPEN_MAX ? lg->seg[i].o.buf : lg->hourly.buf);
	if (lg->ledger_fd >= 0)
		close(lg->ledger_fd);
	if (lg->dir_fd >= 0)
		close(lg->dir_fd);
	return err;
}

int cmd_log(const struct config *cfg, const char *out, bool drain, bool watch)
{
	struct config run = *cfg;   /* the node named: the config's, else the host's, else "edge" */
	struct logger lg = { .out = out, .hour = -1, .dir_fd = -1, .ledger_fd = -1,
			     .hourly = { .fd = -1 } };
	__u64 lost_before = 0;
	struct ring ring = {};
	int ev_fd = open_pinned(cfg->pin_dir, "ccs_events"), ctl_fd = -1, meta_fd = -1, err = 1, n;
	__u64 warned = 0, last_wd = 0, last_recover;
	bool link_warned = false, routes_left = false;

	if (!out || !*out) {
		print_error("log: --out DIR (or config log_dir:) needed");
		goto cleanup;
	}
	if (!run.node_id[0] && gethostname(run.node_id, sizeof(run.node_id) - 1))
		snprintf(run.node_id, sizeof(run.node_id), "edge");
	cfg = &run;
	if (ev_fd < 0) {
		print_error("not attached: no %s/ccs_events", cfg->pin_dir);
		goto cleanup;
	}
	if (logger_open(&lg, cfg))
		goto cleanup;
	lost_before = lg.st.lost;
	recover_parts(&lg);
	last_recover = clock_ns(CLOCK_MONOTONIC);
	n = ring_open(&ring, ev_fd);
	if (n) {
		print_error("ring buffer %s/ccs_events: %s", cfg->pin_dir, strerror(-n));
		goto cleanup;
	}
	if (watch) {
		ctl_fd = open_pinned(cfg->pin_dir, "ccs_ctl");
		meta_fd = open_pinned(cfg->pin_dir, "ccs_meta");
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	do {
		lg.boot_to_real_ns = (__s64)clock_ns(CLOCK_REALTIME) - (__s64)clock_ns(CLOCK_BOOTTIME);
		/* records come without wake-ups (the kernel wakes us only when the ring is 1/4
		 * full): wait up to 200 ms, then drain whatever is there */
		if (!drain)
			poll(&(struct pollfd){ .fd = ev_fd, .events = POLLIN }, 1, 200);
		n = ring_drain(&ring, &lg);
		close_segments(&lg, false);
		/* a killed agent's .part, once its segment is over: not only at the next start */
		if (clock_ns(CLOCK_MONOTONIC) - last_recover >= 1000000000ull) {
			recover_parts(&lg);
			last_recover = clock_ns(CLOCK_MONOTONIC);
		}
		ledger_save(&lg);
		if (watch && ctl_fd >= 0 && meta_fd >= 0 && clock_ns(CLOCK_MONOTONIC) - last_wd > 1e9) {
			watchdog(cfg, ctl_fd, meta_fd, &warned, &routes_left);
			watch_link(cfg, &link_warned);
			last_wd = clock_ns(CLOCK_MONOTONIC);
		}
		if (watch)
			metrics_tick(cfg);
	} while (!stop && (!drain || n > 0));
	if (stop)   /* what closed before the signal goes into the files closed now */
		ring_drain(&ring, &lg);
	err = 0;
cleanup:
	err = logger_close(&lg, drain, err, lost_before);
	ring_close(&ring);
	if (ev_fd >= 0)
		close(ev_fd);
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	return err;
}
