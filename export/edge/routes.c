// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * routes.c - route CCs (issue 29): the live table's CCs also as routes carrying `congctl`.
 *
 * The kernel gives a passive child socket the CC of the route to its client (RTAX_CC_ALGO,
 * tcp_ca_openreq_child) when it creates it, with no call from the program; the program then finds
 * the socket already on the CC it decides and skips bpf_setsockopt (ccs.bpf.c cc_routes), which is
 * most of what a switch costs. The program stays the authority, so the routes are only ever a
 * head start: a missing, late or stale route costs a switch, never a wrong CC.
 *
 * Config (config.c): route_table (a routing table: a number, or local / main), route_spec (what
 * every route says besides its prefix, e.g. "via 192.0.2.1 dev eth0", or "type local dev lo" for
 * clients on loopback; a leading "type T" goes before the prefix, as ip wants it), route_within (comma-separated prefixes: only entries inside one of them
 * get a route, so a table can never reroute what lies outside them). Every route is written
 * with protocol CCS_ROUTE_PROTO, so that ours, and only ours, are replaced and flushed.
 *
 * Sync (after a load's swap, so the program is already on the new table): flush this agent's
 * (the table recorded in ccs_routes and route_table: one route table per agent), then one `ip -batch` of `route replace` per entry with a CC (not keep, not low
 * confidence) inside route_within. A rollback and a detach (before it removes the link) flush
 * them, and so do an attach with route CCs off (a config that turned them off leaves none
 * behind) and the run daemon once the live table has expired. Every failure of ip is reported
 * and returned; the caller exits 1 naming its step. Routes belong to the network namespace,
 * not the cgroup: agents of one namespace each need a table of their own.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <bpf/bpf.h>

#include "agent.h"

#define CCS_ROUTE_PROTO 204 /* routes_count's command says it too */
/*
 * Confinement (issue 56): the agent's table is looked up only by sockets carrying its mark, by
 * `ip rule pref CCS_ROUTE_RULE_PREF fwmark MARK lookup TABLE`, and the program marks only its
 * cgroup's listeners (ccs.bpf.c mark_listener). The mark says the table: CCS_ROUTE_MARK_BASE with
 * the table's number in the low 20 bits, so two agents (one table each) never share a mark. The
 * rule comes before main's (32766); table local's (0) comes first whatever we do, so a table of
 * our own holds the routes, and client prefixes in local (loopback tests) need local's rule moved.
 */
#define CCS_ROUTE_RULE_PREF 100
#define CCS_ROUTE_MARK_BASE 0xcc500000u

struct within {
	int family;   /* 4 or 6 */
	__u8 addr[16];
	unsigned len;
};

static const char *const cc_names[] = { "", "cubic", "bbr", "reno" };

/*
 * On by default (issue 56): route_ccs auto (the default) turns route CCs on where this namespace
 * can carry them, and says why not where it cannot (status's route_ccs_off, the attach's stderr):
 *   - policy routing in the kernel (CONFIG_IP_MULTIPLE_TABLES / CONFIG_IPV6_MULTIPLE_TABLES, or
 *     `ip` itself): `ip -F rule show` must succeed, per family;
 *   - a nexthop: route_spec, or else the namespace's default route in table main (its via, dev,
 *     src and onlink words; a multipath default is not taken), per family;
 * a family without either gets no routes (its connections are switched by the program, as with
 * route CCs off). route_table unset: a table of this agent's own, from its pin dir (one table per
 * agent, issue 56 item 7): 1000 + FNV-1a(pin_dir) mod 10^6, under 2^20 so that the mark (its low
 * 20 bits) is the agent's too. route_within unset: every prefix (only marked sockets look the
 * table up). With the nexthop taken from the default route, an entry that overlaps any other
 * route of main (a connected subnet, a more specific route) gets no route: its clients are not
 * behind the default route, or not all of them. route_ccs on: no policy-routing check (ip's own
 * failure at the write says what is missing), and no nexthop is an error (attach exits 1 naming
 * why); off: none, and any left flushed.
 * Everything here reads the namespace (ip ... show), writes nothing; the result is kept for the
 * process (attach, load, status each read it once).
 */
#define FAMS 2   /* [0] IPv4, [1] IPv6 */
#define ROUTE_WITHIN_MAX 64

static int parse_within(const char *list, struct within *w, int max, char *why, size_t why_n);
static bool inside(const struct within *w, int family, const __u8 *a, unsigned len);
#define MAIN_MAX 256

static struct {
	int done, on;
	char table[33];
	char within[sizeof(((struct config *)0)->route_within)];
	bool fam_on[FAMS];
	char spec[FAMS][256];
	bool spec_auto[FAMS];           /* taken from the default route: main's others excluded */
	struct within main_routes[FAMS][MAIN_MAX];
	int n_main[FAMS];
	char why[512];
} rs;

static int fam_ix(int fam)
{
	return fam == 4 ? 0 : 1;
}

/* ip's output of cmd, first `n` bytes, into out; -> ip's exit status (-1: could not run) */
static int ip_read(const char *cmd, char *out, size_t n)
{
	size_t len = 0, r;
	FILE *p;
	int st;

	out[0] = 0;
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (len + 1 < n && (r = fread(out + len, 1, n - 1 - len, p)) > 0)
		len += r;
	out[len] = 0;
	while (fgetc(p) != EOF)
		;
	st = pclose(p);
	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* the default route of family fam in main -> spec (via/dev/src/onlink words); 0, or -1 with why */
static int default_spec(int fam, char *spec, size_t n, char *why, size_t why_n)
{
	char cmd[96], out[4096], *line, *save = NULL, *tok, *s2 = NULL;
	size_t len = 0;

	snprintf(cmd, sizeof(cmd), "ip -%d route show default table main 2>/dev/null", fam);
	if (ip_read(cmd, out, sizeof(out))) {
		snprintf(why, why_n, "IPv%d: ip route show default failed", fam);
		return -1;
	}
	line = strtok_r(out, "\n", &save);
	if (!line || strncmp(line, "default", 7)) {
		snprintf(why, why_n, "IPv%d: no default route in table main to take a nexthop from "
			 "(set route_spec)", fam);
		return -1;
	}
	if (save && *save && strstr(save, "nexthop")) {
		snprintf(why, why_n, "IPv%d: the default route is multipath (set route_spec)", fam);
		return -1;
	}
	spec[0] = 0;
	for (tok = strtok_r(line, " ", &s2); tok; tok = strtok_r(NULL, " ", &s2)) {
		bool arg = !strcmp(tok, "via") || !strcmp(tok, "dev") || !strcmp(tok, "src");
		char *val = arg ? strtok_r(NULL, " ", &s2) : NULL;

		if (arg && val)
			len += (size_t)snprintf(spec + len, n - len, "%s%s %s", len ? " " : "", tok, val);
		else if (!strcmp(tok, "onlink"))
			len += (size_t)snprintf(spec + len, n - len, "%sonlink", len ? " " : "");
	}
	if (!strstr(spec, "dev ")) {
		snprintf(why, why_n, "IPv%d: the default route names no device (set route_spec)", fam);
		return -1;
	}
	return 0;
}

/* main's routes of family fam other than the default, as prefixes (rs.main_routes); 0 or -1 */
static int main_routes(int fam)
{
	static const char *const types[] = { "unicast", "unreachable", "blackhole", "prohibit",
					     "throw", "local", "broadcast", "anycast", "multicast",
					     "nat", NULL };
	char cmd[96], *out, *line, *save = NULL;
	int i = fam_ix(fam), t;

	out = malloc(1 << 20);
	if (!out)
		return -1;
	snprintf(cmd, sizeof(cmd), "ip -%d route show table main 2>/dev/null", fam);
	if (ip_read(cmd, out, 1 << 20)) {
		free(out);
		return -1;
	}
	rs.n_main[i] = 0;
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char pfx[64], why[128];
		struct within w;

		if (line[0] == ' ' || line[0] == '\t' || !strncmp(line, "default", 7))
			continue;
		if (sscanf(line, "%63s", pfx) != 1)
			continue;
		for (t = 0; types[t]; t++)
			if (!strcmp(pfx, types[t]) && sscanf(line + strlen(types[t]), "%63s", pfx) != 1)
				break;
		if (!strchr(pfx, '/'))   /* a host route: ip prints it without its length */
			strncat(pfx, fam == 4 ? "/32" : "/128", sizeof(pfx) - strlen(pfx) - 1);
		if (parse_within(pfx, &w, 1, why, sizeof(why)) != 1)
			continue;
		if (rs.n_main[i] == MAIN_MAX) {
			free(out);
			return -1;
		}
		rs.main_routes[i][rs.n_main[i]++] = w;
	}
	free(out);
	return 0;
}

static unsigned long table_of_pin_dir(const char *pin)
{
	__u32 h = 2166136261u;

	for (; *pin; pin++)
		h = (h ^ (__u8)*pin) * 16777619u;
	return 1000 + h % 1000000;
}

static void resolve(const struct config *cfg)
{
	char out[256], cmd[64], why[2][256] = { "", "" };
	int fam, i;

	if (rs.done)
		return;
	rs.done = 1;
	/* off: only a configured table besides the recorded one (ccs_routes) is flushed; an agent
	 * that never wrote routes touches no table */
	if (cfg->route_table[0])
		snprintf(rs.table, sizeof(rs.table), "%s", cfg->route_table);
	if (cfg->route_ccs == ROUTE_CCS_OFF) {
		snprintf(rs.why, sizeof(rs.why), "route_ccs: off in the config");
		return;
	}
	if (!rs.table[0])
		snprintf(rs.table, sizeof(rs.table), "%lu", table_of_pin_dir(cfg->pin_dir));
	snprintf(rs.within, sizeof(rs.within), "%s", cfg->route_within[0] ? cfg->route_within :
		 "0.0.0.0/0,::/0");
	for (fam = 4; fam <= 6; fam += 2) {
		i = fam_ix(fam);
		/* auto only: with route_ccs on, ip's own failure at the write says what is missing */
		snprintf(cmd, sizeof(cmd), "ip -%d rule show 2>/dev/null", fam);
		if (cfg->route_ccs == ROUTE_CCS_AUTO && ip_read(cmd, out, sizeof(out))) {
			snprintf(why[i], sizeof(why[i]), "IPv%d: `ip -%d rule show` failed (no policy "
				 "routing in this kernel, or no ip)", fam, fam);
			continue;
		}
		if (cfg->route_spec[0]) {
			snprintf(rs.spec[i], sizeof(rs.spec[i]), "%s", cfg->route_spec);
		} else if (default_spec(fam, rs.spec[i], sizeof(rs.spec[i]), why[i], sizeof(why[i])) ||
			   main_routes(fam)) {
			if (!why[i][0])
				snprintf(why[i], sizeof(why[i]), "IPv%d: table main unreadable", fam);
			continue;
		} else {
			rs.spec_auto[i] = true;
		}
		rs.fam_on[i] = true;
	}
	rs.on = rs.fam_on[0] || rs.fam_on[1];
	snprintf(rs.why, sizeof(rs.why), "%s%s%s", why[0], why[0][0] && why[1][0] ? "; " : "", why[1]);
}

bool routes_enabled(const struct config *cfg)
{
	resolve(cfg);
	return rs.on;
}

/* why route CCs are off, or which family is (""  when both are on) */
const char *routes_why(const struct config *cfg)
{
	resolve(cfg);
	return rs.why;
}

const char *routes_table(const struct config *cfg)
{
	resolve(cfg);
	return rs.table;
}

const char *routes_within(const struct config *cfg)
{
	resolve(cfg);
	return rs.within;
}

/* the prefixes of `list` (route_within's syntax) -> w[], at most max; -1 with why[] on a malformed one */
static int parse_within(const char *list, struct within *w, int max, char *why, size_t why_n)
{
	char buf[sizeof(((struct config *)0)->route_within)], *tok, *save = NULL;
	int n = 0;

	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		char *slash = strchr(tok, '/'), *end;
		long len;

		if (n == max || !slash) {
			snprintf(why, why_n, "route_within: \"%s\": need prefixes as address/length (at "
				 "most %d)", tok, max);
			return -1;
		}
		*slash = 0;
		len = strtol(slash + 1, &end, 10);
		memset(&w[n], 0, sizeof(w[n]));
		if (inet_pton(AF_INET, tok, w[n].addr) == 1)
			w[n].family = 4;
		else if (inet_pton(AF_INET6, tok, w[n].addr) == 1)
			w[n].family = 6;
		if (!w[n].family || !slash[1] || *end || len < 0 || len > (w[n].family == 4 ? 32 : 128)) {
			snprintf(why, why_n, "route_within: \"%s/%s\" is not a prefix", tok, slash + 1);
			return -1;
		}
		w[n].len = (unsigned)len;
		n++;
	}
	if (!n && list[0]) {
		snprintf(why, why_n, "route_within: \"%s\" names no prefix", list);
		return -1;
	}
	return n;
}

