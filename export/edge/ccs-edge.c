// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ccs-edge - the ccselect edge agent: attaches the sock_ops enforcer (ccs.bpf.c) to a cgroup,
 * verifies and loads signed prefix tables, reports status and counters, and drains the
 * transport log from the ring buffer into hourly JSONL files.
 *
 *   ccs-edge [--config FILE] [--pin-dir DIR] [--pubkey PEM] [--node-id ID] COMMAND ...
 *     attach --cgroup PATH [--sample-rate R]   load + attach (or replace the program in place)
 *     detach [--purge]                          detach; --purge also unpins every map
 *     policy                                    re-apply the services of the config
 *     load MANIFEST [--json]                    verify, build a new trie, swap it in
 *     rollback                                  make the previous table live again
 *     status [--json]
 *     log --out DIR [--drain]                   write <DIR>/transport/<node>/<hour>.jsonl
 *     run --out DIR                             log + TTL watchdog until SIGTERM
 *
 * Everything lives in pinned objects under the pin dir (default /sys/fs/bpf/ccs): the cgroup
 * link and every map, so enforcement survives the agent exiting, crashing or restarting.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "ccs.h"
#include "ccs.skel.h"

#define MAX_SERVICES 256

struct service {
	unsigned port;
	char name[64];
	bool ab;
	bool caps;
};

struct config {
	char node_id[128];
	char cgroup[PATH_MAX];
	char pin_dir[PATH_MAX];
	char public_key[PATH_MAX];
	char default_cc[16];
	char log_dir[PATH_MAX];
	double sample_rate;
	int n_services;
	struct service services[MAX_SERVICES];
};

static struct config cfg = {
	.pin_dir = "/sys/fs/bpf/ccs",
	.default_cc = "",
	.sample_rate = 0.01,
};

static volatile sig_atomic_t stop;

/* enum ccs_cc_id of net.ipv4.tcp_congestion_control: 0 unknown, 0xff none of ours */
static __u8 sysctl_cc_id(void)
{
	char name[32] = "";
	FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");

	if (!f)
		return 0;
	if (!fgets(name, sizeof(name), f))
		name[0] = 0;
	fclose(f);
	name[strcspn(name, "\n")] = 0;
	if (!name[0])
		return 0;
	if (!strcmp(name, "cubic"))
		return CCS_CC_CUBIC;
	if (!strcmp(name, "bbr"))
		return CCS_CC_BBR;
	if (!strcmp(name, "reno"))
		return CCS_CC_RENO;
	return 0xff;
}

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void die_msg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "ccs-edge: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* ---------------------------------------------------------------- config (a YAML subset) */

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	if (e - s >= 2 && ((s[0] == '"' && e[-1] == '"') || (s[0] == '\'' && e[-1] == '\''))) {
		e[-1] = 0;
		s++;
	}
	return s;
}

static bool parse_bool(const char *v)
{
	return !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1");
}

static int set_service_kv(struct service *svc, char *k, char *v)
{
	k = trim(k);
	v = trim(v);
	if (!strcmp(k, "port")) {
		long p = strtol(v, NULL, 10);

		if (p < 1 || p > 65535)
			return -1;
		svc->port = (unsigned)p;
	} else if (!strcmp(k, "name")) {
		snprintf(svc->name, sizeof(svc->name), "%s", v);
	} else if (!strcmp(k, "ab")) {
		svc->ab = parse_bool(v);
	} else if (!strcmp(k, "caps")) {
		svc->caps = parse_bool(v);
	}
	return 0;
}

/*
 * Reads the flat YAML subset of infra/edge/edge.yaml: top-level `key: value` lines, and a
 * `services:` list whose items are one flow mapping per line: `- {port: 443, ab: true, ...}`.
 */
