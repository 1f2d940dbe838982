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
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
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

struct segment {
	FILE *f;
	long long start_min;   /* unix minute the segment starts at */
	char name[48];         /* the final name, <YYYY-MM-DDTHHMM>[.<seq>].jsonl */
};

struct logger {
	const char *out;
	char dir[PATH_MAX];
	int dir_fd;
	char boot[9];
	char node_json[6 * 128];  /* cfg.node_id, JSON-escaped (no quotes) */
	__s64 boot_to_real_ns;
	FILE *f;         /* rotate_minutes 0: the hourly file */
	long long hour;  /* unix hour of the open file */
	struct segment seg[SEG_OPEN_MAX];
	int n_seg;
	unsigned long long written;
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

/* the JSONL file of a unix hour: <dir>/<YYYY-MM-DDTHH>.jsonl (UTC), appended to */
static int open_hour(struct logger *lg, long long hour)
{
	char path[PATH_MAX + 64];
	time_t hsec = (time_t)(hour * 3600);
	struct tm tm;
	int err;

	if (lg->f)
		fclose(lg->f);
	gmtime_r(&hsec, &tm);
	snprintf(path, sizeof(path), "%s/%04d-%02d-%02dT%02d.jsonl", lg->dir, tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour);
	lg->f = fopen(path, "a");
	if (!lg->f) {
		err = -errno;
		die_msg("open %s: %s", path, strerror(-err));
		return err;
	}
	lg->hour = hour;
	return 0;
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

/* flush, fsync, close, rename .<name>.part to <name> (then fsync the folder: the rename lasts) */
static int close_segment(struct logger *lg, int i)
{
	struct segment s = lg->seg[i];
	char part[sizeof(s.name) + 8];
	int err = 0;

	lg->seg[i] = lg->seg[--lg->n_seg];
	snprintf(part, sizeof(part), ".%s.part", s.name);
	if (fflush(s.f) || fsync(fileno(s.f)))
		err = -errno;
	if (fclose(s.f) && !err)
		err = -errno;
	if (err) {
		die_msg("write %s/%s: %s (left as it is)", lg->dir, part, strerror(-err));
		return err;
	}
	if (renameat(lg->dir_fd, part, lg->dir_fd, s.name)) {
		err = -errno;
		die_msg("rename %s/%s to %s: %s", lg->dir, part, s.name, strerror(-err));
		return err;
	}
	fsync(lg->dir_fd);
	return 0;
}

/* close the segments whose end + grace has passed by wall clock (every one when `all`) */
static int close_segments(struct logger *lg, bool all)
{
	long long now_ms = (long long)(clock_ns(CLOCK_REALTIME) / 1000000);
	int i, err = 0, e;

	for (i = lg->n_seg - 1; i >= 0; i--) {
		if (all || now_ms >= (lg->seg[i].start_min + cfg.rotate_minutes) * 60000 + SEG_GRACE_MS) {
			e = close_segment(lg, i);
			if (e && !err)
				err = e;
		}
	}
	return err;
}

/*
 * The open segment starting at start_min, opened on its first record (an empty segment is never
 * created) as .<name>.part under the first name whose file and .part are both free: seq 0 the
 * first time, then .1, .2, ... for a segment closed before (a late record, an earlier run).
 */
static FILE *segment_file(struct logger *lg, long long start_min)
{
	char part[sizeof(lg->seg[0].name) + 8];
	struct segment *s;
	int i, fd = -1, seq, oldest = 0;

	for (i = 0; i < lg->n_seg; i++)
		if (lg->seg[i].start_min == start_min)
			return lg->seg[i].f;
	if (lg->n_seg == SEG_OPEN_MAX) {   /* records far apart in time: close the oldest */
		for (i = 1; i < lg->n_seg; i++)
			if (lg->seg[i].start_min < lg->seg[oldest].start_min)
				oldest = i;
		if (close_segment(lg, oldest))
			return NULL;
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
	if (seq > SEG_SEQ_MAX) {
		die_msg("%s: no free .<seq> for the segment %s", lg->dir, s->name);
		return NULL;
	}
	if (fd < 0 || !(s->f = fdopen(fd, "w"))) {
		die_msg("open %s/%s: %s", lg->dir, part, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	s->start_min = start_min;
	lg->n_seg++;
	return s->f;
}

/*
 * A .part left by an agent that was killed (SIGKILL, a crash): once its segment has ended, cut a
 * partly written last line and rename it into place, as a close would have; an empty one goes.
 */
static void recover_part(struct logger *lg, const char *part, long long now_ms)
{
	char name[NAME_MAX + 1], tail[4096];
	struct tm tm = {};
	long long start_ms, span_min = cfg.rotate_minutes ? cfg.rotate_minutes : 60;
	off_t size, keep;
	ssize_t n;
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
	/* the last newline within the last 4 KiB (a record is < 2.5 KiB) */
	keep = size > (off_t)sizeof(tail) ? size - (off_t)sizeof(tail) : 0;
	n = pread(fd, tail, (size_t)(size - keep), keep);
	while (n > 0 && tail[n - 1] != '\n')
		n--;
	keep = n > 0 ? keep + n : keep ? size : 0;   /* no newline in 4 KiB of more: leave it whole */
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

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d))) {
		n = strlen(e->d_name);
		if (e->d_name[0] == '.' && n > 12 && !strcmp(e->d_name + n - 11, ".jsonl.part"))
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

static int log_event(void *ctx, void *data, size_t size)
{
	struct logger *lg = ctx;
	const struct ccs_conn *c = data;
	char line[4096], *end;
	long long start_ms, end_ms, hour;
	FILE *f;
	int err;

	if (size < sizeof(*c))
		return 0;
	start_ms = ((__s64)c->start_boot_ns + lg->boot_to_real_ns) / 1000000;
	end_ms = ((__s64)c->end_boot_ns + lg->boot_to_real_ns) / 1000000;
	if (cfg.rotate_minutes) {
		f = segment_file(lg, end_ms / 60000 / cfg.rotate_minutes * cfg.rotate_minutes);
		if (!f)
			return -EIO;
	} else {
		hour = end_ms / 3600000;
		if ((!lg->f || hour != lg->hour) && (err = open_hour(lg, hour)))
			return err;
		f = lg->f;
	}
	end = format_record(line, lg, c, start_ms, end_ms);
	fwrite(line, 1, end - line, f);
	lg->written++;
	return 0;
}

/* the link: warn once when it stops running the program for the configured cgroup */
static void watch_link(bool *warned)
{
	struct link_state ls;

	link_state(&ls);
	if (ls.fd >= 0)
		close(ls.fd);
	if (!ls.attached && !*warned)
		fprintf(stderr, "ccs-edge: watchdog: not enforcing: the link is %s (cgroup %s, id now "
			"%llu, link's %llu); run `ccs-edge attach`\n", ls.state,
			cfg.cgroup[0] ? cfg.cgroup : "?", (unsigned long long)ls.path_id,
			(unsigned long long)ls.cgroup_id);
	*warned = !ls.attached;
}

static void watchdog(int ctl_fd, int meta_fd, __u64 *warned_version)
{
	struct ccs_ctl ctl = {};
	struct ccs_meta m = {};
	__u32 zero = 0, slot;

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
		}
	} else {
		*warned_version = 0;
	}
}

int cmd_log(const char *out, bool drain, bool watch)
{
	struct logger lg = { .out = out, .hour = -1, .dir_fd = -1 };
	struct ring_buffer *rb = NULL;
	int ev_fd = open_pinned("ccs_events"), ctl_fd = -1, meta_fd = -1, err = 1, n;
	char bootid[64] = "";
	__u64 warned = 0, last_wd = 0;
	bool link_warned = false;
	FILE *bf;

	if (!out || !*out) {
		die_msg("log: --out DIR (or config log_dir:) needed");
		goto cleanup;
	}
	if (!cfg.node_id[0] && gethostname(cfg.node_id, sizeof(cfg.node_id) - 1))
		snprintf(cfg.node_id, sizeof(cfg.node_id), "edge");
	if (ev_fd < 0) {
		die_msg("not attached: no %s/ccs_events", cfg.pin_dir);
		goto cleanup;
	}
	bf = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (bf) {
		if (!fgets(bootid, sizeof(bootid), bf))
			bootid[0] = 0;
		fclose(bf);
	}
	snprintf(lg.boot, sizeof(lg.boot), "%.8s", bootid[0] ? bootid : "00000000");
	if (json_escape(lg.node_json, sizeof(lg.node_json), cfg.node_id)) {
		die_msg("node_id too long");
		goto cleanup;
	}
	snprintf(lg.dir, sizeof(lg.dir), "%s/transport/%s", out, cfg.node_id);
	if (mkdirs(lg.dir)) {
		die_msg("mkdir %s: %s", lg.dir, strerror(errno));
		goto cleanup;
	}
	lg.dir_fd = open(lg.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (lg.dir_fd < 0) {
		die_msg("open %s: %s", lg.dir, strerror(errno));
		goto cleanup;
	}
	recover_parts(&lg);
	rb = ring_buffer__new(ev_fd, log_event, &lg, NULL);
	if (!rb) {
		die_msg("ring buffer: %s", strerror(errno));
		goto cleanup;
	}
	if (watch) {
		ctl_fd = open_pinned("ccs_ctl");
		meta_fd = open_pinned("ccs_meta");
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	do {
		lg.boot_to_real_ns = (__s64)clock_ns(CLOCK_REALTIME) - (__s64)clock_ns(CLOCK_BOOTTIME);
		/* records come without wake-ups (the kernel wakes us only when the ring is 1/4
		 * full): wait up to 200 ms, then drain whatever is there */
		n = drain ? 0 : ring_buffer__poll(rb, 200);
		if (n >= 0 || n == -EINTR)
			n = ring_buffer__consume(rb);
		if (n < 0 && n != -EINTR) {
			die_msg("ring buffer: %s", strerror(-n));
			goto cleanup;
		}
		if (lg.f)
			fflush(lg.f);
		for (int i = 0; i < lg.n_seg; i++)
			fflush(lg.seg[i].f);
		if (close_segments(&lg, false))
			goto cleanup;
		if (watch && ctl_fd >= 0 && meta_fd >= 0 && clock_ns(CLOCK_MONOTONIC) - last_wd > 1e9) {
			watchdog(ctl_fd, meta_fd, &warned);
			watch_link(&link_warned);
			last_wd = clock_ns(CLOCK_MONOTONIC);
		}
	} while (!stop && (!drain || n > 0));
	if (stop)   /* what closed before the signal goes into the files closed now */
		ring_buffer__consume(rb);
	if (drain)
		printf("%llu records\n", lg.written);
	err = 0;
cleanup:
	if (lg.f)
		fclose(lg.f);
	if (close_segments(&lg, true))
		err = 1;
	if (lg.dir_fd >= 0)
		close(lg.dir_fd);
	ring_buffer__free(rb);
	if (ev_fd >= 0)
		close(ev_fd);
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	return err;
}