/* route_within checked when the config is read (config.c): 0, or -1 with why[] */
int routes_check_within(const char *list, char *why, size_t why_n)
{
	struct within w[ROUTE_WITHIN_MAX];

	return parse_within(list, w, ROUTE_WITHIN_MAX, why, why_n) < 0 ? -1 : 0;
}

/* whether prefix a/len lies inside w */
static bool inside(const struct within *w, int family, const __u8 *a, unsigned len)
{
	unsigned i;

	if (w->family != family || len < w->len)
		return false;
	for (i = 0; i < w->len; i++)
		if (((a[i / 8] ^ w->addr[i / 8]) >> (7 - i % 8)) & 1)
			return false;
	return true;
}

/*
 * Run `ip -<family> -force -batch -` over the lines (what: the step, for the message). ip's own
 * errors go to our stderr; -force goes on after an error, and its exit status says one happened.
 * SIGPIPE is ignored (ccs.c), so an ip that dies before reading everything is an EPIPE here, not
 * the end of the agent. -> 0, or -1 after saying what failed.
 */
static int ip_batch(int family, const char *lines, size_t n_lines, const char *what)
{
	char cmd[64];
	bool fed;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "ip -%d -force -batch - >/dev/null", family);
	fflush(stderr);
	p = popen(cmd, "w");
	if (!p) {
		print_error("route CCs: %s: run ip: %s", what, strerror(errno));
		return -1;
	}
	fed = fputs(lines, p) >= 0 && fflush(p) == 0;
	st = pclose(p);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) || !fed) {
		print_error("route CCs: %s: ip -%d -batch %s%s%d (%zu route%s in the batch)", what, family,
			!fed ? "did not take all its input, then " : "",
			st != -1 && WIFEXITED(st) ? "exited " : "was killed by signal ",
			st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), n_lines,
			n_lines == 1 ? "" : "s");
		return -1;
	}
	return 0;
}