static int load_config(const char *path)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	int lineno = 0, err = 0;

	if (!f) {
		die_msg("config %s: %s", path, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *s = line, *hash, *colon, *k, *v;

		lineno++;
		hash = strchr(s, '#');
		if (hash)
			*hash = 0;
		s = trim(s);
		if (!*s)
			continue;
		if (s[0] == '-') {
			struct service *svc;
			char *body = trim(s + 1), *tok, *save = NULL;
			size_t n;

			if (cfg.n_services >= MAX_SERVICES) {
				err = -1;
				break;
			}
			n = strlen(body);
			if (body[0] != '{' || body[n - 1] != '}') {
				die_msg("%s:%d: a service must be a one-line {port: N, ...} mapping", path, lineno);
				err = -1;
				break;
			}
			body[n - 1] = 0;
			svc = &cfg.services[cfg.n_services];
			memset(svc, 0, sizeof(*svc));
			for (tok = strtok_r(body + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
				colon = strchr(tok, ':');
				if (!colon || (*colon = 0, set_service_kv(svc, tok, colon + 1))) {
					die_msg("%s:%d: bad service item", path, lineno);
					err = -1;
					break;
				}
			}
			if (err)
				break;
			if (!svc->port) {
				die_msg("%s:%d: service without port", path, lineno);
				err = -1;
				break;
			}
			cfg.n_services++;
			continue;
		}
		colon = strchr(s, ':');
		if (!colon) {
			die_msg("%s:%d: expected key: value", path, lineno);
			err = -1;
			break;
		}
		*colon = 0;
		k = trim(s);
		v = trim(colon + 1);
		if (!strcmp(k, "node_id"))
			snprintf(cfg.node_id, sizeof(cfg.node_id), "%s", v);
		else if (!strcmp(k, "cgroup"))
			snprintf(cfg.cgroup, sizeof(cfg.cgroup), "%s", v);
		else if (!strcmp(k, "pin_dir"))
			snprintf(cfg.pin_dir, sizeof(cfg.pin_dir), "%s", v);
		else if (!strcmp(k, "public_key"))
			snprintf(cfg.public_key, sizeof(cfg.public_key), "%s", v);
		else if (!strcmp(k, "default_cc"))
			snprintf(cfg.default_cc, sizeof(cfg.default_cc), "%s", v);
		else if (!strcmp(k, "log_dir"))
			snprintf(cfg.log_dir, sizeof(cfg.log_dir), "%s", v);
		else if (!strcmp(k, "sample_rate"))
			cfg.sample_rate = strtod(v, NULL);
		/* "services:" and unknown keys are ignored */
	}
	fclose(f);
	return err;
}

/* ---------------------------------------------------------------- pinned objects */

static int pin_path(char *buf, size_t n, const char *name)
{
	int r = snprintf(buf, n, "%s/%s", cfg.pin_dir, name);

	return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static int open_pinned(const char *name)
{
	char p[PATH_MAX];
	int fd;

	if (pin_path(p, sizeof(p), name))
		return -ENAMETOOLONG;
	fd = bpf_obj_get(p);
	if (fd < 0)
		return -errno;
	return fd;
}

static int ensure_bpffs(void)
{
	struct statfs st;

	if (statfs("/sys/fs/bpf", &st) == 0 && st.f_type == BPF_FS_MAGIC)
		return 0;
	if (mount("bpf", "/sys/fs/bpf", "bpf", 0, NULL)) {
		die_msg("mount bpffs on /sys/fs/bpf: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* serialises load / rollback / attach between agent processes */
static int lock_pin_dir(void)
{
	int fd = open(cfg.pin_dir, O_RDONLY | O_DIRECTORY);

	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX)) {
		close(fd);
		return -errno;
	}
	return fd;
}

static int apply_policy(int policy_fd)
{
	struct ccs_policy zero = {}, pol;
	__u32 port;
	int i;

	for (port = 0; port < 65536; port++) {
		if (bpf_map_update_elem(policy_fd, &port, &zero, BPF_ANY))
			return -errno;
	}
	for (i = 0; i < cfg.n_services; i++) {
		port = cfg.services[i].port;
		pol = (struct ccs_policy){ .served = 1, .ab = cfg.services[i].ab,
					   .caps = cfg.services[i].caps, .service_id = i + 1 };
		if (bpf_map_update_elem(policy_fd, &port, &pol, BPF_ANY))
			return -errno;
	}
	return 0;
}

static int libbpf_print_fn(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG && !getenv("CCS_EDGE_DEBUG"))
		return 0;
	return vfprintf(stderr, fmt, args);
}

static int cmd_attach(void)
{
	LIBBPF_OPTS(bpf_object_open_opts, oopts);
	struct ccs_bpf *skel = NULL;
	struct bpf_link *link = NULL;
	char lp[PATH_MAX];
	int cg_fd = -1, link_fd = -1, lock_fd = -1, err = 0;
	__u64 thresh;

	if (!cfg.cgroup[0]) {
		die_msg("attach: no cgroup (--cgroup or config cgroup:)");
		return 1;
	}
	if (ensure_bpffs())
		return 1;
	if (mkdir(cfg.pin_dir, 0700) && errno != EEXIST) {
		die_msg("mkdir %s: %s", cfg.pin_dir, strerror(errno));
		return 1;
	}
	lock_fd = lock_pin_dir();
	if (lock_fd < 0) {
		err = lock_fd;
		goto cleanup;
	}
	oopts.pin_root_path = cfg.pin_dir;
	skel = ccs_bpf__open_opts(&oopts);
	if (!skel) {
		err = -errno;
		die_msg("open BPF object: %s", strerror(-err));
		goto cleanup;
	}
	if (cfg.sample_rate <= 0)
		thresh = 0;
	else if (cfg.sample_rate >= 1)
		thresh = 1ull << 32;
	else
		thresh = (__u64)(cfg.sample_rate * 4294967296.0);
	skel->rodata->sample_thresh = thresh;
	skel->rodata->default_cc_id = sysctl_cc_id();
	err = ccs_bpf__load(skel);
	if (err) {
		die_msg("load BPF object: %s", strerror(-err));
		goto cleanup;
	}
	err = apply_policy(bpf_map__fd(skel->maps.ccs_policy));
	if (err) {
		die_msg("policy: %s", strerror(-err));
		goto cleanup;
	}
	pin_path(lp, sizeof(lp), "link");
	link_fd = bpf_obj_get(lp);
	if (link_fd >= 0) {
		/* already attached: replace the program in place, no gap in enforcement */
		err = bpf_link_update(link_fd, bpf_program__fd(skel->progs.ccs_sockops), NULL);
		if (err) {
			err = -errno;
			die_msg("replace program in %s: %s", lp, strerror(-err));
			goto cleanup;
		}
		printf("replaced program on existing link %s\n", lp);
		goto cleanup;
	}
	if (mkdir(cfg.cgroup, 0755) && errno != EEXIST) {
		err = -errno;
		die_msg("create cgroup %s: %s", cfg.cgroup, strerror(-err));
		goto cleanup;
	}
	cg_fd = open(cfg.cgroup, O_RDONLY | O_DIRECTORY);
	if (cg_fd < 0) {
		err = -errno;
		die_msg("open cgroup %s: %s", cfg.cgroup, strerror(-err));
		goto cleanup;
	}
	link = bpf_program__attach_cgroup(skel->progs.ccs_sockops, cg_fd);
	if (!link) {
		err = -errno;
		die_msg("attach to %s: %s", cfg.cgroup, strerror(-err));
		goto cleanup;
	}
	err = bpf_link__pin(link, lp);
	if (err) {
		die_msg("pin link %s: %s", lp, strerror(-err));
		goto cleanup;
	}
	printf("attached to %s, pinned under %s (sample rate %g)\n", cfg.cgroup, cfg.pin_dir,
	       cfg.sample_rate);
cleanup:
	if (link) {
		if (!err)
			bpf_link__disconnect(link); /* the pinned link keeps it attached */
		bpf_link__destroy(link);
	}
	if (link_fd >= 0)
		close(link_fd);
	if (cg_fd >= 0)
		close(cg_fd);
	ccs_bpf__destroy(skel);
	if (lock_fd >= 0)
		close(lock_fd);
	return err ? 1 : 0;
}

static int cmd_detach(bool purge)
{
	char p[PATH_MAX];
	int fd, err = 0;
	DIR *d;
	struct dirent *de;

	fd = open_pinned("link");
	if (fd >= 0) {
		if (bpf_link_detach(fd) && errno != EINVAL)
			fprintf(stderr, "ccs-edge: link detach: %s\n", strerror(errno));
		close(fd);
		pin_path(p, sizeof(p), "link");
		unlink(p);
	}
	if (!purge)
		return 0;
	d = opendir(cfg.pin_dir);
	if (!d)
		return errno == ENOENT ? 0 : 1;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		pin_path(p, sizeof(p), de->d_name);
		if (unlink(p)) {
			fprintf(stderr, "ccs-edge: unlink %s: %s\n", p, strerror(errno));
			err = 1;
		}
	}
	closedir(d);
	if (rmdir(cfg.pin_dir) && errno != ENOENT)
		err = 1;
	return err;
}

static int cmd_policy(void)
{
	int fd = open_pinned("ccs_policy"), err;

	if (fd < 0) {
		die_msg("not attached (no %s/ccs_policy)", cfg.pin_dir);
		return 1;
	}
	err = apply_policy(fd);
	close(fd);
	if (err)
		die_msg("policy: %s", strerror(-err));
	return err ? 1 : 0;
}

/* ---------------------------------------------------------------- table verification */

static int read_file(const char *path, unsigned char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;

	*buf = NULL;
	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -EIO;
	}
	*buf = malloc(n + 1);
	if (!*buf) {
		fclose(f);
		return -ENOMEM;
	}
	if (n && fread(*buf, 1, n, f) != (size_t)n) {
		free(*buf);
		*buf = NULL;
		fclose(f);
		return -EIO;
	}
	(*buf)[n] = 0;
	*len = n;
	fclose(f);
	return 0;
}

