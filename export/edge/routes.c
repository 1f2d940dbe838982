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

#define ROUTE_WITHIN_MAX 64

bool routes_enabled(void)
{
	return cfg.route_table[0] != 0;
}

/* the prefixes of `list` (route_within's syntax) -> w[], at most max; -1 with why[] on a malformed one */
static int parse_within(const char *list, struct within *w, int max, char *why, size_t why_n)
{
	char buf[sizeof(cfg.route_within)], *tok, *save = NULL;
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
		die_msg("route CCs: %s: run ip: %s", what, strerror(errno));
		return -1;
	}
	fed = fputs(lines, p) >= 0 && fflush(p) == 0;
	st = pclose(p);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) || !fed) {
		die_msg("route CCs: %s: ip -%d -batch %s%s%d (%zu route%s in the batch)", what, family,
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
static int recorded_table(char *out, size_t n)
{
	struct ccs_route_state st = {};
	__u32 zero = 0;
	int fd = open_pinned("ccs_routes"), err;

	if (fd < 0)
		return -1;
	err = bpf_map_lookup_elem(fd, &zero, &st);
	close(fd);
	if (err)
		return -1;
	snprintf(out, n, "%.*s", (int)sizeof(st.table), st.table);
	return 0;
}

static int record_table(const char *table)
{
	struct ccs_route_state st = {};
	__u32 zero = 0;
	int fd = open_pinned("ccs_routes"), err = 0;

	if (fd < 0)
		return 0;   /* a pin dir from before it: flushes take every table's */
	snprintf(st.table, sizeof(st.table), "%s", table);
	if (bpf_map_update_elem(fd, &zero, &st, BPF_ANY)) {
		err = -errno;
		die_msg("route CCs: record table \"%s\" in %s/ccs_routes: %s", table, cfg.pin_dir,
			strerror(-err));
	}
	close(fd);
	return err;
}

/* this agent's tables (the recorded one, the configured one, each once) into t[]; -> how many,
 * or -1 for every table (no ccs_routes) */
static int own_tables(char t[2][33])
{
	int k = 0;

	if (recorded_table(t[0], sizeof(t[0])) < 0)
		return -1;
	if (t[0][0])
		k++;
	if (cfg.route_table[0] && (!k || strcmp(t[0], cfg.route_table)))
		snprintf(t[k++], sizeof(t[0]), "%s", cfg.route_table);
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
__u32 routes_mark(void)
{
	return routes_enabled() ? mark_of(cfg.route_table) : 0;
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
static size_t rule_lines(int fam, const char *keep, char *buf, size_t n)
{
	char t[2][33];
	int k = own_tables(t), i, has;
	size_t len = 0;

	buf[0] = 0;
	if (k < 0) {   /* no ccs_routes: the configured table's only */
		k = cfg.route_table[0] ? 1 : 0;
		snprintf(t[0], sizeof(t[0]), "%s", cfg.route_table);
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
static size_t flush_lines(char *buf, size_t n)
{
	char t[2][33];
	int k = own_tables(t), i;
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
int routes_flush(void)
{
	char lines[768];
	int fam, err = 0;
	size_t len, rl;

	for (fam = 4; fam <= 6; fam += 2) {
		len = flush_lines(lines, sizeof(lines));
		rl = rule_lines(fam, NULL, lines + len, sizeof(lines) - len);
		if (len + rl && ip_batch(fam, lines, 0, "flush"))
			err = -1;
	}
	return err ? -1 : record_table("");
}

/*
 * The routes of a table's entries (n of them): flushed, then written again. Returns the number of
 * routes written, or -1 (a route ip refused; the others stand).
 */
int routes_sync(const struct ccs_table_entry *ents, size_t n)
{
	struct within w[ROUTE_WITHIN_MAX];
	char type[32] = "", why[256];
	const char *spec = cfg.route_spec;
	int nw, fam, err = 0;
	size_t i, k, count = 0;

	if (!routes_enabled())
		return 0;
	nw = parse_within(cfg.route_within, w, ROUTE_WITHIN_MAX, why, sizeof(why));
	if (nw < 0) {
		die_msg("route CCs: %s", why);
		return -1;
	}
	/* "type T rest": ip takes the route type before the prefix */
	if (!strncmp(cfg.route_spec, "type ", 5)) {
		const char *sp = cfg.route_spec + 5;
		size_t tl = strcspn(sp, " ");

		snprintf(type, sizeof(type), "%.*s", (int)(tl < sizeof(type) ? tl : sizeof(type) - 1), sp);
		spec = sp + tl + strspn(sp + tl, " ");
	}
	for (fam = 4; fam <= 6; fam += 2) {
		size_t cap = 1 << 16, len = 0, lines = 0;
		char *buf = malloc(cap);

		if (!buf) {
			die_msg("route CCs: out of memory");
			return -1;
		}
		len += flush_lines(buf, cap);
		/* this agent's rule added if missing (an old table's taken out) */
		len += rule_lines(fam, cfg.route_table, buf + len, cap - len);
		for (i = 0; i < n; i++) {
			const struct ccs_table_entry *e = &ents[i];
			char a[INET6_ADDRSTRLEN], line[512];
			int m;

			if (e->family != fam || e->cc < 1 || e->cc > CCS_CC_MAX ||
			    (e->flags & CCS_ENTRY_LOW_CONF))
				continue;
			for (k = 0; k < (size_t)nw; k++)
				if (inside(&w[k], fam, e->addr, e->prefix_len))
					break;
			if (k == (size_t)nw)
				continue;
			inet_ntop(fam == 4 ? AF_INET : AF_INET6, e->addr, a, sizeof(a));
			m = snprintf(line, sizeof(line), "route replace %s%s%s/%u table %s proto %d %s congctl %s\n",
				     type, type[0] ? " " : "", a, e->prefix_len, cfg.route_table,
				     CCS_ROUTE_PROTO, spec, cc_names[e->cc]);
			if (len + (size_t)m + 1 > cap) {
				char *nb = realloc(buf, cap * 2);

				if (!nb) {
					free(buf);
					die_msg("route CCs: out of memory");
					return -1;
				}
				buf = nb;
				cap *= 2;
			}
			memcpy(buf + len, line, (size_t)m + 1);
			len += (size_t)m;
			lines++;
		}
		if (ip_batch(fam, buf, lines, "write the table's routes"))
			err = -1;
		else if (fam == 6 && !err && record_table(cfg.route_table))
			err = -1;   /* both families written: ours are in route_table now */
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
long routes_count(void)
{
	char line[512], t[2][33], *p_tab;
	int k = own_tables(t), i;
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