/*
 * Whose routes are whose: all of ours carry protocol CCS_ROUTE_PROTO, and this agent's are in the
 * table recorded in ccs_routes (where it last wrote them) or the configured route_table. A flush
 * takes those tables' routes of our protocol only, so an agent never flushes another's (one
 * route table per agent), and a config that moved the table or turned route CCs off still
 * finds the old ones. Without ccs_routes (a pin dir attached by an agent from before it) every
 * table's, as before.
 */
static int recorded_table(const char *pin_dir, char *out, size_t n)
{
	struct ccs_route_state st = {};
	__u32 zero = 0;
	int fd = open_pinned(pin_dir, "ccs_routes"), err;

	if (fd < 0)
		return -1;
	err = bpf_map_lookup_elem(fd, &zero, &st);
	close(fd);
	if (err)
		return -1;
	snprintf(out, n, "%.*s", (int)sizeof(st.table), st.table);
	return 0;
}

static int record_table(const char *pin_dir, const char *table)
{
	struct ccs_route_state st = {};
	__u32 zero = 0;
	int fd = open_pinned(pin_dir, "ccs_routes"), err = 0;

	if (fd < 0)
		return 0;   /* a pin dir from before it: flushes take every table's */
	snprintf(st.table, sizeof(st.table), "%s", table);
	if (bpf_map_update_elem(fd, &zero, &st, BPF_ANY)) {
		err = -errno;
		print_error("route CCs: record table \"%s\" in %s/ccs_routes: %s", table, pin_dir,
			strerror(-err));
	}
	close(fd);
	return err;
}