/* the manifest is signed: these look-ups run only on verified bytes */
static const char *json_find(const char *js, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(js, pat);
	if (!p)
		return NULL;
	p += strlen(pat);
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p != ':')
		return NULL;
	p++;
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

static int json_u64(const char *js, const char *key, __u64 *out)
{
	const char *p = json_find(js, key);
	char *end;

	if (!p || *p < '0' || *p > '9')
		return -1;
	errno = 0;
	*out = strtoull(p, &end, 10);
	return errno ? -1 : 0;
}

static int json_str(const char *js, const char *key, char *out, size_t n)
{
	const char *p = json_find(js, key), *e;

	if (!p || *p != '"')
		return -1;
	p++;
	e = strchr(p, '"');
	if (!e || (size_t)(e - p) >= n)
		return -1;
	memcpy(out, p, e - p);
	out[e - p] = 0;
	return 0;
}

static int verify_signature(const unsigned char *msg, size_t len, const unsigned char *sig,
			    size_t sig_len)
{
	EVP_PKEY *pkey = NULL;
	EVP_MD_CTX *ctx = NULL;
	FILE *f;
	int ok = 0;

	if (!cfg.public_key[0]) {
		die_msg("no public key (--pubkey or config public_key:)");
		return -1;
	}
	f = fopen(cfg.public_key, "r");
	if (!f) {
		die_msg("public key %s: %s", cfg.public_key, strerror(errno));
		return -1;
	}
	pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL);
	fclose(f);
	if (!pkey || EVP_PKEY_id(pkey) != EVP_PKEY_ED25519) {
		die_msg("public key %s: not an Ed25519 PEM public key", cfg.public_key);
		goto cleanup;
	}
	if (sig_len != 64) {
		die_msg("signature must be 64 bytes, got %zu", sig_len);
		goto cleanup;
	}
	ctx = EVP_MD_CTX_new();
	if (!ctx || EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pkey) != 1)
		goto cleanup;
	ok = EVP_DigestVerify(ctx, sig, sig_len, msg, len) == 1;
cleanup:
	EVP_MD_CTX_free(ctx);
	EVP_PKEY_free(pkey);
	return ok ? 0 : -1;
}

static void hex(const unsigned char *b, size_t n, char *out)
{
	size_t i;

	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static int validate_entry(const struct ccs_table_entry *e, __u8 want_family, size_t i)
{
	int bytes = want_family == 4 ? 4 : 16, b;

	if (e->family != want_family) {
		die_msg("entry %zu: family %u where %u expected", i, e->family, want_family);
		return -1;
	}
	if (e->prefix_len > bytes * 8) {
		die_msg("entry %zu: prefix length %u too long", i, e->prefix_len);
		return -1;
	}
	if (e->cc > CCS_CC_MAX) {
		die_msg("entry %zu: unknown cc id %u", i, e->cc);
		return -1;
	}
	for (b = 0; b < 16; b++) {
		int bit0 = b * 8;
		__u8 mask;

		if (b >= bytes) {
			mask = 0xff;
		} else if (bit0 >= e->prefix_len) {
			mask = 0xff;
		} else if (bit0 + 8 <= e->prefix_len) {
			mask = 0;
		} else {
			mask = 0xff >> (e->prefix_len - bit0);
		}
		if (e->addr[b] & mask) {
			die_msg("entry %zu: address bits set beyond the prefix", i);
			return -1;
		}
	}
	return 0;
}

static int cmd_load(const char *manifest_path, bool json)
{
	unsigned char *man = NULL, *sig = NULL, *tab = NULL, digest[32];
	char sig_path[PATH_MAX], tab_path[PATH_MAX], tname[256], sha_hex[65], want_hex[80], *dir;
	size_t man_len, sig_len, tab_len, i, n;
	unsigned int dlen = 0;
	const struct ccs_table_header *h;
	const struct ccs_table_entry *ents;
	__u64 version, expires, created, n4, n6, fmt, t0, t1, t2, t3;
	struct ccs_ctl ctl = {};
	struct ccs_meta meta = {};
	int ctl_fd = -1, meta_fd = -1, tables_fd = -1, trie_fd = -1, lock_fd = -1, err = -1;
	__u32 zero = 0, slot;
	time_t now = time(NULL);
	LIBBPF_OPTS(bpf_map_create_opts, mopts, .map_flags = BPF_F_NO_PREALLOC);

	t0 = clock_ns(CLOCK_MONOTONIC);
	/* 1. signature over the exact manifest bytes */
	if (read_file(manifest_path, &man, &man_len)) {
		die_msg("read %s: %s", manifest_path, strerror(errno));
		goto cleanup;
	}
	snprintf(sig_path, sizeof(sig_path), "%s.sig", manifest_path);
	if (read_file(sig_path, &sig, &sig_len)) {
		die_msg("refused: no signature %s", sig_path);
		goto cleanup;
	}
	if (verify_signature(man, man_len, sig, sig_len)) {
		die_msg("refused: bad signature on %s", manifest_path);
		goto cleanup;
	}
	/* 2. manifest fields, then the sha256 of the binary table */
	if (json_u64((char *)man, "format", &fmt) || json_u64((char *)man, "version", &version) ||
	    json_u64((char *)man, "expires", &expires) || json_u64((char *)man, "created", &created) ||
	    json_u64((char *)man, "v4", &n4) || json_u64((char *)man, "v6", &n6) ||
	    json_str((char *)man, "table", tname, sizeof(tname)) ||
	    json_str((char *)man, "sha256", want_hex, sizeof(want_hex))) {
		die_msg("refused: manifest misses a field");
		goto cleanup;
	}
	if (fmt != CCS_TABLE_FORMAT || strchr(tname, '/') || !strcmp(tname, "..")) {
		die_msg("refused: unsupported format %llu or bad table name", (unsigned long long)fmt);
		goto cleanup;
	}
	dir = strdup(manifest_path);
	if (!dir)
		goto cleanup;
	{
		char *slash = strrchr(dir, '/');

		if (slash)
			slash[1] = 0;
		else
			dir[0] = 0;
		snprintf(tab_path, sizeof(tab_path), "%s%s", dir, tname);
	}
	free(dir);
	if (read_file(tab_path, &tab, &tab_len)) {
		die_msg("refused: read %s: %s", tab_path, strerror(errno));
		goto cleanup;
	}
	if (EVP_Digest(tab, tab_len, digest, &dlen, EVP_sha256(), NULL) != 1 || dlen != 32)
		goto cleanup;
	hex(digest, 32, sha_hex);
	if (strcmp(sha_hex, want_hex)) {
		die_msg("refused: sha256 of %s is %s, manifest says %s", tab_path, sha_hex, want_hex);
		goto cleanup;
	}
	/* 3. header against the manifest, expiry, every entry */
	if (tab_len < sizeof(*h)) {
		die_msg("refused: short table");
		goto cleanup;
	}
	h = (const struct ccs_table_header *)tab;
	n = (size_t)h->n_v4 + h->n_v6;
	if (h->magic != CCS_TABLE_MAGIC || h->format != CCS_TABLE_FORMAT ||
	    h->header_size != sizeof(*h) || h->entry_size != sizeof(*ents) ||
	    tab_len != sizeof(*h) + n * sizeof(*ents) || n > CCS_MAX_ENTRIES) {
		die_msg("refused: bad table header or size");
		goto cleanup;
	}
	if (h->version != version || h->expires_unix != expires || h->created_unix != created ||
	    h->n_v4 != n4 || h->n_v6 != n6) {
		die_msg("refused: table header disagrees with the manifest");
		goto cleanup;
	}
	if ((__s64)expires <= (__s64)now) {
		die_msg("refused: table %llu expired at %llu (now %lld)", (unsigned long long)version,
			(unsigned long long)expires, (long long)now);
		goto cleanup;
	}
	ents = (const struct ccs_table_entry *)(tab + sizeof(*h));
	for (i = 0; i < n; i++)
		if (validate_entry(&ents[i], i < h->n_v4 ? 4 : 6, i))
			goto cleanup;
	t1 = clock_ns(CLOCK_MONOTONIC);

	/* 4. build the new trie (nothing is live yet) */
	ctl_fd = open_pinned("ccs_ctl");
	meta_fd = open_pinned("ccs_meta");
	tables_fd = open_pinned("ccs_tables");
	if (ctl_fd < 0 || meta_fd < 0 || tables_fd < 0) {
		die_msg("not attached: no pinned maps under %s", cfg.pin_dir);
		goto cleanup;
	}
	lock_fd = lock_pin_dir();
	trie_fd = bpf_map_create(BPF_MAP_TYPE_LPM_TRIE, "ccs_trie", sizeof(struct ccs_lpm_key),
				 sizeof(struct ccs_lpm_val), n ? n : 1, &mopts);
	if (trie_fd < 0) {
		die_msg("create trie: %s", strerror(errno));
		goto cleanup;
	}
	for (i = 0; i < n; i++) {
		const struct ccs_table_entry *e = &ents[i];
		struct ccs_lpm_key k = {};
		struct ccs_lpm_val v = { .cc = e->cc, .flags = e->flags,
					 .purity_permille = e->purity_permille,
					 .cwnd_clamp_segs = e->cwnd_clamp_segs,
					 .pacing_rate_bps = e->pacing_rate_bps };

		if (e->family == 4) {
			k.prefixlen = 96 + e->prefix_len;
			k.addr[10] = 0xff;
			k.addr[11] = 0xff;
			memcpy(&k.addr[12], e->addr, 4);
		} else {
			k.prefixlen = e->prefix_len;
			memcpy(k.addr, e->addr, 16);
		}
		if (bpf_map_update_elem(trie_fd, &k, &v, BPF_NOEXIST)) {
			die_msg("refused: entry %zu: %s", i, errno == EEXIST ? "duplicate prefix" :
				strerror(errno));
			goto cleanup;
		}
	}
	t2 = clock_ns(CLOCK_MONOTONIC);

	/* 5. swap: fill the idle slot, then flip ctl.live (one word); the old table stays */
	if (bpf_map_lookup_elem(ctl_fd, &zero, &ctl))
		goto cleanup;
	slot = (ctl.live >= 1 && ctl.live <= CCS_SLOTS) ? (ctl.live % CCS_SLOTS) : 0;
	if (bpf_map_update_elem(tables_fd, &slot, &trie_fd, BPF_ANY)) {
		die_msg("install trie: %s", strerror(errno));
		goto cleanup;
	}
	meta.version = version;
	meta.created_unix = created;
	meta.expires_unix = expires;
	meta.expires_mono_ns = clock_ns(CLOCK_MONOTONIC) +
			       ((__s64)expires - (__s64)now) * 1000000000ull;
	meta.loaded_unix = now;
	meta.n_v4 = h->n_v4;
	meta.n_v6 = h->n_v6;
	meta.valid = 1;
	memcpy(meta.sha256, digest, 32);
	if (bpf_map_update_elem(meta_fd, &slot, &meta, BPF_ANY))
		goto cleanup;
	ctl.live = slot + 1;
	ctl.generation++;
	if (bpf_map_update_elem(ctl_fd, &zero, &ctl, BPF_ANY)) {
		die_msg("swap: %s", strerror(errno));
		goto cleanup;
	}
	t3 = clock_ns(CLOCK_MONOTONIC);
	err = 0;
	if (json)
		printf("{\"loaded\": true, \"version\": %llu, \"slot\": %u, \"entries\": {\"v4\": %u, "
		       "\"v6\": %u}, \"verify_ms\": %.3f, \"build_ms\": %.3f, \"swap_us\": %.3f, "
		       "\"total_ms\": %.3f}\n", (unsigned long long)version, slot, h->n_v4, h->n_v6,
		       (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e3, (t3 - t0) / 1e6);
	else
		printf("loaded table %llu (%u v4 + %u v6 entries) into slot %u\n",
		       (unsigned long long)version, h->n_v4, h->n_v6, slot);
cleanup:
	if (trie_fd >= 0)
		close(trie_fd);
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	if (tables_fd >= 0)
		close(tables_fd);
	if (lock_fd >= 0)
		close(lock_fd);
	free(man);
	free(sig);
	free(tab);
	return err ? 1 : 0;
}

static int cmd_rollback(void)
{
	int ctl_fd = open_pinned("ccs_ctl"), meta_fd = open_pinned("ccs_meta"), lock_fd = -1, err = 1;
	struct ccs_ctl ctl;
	struct ccs_meta meta;
	__u32 zero = 0, prev;

	if (ctl_fd < 0 || meta_fd < 0) {
		die_msg("not attached: no pinned maps under %s", cfg.pin_dir);
		goto cleanup;
	}
	lock_fd = lock_pin_dir();
	if (bpf_map_lookup_elem(ctl_fd, &zero, &ctl) || ctl.live < 1 || ctl.live > CCS_SLOTS) {
		die_msg("rollback: no live table");
		goto cleanup;
	}
	prev = ctl.live % CCS_SLOTS;
	if (bpf_map_lookup_elem(meta_fd, &prev, &meta) || !meta.valid) {
		die_msg("rollback: no previous table");
		goto cleanup;
	}
	if (meta.expires_mono_ns <= clock_ns(CLOCK_MONOTONIC)) {
		die_msg("rollback: previous table %llu has expired", (unsigned long long)meta.version);
		goto cleanup;
	}
	ctl.live = prev + 1;
	ctl.generation++;
	if (bpf_map_update_elem(ctl_fd, &zero, &ctl, BPF_ANY))
		goto cleanup;
	printf("rolled back to table %llu (slot %u)\n", (unsigned long long)meta.version, prev);
	err = 0;
cleanup:
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	if (lock_fd >= 0)
		close(lock_fd);
	return err;
}

/* ---------------------------------------------------------------- status */

static void print_meta(FILE *o, const struct ccs_meta *m, __u32 slot, bool live)
{
	__u64 now_mono = clock_ns(CLOCK_MONOTONIC);
	time_t now = time(NULL);
	char sha[65];
	bool expired = now_mono >= m->expires_mono_ns;

	hex(m->sha256, 32, sha);
	fprintf(o, "{\"version\": %llu, \"slot\": %u, \"created\": %llu, \"expires\": %llu, "
		"\"loaded\": %llu, \"age_s\": %lld, \"expires_in_s\": %.3f, \"expired\": %s, "
		"\"enforced\": %s, \"entries\": {\"v4\": %u, \"v6\": %u}, \"sha256\": \"%s\"}",
		(unsigned long long)m->version, slot, (unsigned long long)m->created_unix,
		(unsigned long long)m->expires_unix, (unsigned long long)m->loaded_unix,
		(long long)now - (long long)m->created_unix,
		((double)(__s64)(m->expires_mono_ns - now_mono)) / 1e9, expired ? "true" : "false",
		live && !expired ? "true" : "false", m->n_v4, m->n_v6, sha);
}

static int cmd_status(bool json)
{
	int ctl_fd = open_pinned("ccs_ctl"), meta_fd = open_pinned("ccs_meta");
	int cnt_fd = open_pinned("ccs_counters"), link_fd = open_pinned("link"), prog_fd = -1;
	int ncpu = libbpf_num_possible_cpus(), i, c, err = 1;
	struct bpf_link_info linfo = {};
	struct bpf_prog_info pinfo = {};
	__u32 ilen, zero = 0, slot;
	struct ccs_ctl ctl = {};
	struct ccs_meta meta[CCS_SLOTS] = {};
	__u64 *vals = NULL, total;
	FILE *o = stdout;

	if (ctl_fd < 0 || meta_fd < 0 || cnt_fd < 0) {
		if (json)
			printf("{\"attached\": false, \"pin_dir\": \"%s\", \"table\": null}\n", cfg.pin_dir);
		else
			printf("not attached (no maps under %s)\n", cfg.pin_dir);
		err = json ? 0 : 1;
		goto cleanup;
	}
	bpf_map_lookup_elem(ctl_fd, &zero, &ctl);
	for (slot = 0; slot < CCS_SLOTS; slot++)
		bpf_map_lookup_elem(meta_fd, &slot, &meta[slot]);
	if (link_fd >= 0) {
		ilen = sizeof(linfo);
		if (!bpf_obj_get_info_by_fd(link_fd, &linfo, &ilen)) {
			prog_fd = bpf_prog_get_fd_by_id(linfo.prog_id);
			ilen = sizeof(pinfo);
			if (prog_fd >= 0)
				bpf_obj_get_info_by_fd(prog_fd, &pinfo, &ilen);
		}
	}
	vals = calloc(ncpu, sizeof(__u64));
	if (!vals)
		goto cleanup;
	if (!json) {
		printf("attached: %s  pin dir %s  generation %u\n", link_fd >= 0 ? "yes" : "no",
		       cfg.pin_dir, ctl.generation);
		o = stdout;
	}
	fprintf(o, "{\"attached\": %s, \"pin_dir\": \"%s\", \"node_id\": \"%s\", "
		"\"default_cc\": \"%s\", \"generation\": %u, \"prog_id\": %u, \"cgroup_id\": %llu, "
		"\"run_cnt\": %llu, \"run_time_ns\": %llu, \"table\": ",
		link_fd >= 0 ? "true" : "false", cfg.pin_dir, cfg.node_id, cfg.default_cc,
		ctl.generation, linfo.prog_id, (unsigned long long)linfo.cgroup.cgroup_id,
		(unsigned long long)pinfo.run_cnt, (unsigned long long)pinfo.run_time_ns);
	if (ctl.live >= 1 && ctl.live <= CCS_SLOTS && meta[ctl.live - 1].valid)
		print_meta(o, &meta[ctl.live - 1], ctl.live - 1, true);
	else
		fprintf(o, "null");
	fprintf(o, ", \"previous\": ");
	slot = (ctl.live >= 1 && ctl.live <= CCS_SLOTS) ? ctl.live % CCS_SLOTS : 0;
	if (ctl.live >= 1 && ctl.live <= CCS_SLOTS && meta[slot].valid)
		print_meta(o, &meta[slot], slot, false);
	else
		fprintf(o, "null");
	fprintf(o, ", \"counters\": {");
	for (i = 0; i < CCS_CNT__MAX; i++) {
		__u32 k = i;

		total = 0;
		if (!bpf_map_lookup_elem(cnt_fd, &k, vals))
			for (c = 0; c < ncpu; c++)
				total += vals[c];
		fprintf(o, "%s\"%s\": %llu", i ? ", " : "", ccs_counter_names[i],
			(unsigned long long)total);
	}
	fprintf(o, "}}\n");
	err = 0;
cleanup:
	free(vals);
	if (prog_fd >= 0)
		close(prog_fd);
	if (link_fd >= 0)
		close(link_fd);
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	if (cnt_fd >= 0)
		close(cnt_fd);
	return err;
}

/* ---------------------------------------------------------------- transport log */

struct logger {
	const char *out;
	char dir[PATH_MAX];
	char boot[9];
	__s64 boot_to_real_ns;
	FILE *f;
	long long hour;  /* unix hour of the open file */
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

static int log_event(void *ctx, void *data, size_t size)
{
	struct logger *lg = ctx;
	const struct ccs_conn *c = data;
	/* a record: ~750 bytes of keys and numbers + 2 node ids (< 128 each) + ip + cc + boot */
	char ip[INET6_ADDRSTRLEN] = "", path[PATH_MAX + 64], cc[17], line[2048], *p;
	long long start_ms, end_ms, hour;
	struct tm tm;
	time_t hsec;

	if (size < sizeof(*c))
		return 0;
	start_ms = ((__s64)c->start_boot_ns + lg->boot_to_real_ns) / 1000000;
	end_ms = ((__s64)c->end_boot_ns + lg->boot_to_real_ns) / 1000000;
	hour = end_ms / 3600000;
	if (!lg->f || hour != lg->hour) {
		if (lg->f)
			fclose(lg->f);
		hsec = (time_t)(hour * 3600);
		gmtime_r(&hsec, &tm);
		snprintf(path, sizeof(path), "%s/%04d-%02d-%02dT%02d.jsonl", lg->dir,
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour);
		lg->f = fopen(path, "a");
		if (!lg->f) {
			die_msg("open %s: %s", path, strerror(errno));
			return -errno;
		}
		lg->hour = hour;
	}
	inet_ntop(c->family == 4 ? AF_INET : AF_INET6, c->addr, ip, sizeof(ip));
	memcpy(cc, c->cc, 16);
	cc[16] = 0;
	/* hand-rolled formatting (one fwrite per record): fprintf with 25 conversions was ~2 us a
	 * record, on the same 2 cores as the connections being logged */
	p = line;
	p = put_s(p, "{\"conn_id\": \"");
	p = put_s(p, cfg.node_id);
	*p++ = '-';
	p = put_s(p, lg->boot);
	p = put_hex16(p, c->cookie);
	p = put_s(p, "\", \"node_id\": \"");
	p = put_s(p, cfg.node_id);
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
	p = put_s(p, c->decision <= CCS_DEC_STALE ? ccs_decision_names[c->decision] : "default");
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
	p = put_s(p, "}\n");
	fwrite(line, 1, p - line, lg->f);
	lg->written++;
	return 0;
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

static int cmd_log(const char *out, bool drain, bool watch)
{
	struct logger lg = { .out = out, .hour = -1 };
	struct ring_buffer *rb = NULL;
	int ev_fd = open_pinned("ccs_events"), ctl_fd = -1, meta_fd = -1, err = 1, n;
	char bootid[64] = "";
	__u64 warned = 0, last_wd = 0;
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
	snprintf(lg.dir, sizeof(lg.dir), "%s/transport/%s", out, cfg.node_id);
	if (mkdirs(lg.dir)) {
		die_msg("mkdir %s: %s", lg.dir, strerror(errno));
		goto cleanup;
	}
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
		if (watch && ctl_fd >= 0 && meta_fd >= 0 && clock_ns(CLOCK_MONOTONIC) - last_wd > 1e9) {
			watchdog(ctl_fd, meta_fd, &warned);
			last_wd = clock_ns(CLOCK_MONOTONIC);
		}
	} while (!stop && (!drain || n > 0));
	if (drain)
		printf("%llu records\n", lg.written);
	err = 0;
cleanup:
	if (lg.f)
		fclose(lg.f);
	ring_buffer__free(rb);
	if (ev_fd >= 0)
		close(ev_fd);
	if (ctl_fd >= 0)
		close(ctl_fd);
	if (meta_fd >= 0)
		close(meta_fd);
	return err;
}

/* ---------------------------------------------------------------- main */

static void usage(void)
{
	fprintf(stderr,
		"usage: ccs-edge [--config FILE] [--pin-dir DIR] [--pubkey PEM] [--node-id ID] CMD\n"
		"  attach --cgroup PATH [--sample-rate R] | detach [--purge] | policy\n"
		"  load MANIFEST [--json] | rollback | status [--json]\n"
		"  log --out DIR [--drain] | run [--out DIR]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "pin-dir", required_argument, NULL, 'p' },
		{ "pubkey", required_argument, NULL, 'k' },
		{ "node-id", required_argument, NULL, 'n' },
		{ "cgroup", required_argument, NULL, 'g' },
		{ "sample-rate", required_argument, NULL, 's' },
		{ "out", required_argument, NULL, 'o' },
		{ "json", no_argument, NULL, 'j' },
		{ "drain", no_argument, NULL, 'd' },
		{ "purge", no_argument, NULL, 'P' },
		{ "help", no_argument, NULL, 'h' },
		{},
	};
	const char *config = NULL, *pin = NULL, *pubkey = NULL, *node = NULL, *cgroup = NULL;
	const char *out = NULL, *sample = NULL, *cmd;
	bool json = false, drain = false, purge = false;
	int c, i;

	/* options may come before or after the command; the first non-option is the command */
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1 || optind < argc) {
		if (c == -1) {
			/* a non-option: keep it in place and carry on after it */
			optind++;
			continue;
		}
		switch (c) {
		case 'c': config = optarg; break;
		case 'p': pin = optarg; break;
		case 'k': pubkey = optarg; break;
		case 'n': node = optarg; break;
		case 'g': cgroup = optarg; break;
		case 's': sample = optarg; break;
		case 'o': out = optarg; break;
		case 'j': json = true; break;
		case 'd': drain = true; break;
		case 'P': purge = true; break;
		default: usage(); return 2;
		}
	}
	/* collect the positional arguments */
	{
		int np = 0;
		char *pos[4] = {};

		for (i = 1; i < argc; i++) {
			const char *a = argv[i];
			bool takes = false;
			const struct option *o;

			if (a[0] == '-' && a[1] == '-') {
				for (o = opts; o->name; o++)
					if (!strncmp(a + 2, o->name, strlen(o->name)) &&
					    a[2 + strlen(o->name)] == 0 && o->has_arg == required_argument)
						takes = true;
				if (takes)
					i++;
				continue;
			}
			if (a[0] == '-' && a[1])
				continue;
			if (np < 4)
				pos[np++] = argv[i];
		}
		if (np < 1) {
			usage();
			return 2;
		}
		cmd = pos[0];
		if (config && load_config(config))
			return 1;
		if (pin)
			snprintf(cfg.pin_dir, sizeof(cfg.pin_dir), "%s", pin);
		if (pubkey)
			snprintf(cfg.public_key, sizeof(cfg.public_key), "%s", pubkey);
		if (node)
			snprintf(cfg.node_id, sizeof(cfg.node_id), "%s", node);
		if (cgroup)
			snprintf(cfg.cgroup, sizeof(cfg.cgroup), "%s", cgroup);
		if (sample)
			cfg.sample_rate = strtod(sample, NULL);
		if (!out && cfg.log_dir[0])
			out = cfg.log_dir;
		libbpf_set_print(libbpf_print_fn);

		if (!strcmp(cmd, "attach"))
			return cmd_attach();
		if (!strcmp(cmd, "detach"))
			return cmd_detach(purge);
		if (!strcmp(cmd, "policy"))
			return cmd_policy();
		if (!strcmp(cmd, "load")) {
			if (np < 2) {
				usage();
				return 2;
			}
			return cmd_load(pos[1], json);
		}
		if (!strcmp(cmd, "rollback"))
			return cmd_rollback();
		if (!strcmp(cmd, "status"))
			return cmd_status(json);
		if (!strcmp(cmd, "log"))
			return cmd_log(out, drain, false);
		if (!strcmp(cmd, "run"))
			return cmd_log(out, false, true);
	}
	usage();
	return 2;
}