/* this agent's tables (the recorded one, the configured one, each once) into t[]; -> how many,
 * or -1 for every table (no ccs_routes) */
static int own_tables(const struct config *cfg, char t[2][33])
{
	int k = 0;

	if (recorded_table(cfg->pin_dir, t[0], sizeof(t[0])) < 0)
		return -1;
	if (t[0][0])
		k++;
	if (routes_table(cfg)[0] && (!k || strcmp(t[0], routes_table(cfg))))
		snprintf(t[k++], sizeof(t[0]), "%s", routes_table(cfg));
	return k;
}

/* a table's number (local, main, default by name), 0 if it has none */
static unsigned long table_number(const char *t)
{
	char *end;
	unsigned long v;

	if (!strcmp(t, "local"))
		return 255;
	if (!strcmp(t, "main"))
		return 254;
	if (!strcmp(t, "default"))
		return 253;
	v = strtoul(t, &end, 10);
	return *t && !*end ? v : 0;
}

static __u32 mark_of(const char *t)
{
	return CCS_ROUTE_MARK_BASE | (__u32)(table_number(t) & 0xfffff);
}

/* the mark the program gives the cgroup's listeners, 0 with route CCs off */
__u32 routes_mark(const struct config *cfg)
{
	return routes_enabled(cfg) ? mark_of(routes_table(cfg)) : 0;
}

/* whether the namespace holds this agent's rule for table t, family fam (-1: ip cannot say) */
static int rule_present(int fam, const char *t)
{
	char cmd[160], line[256];
	int found = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "ip -%d rule show pref %d fwmark 0x%x lookup %s 2>/dev/null", fam,
		 CCS_ROUTE_RULE_PREF, mark_of(t), t);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof(line), p))
		found |= strstr(line, "fwmark") != NULL;
	if (pclose(p))
		return -1;
	return found;
}

/*
 * The ip -batch lines (family fam) that take this agent's rules out, but for the one of table
 * `keep` (the configured table on a write; NULL on a flush), which they add if it is missing.
 * -> their length.
 */
static size_t rule_lines(const struct config *cfg, int fam, const char *keep, char *buf, size_t n)
{
	char t[2][33];
	int k = own_tables(cfg, t), i, has;
	size_t len = 0;

	buf[0] = 0;
	if (k < 0) {   /* no ccs_routes: the configured table's only */
		k = routes_table(cfg)[0] ? 1 : 0;
		snprintf(t[0], sizeof(t[0]), "%s", routes_table(cfg));
	}
	for (i = 0; i < k; i++) {
		bool mine = keep && !strcmp(t[i], keep);

		has = rule_present(fam, t[i]);
		if (has < 0)   /* ip cannot say: the line goes in, and the batch's ip reports its failure */
			has = !mine;
		if (has != mine)
			len += (size_t)snprintf(buf + len, n - len, "rule %s pref %d fwmark 0x%x lookup %s\n",
						mine ? "add" : "del", CCS_ROUTE_RULE_PREF, mark_of(t[i]),
						t[i]);
	}
	return len;
}

/* the ip -batch lines that flush this agent's routes into buf (n bytes); -> their length */
static size_t flush_lines(const struct config *cfg, char *buf, size_t n)
{
	char t[2][33];
	int k = own_tables(cfg, t), i;
	size_t len = 0;

	buf[0] = 0;
	if (k < 0)
		return (size_t)snprintf(buf, n, "route flush table all proto %d\n", CCS_ROUTE_PROTO);
	for (i = 0; i < k; i++)
		len += (size_t)snprintf(buf + len, n - len, "route flush table %s proto %d\n", t[i],
					CCS_ROUTE_PROTO);
	return len;
}

/* this agent's routes and rules, whatever the config says now; -1 after saying which family's
 * flush failed */
int routes_flush(const struct config *cfg)
{
	char lines[768];
	int fam, err = 0;
	size_t len, rl;

	for (fam = 4; fam <= 6; fam += 2) {
		len = flush_lines(cfg, lines, sizeof(lines));
		rl = rule_lines(cfg, fam, NULL, lines + len, sizeof(lines) - len);
		if (len + rl && ip_batch(fam, lines, 0, "flush"))
			err = -1;
	}
	return err ? -1 : record_table(cfg->pin_dir, "");
}

/*
 * The routes of a table's entries (n of them): flushed, then written again. Returns the number of
 * routes written, or -1 (a route ip refused; the others stand).
 */
int routes_sync(const struct config *cfg, const struct ccs_table_entry *ents, size_t n)
{
	struct within w[ROUTE_WITHIN_MAX];
	char why[256];
	int nw, fam, err = 0;
	size_t i, k, count = 0;

	if (!routes_enabled(cfg))
		return 0;
	nw = parse_within(rs.within, w, ROUTE_WITHIN_MAX, why, sizeof(why));
	if (nw < 0) {
		print_error("route CCs: %s", why);
		return -1;
	}
	for (fam = 4; fam <= 6; fam += 2) {
		size_t cap = 1 << 16, len = 0, lines = 0;
		const char *spec = rs.spec[fam_ix(fam)];
		const struct within *mr = rs.main_routes[fam_ix(fam)];
		int nmr = rs.spec_auto[fam_ix(fam)] ? rs.n_main[fam_ix(fam)] : 0;
		char type[32] = "", *buf;

		/* "type T rest": ip takes the route type before the prefix */
		if (!strncmp(spec, "type ", 5)) {
			const char *sp = spec + 5;
			size_t tl = strcspn(sp, " ");

			snprintf(type, sizeof(type), "%.*s", (int)(tl < sizeof(type) ? tl : sizeof(type) - 1), sp);
			spec = sp + tl + strspn(sp + tl, " ");
		}
		buf = malloc(cap);
		if (!buf) {
			print_error("route CCs: out of memory");
			return -1;
		}
		len += flush_lines(cfg, buf, cap);
		/* this agent's rule added if missing (an old table's taken out); a family that cannot
		 * carry route CCs gets its rule and routes taken out only */
		len += rule_lines(cfg, fam, rs.fam_on[fam_ix(fam)] ? rs.table : NULL, buf + len,
				  cap - len);
		for (i = 0; rs.fam_on[fam_ix(fam)] && i < n; i++) {
			const struct ccs_table_entry *e = &ents[i];
			char a[INET6_ADDRSTRLEN], line[512];
			int m, j;

			if (e->family != fam || e->cc < 1 || e->cc > CCS_CC_MAX ||
			    (e->flags & CCS_ENTRY_LOW_CONF))
				continue;
			for (k = 0; k < (size_t)nw; k++)
				if (inside(&w[k], fam, e->addr, e->prefix_len))
					break;
			if (k == (size_t)nw)
				continue;
			/* a nexthop from the default route: not for a prefix another route of main
			 * covers in part or whole (either inside the other) */
			for (j = 0; j < nmr; j++) {
				struct within ew = { .family = fam, .len = e->prefix_len };

				memcpy(ew.addr, e->addr, sizeof(ew.addr));
				if (inside(&mr[j], fam, e->addr, e->prefix_len) ||
				    inside(&ew, fam, mr[j].addr, mr[j].len))
					break;
			}
			if (j < nmr)
				continue;
			inet_ntop(fam == 4 ? AF_INET : AF_INET6, e->addr, a, sizeof(a));
			m = snprintf(line, sizeof(line), "route replace %s%s%s/%u table %s proto %d %s congctl %s\n",
				     type, type[0] ? " " : "", a, e->prefix_len, rs.table,
				     CCS_ROUTE_PROTO, spec, cc_names[e->cc]);
			if (len + (size_t)m + 1 > cap) {
				char *nb = realloc(buf, cap * 2);

				if (!nb) {
					free(buf);
					print_error("route CCs: out of memory");
					return -1;
				}
				buf = nb;
				cap *= 2;
			}
			memcpy(buf + len, line, (size_t)m + 1);
			len += (size_t)m;
			lines++;
		}
		if (len && ip_batch(fam, buf, lines, "write the table's routes"))
			err = -1;
		else if (fam == 6 && !err && record_table(cfg->pin_dir, rs.table))
			err = -1;   /* both families written: ours are in the agent's table now */
		count += lines;
		free(buf);
	}
	return err ? -1 : (int)count;
}

/* a table's name as ip prints it: the numbers /etc/iproute2/rt_tables names by default */
static const char *table_name(const char *t)
{
	return !strcmp(t, "255") ? "local" : !strcmp(t, "254") ? "main" : !strcmp(t, "253") ? "default" : t;
}

/* how many of this agent's routes the namespace holds (both families), -1 if ip cannot say */
long routes_count(const struct config *cfg)
{
	char line[512], t[2][33], *p_tab;
	int k = own_tables(cfg, t), i;
	long n = 0;
	FILE *p = popen("ip -4 route show table all proto 204 2>/dev/null; "
			"ip -6 route show table all proto 204 2>/dev/null", "r");

	if (!p)
		return -1;
	while (fgets(line, sizeof(line), p)) {
		/* "... table T ..." (no table word: main) */
		p_tab = strstr(line, " table ");
		for (i = 0; i < k; i++) {
			const char *want = table_name(t[i]);
			size_t wl = strlen(want);

			if (p_tab ? !strncmp(p_tab + 7, want, wl) && strchr(" \n", p_tab[7 + wl])
				  : !strcmp(want, "main"))
				break;
		}
		n += k < 0 || i < k;
	}
	return pclose(p) == 0 ? n : -1;
}
