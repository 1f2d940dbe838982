// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * metrics.c - the agent's counters and state in the Prometheus text exposition format (issue 59).
 *
 *   ccs-edge metrics [FILE]      once: to stdout, or atomically to FILE
 *   run, with metrics_file: set  the same file rewritten every METRICS_INTERVAL_S seconds
 *
 * Why a file for node_exporter's textfile collector and not an HTTP endpoint of the agent: an
 * edge already runs node_exporter (its scrape, TLS and auth are the fleet's, configured once), the
 * enforcer's host gets no new listening socket, and a dead agent cannot hide behind a dead
 * endpoint: node_exporter keeps serving the file's mtime (node_textfile_mtime_seconds), so a
 * stalled agent is visible as a stale file, and the kernel's enforcement (pinned maps) is what the
 * file describes whether or not the agent runs. docs/operations-metrics.md has the names.
 *
 * What goes in: every ccs_counters and ccs_flow_counters entry summed over the CPUs, the live and
 * the previous table (version, model version, created / loaded / expiry times, age, time to expiry,
 * expired, enforced, entries), attach and link state, route-CC state, the transport log's ledger
 * (written, lost, failed file calls, degraded), the version rule's floor and overrides, the
 * configured services. Names follow Prometheus's conventions: ccs_edge_ prefix, counters _total,
 * times in seconds; labels take bounded values only (slot, entry kind, source, state, service).
 * The kernel counts per service too (ccs_svc_counters, ccs.h): every kernel counter comes out
 * once per configured service, labelled service="<its name>" (the port where it has none;
 * services of one name summed), and the counters with events of no service (not_served, a
 * listener's setsockopt_err, cc_reset on an unserved port) also without the label, as does any
 * other counter once slot 0 has counted it: summed over its series, a counter is the node's total. A program attached before ccs_svc_counters existed
 * gives the node totals alone, unlabelled.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "agent.h"

/* how often `run` rewrites metrics_file: well under a scrape interval of 15 s */
#define METRICS_INTERVAL_S 5

/* a kernel counter (ccs_counter_names) as a metric: its name, one label pair or none, its help,
 * and whether events of no service (slot 0) count it */
struct counter_metric {
	const char *kernel;
	const char *name;
	const char *label;   /* "entry=\"bbr\"" or NULL */
	const char *help;
	enum { PER_SERVICE, ALSO_NO_SERVICE, NO_SERVICE } scope;
};

/* ccs_counters, in the kernel's order (ccs.h enum ccs_counter); tests/test_metrics_edge.py checks
 * that each kernel counter comes out under its metric with status's value */
static const struct counter_metric counter_metrics[CCS_CNT__MAX] = {
	{ "established", "ccs_edge_connections_established_total", NULL,
	  "Passive connections established on served ports." },
	{ "no_table", "ccs_edge_connections_no_table_total", NULL,
	  "Served connections that found no live table (kept the default CC)." },
	{ "expired", "ccs_edge_connections_expired_table_total", NULL,
	  "Served connections that found the live table past its expiry (kept the default CC)." },
	{ "ab_control", "ccs_edge_ab_control_total", NULL,
	  "Served connections in the A/B control group (even CRC32 of the client address)." },
	{ "lookups", "ccs_edge_lookups_total", NULL, "Table lookups." },
	{ "miss", "ccs_edge_lookup_misses_total", NULL, "Lookups that matched no prefix." },
	{ "hit_keep", "ccs_edge_lookup_hits_total", "entry=\"keep\"",
	  "Lookups that matched a prefix, by what the entry says (keep, lowconf, or its CC)." },
	{ "hit_lowconf", "ccs_edge_lookup_hits_total", "entry=\"lowconf\"", NULL },
	{ "hit_cubic", "ccs_edge_lookup_hits_total", "entry=\"cubic\"", NULL },
	{ "hit_bbr", "ccs_edge_lookup_hits_total", "entry=\"bbr\"", NULL },
	{ "hit_reno", "ccs_edge_lookup_hits_total", "entry=\"reno\"", NULL },
	{ "setsockopt_err", "ccs_edge_setsockopt_errors_total", NULL,
	  "TCP_CONGESTION setsockopt calls that failed (unlabelled: a listener's mark, an unserved port).",
	  ALSO_NO_SERVICE },
	{ "pacing_set", "ccs_edge_caps_set_total", "cap=\"pacing\"",
	  "AutoPlex caps applied, by cap (pacing rate, cwnd clamp)." },
	{ "clamp_set", "ccs_edge_caps_set_total", "cap=\"cwnd_clamp\"", NULL },
	{ "caps_err", "ccs_edge_caps_errors_total", NULL, "AutoPlex cap setsockopt calls that failed." },
	{ "log_sampled", "ccs_edge_log_sampled_total", NULL,
	  "Connections sampled for the transport log." },
	{ "log_emitted", "ccs_edge_log_emitted_total", NULL,
	  "Transport log records put on the ring buffer." },
	{ "log_dropped", "ccs_edge_log_ring_dropped_total", NULL,
	  "Transport log records dropped because the ring buffer was full." },
	{ "storage_err", "ccs_edge_socket_storage_errors_total", NULL,
	  "Connections whose socket storage could not be created." },
	{ "not_served", "ccs_edge_connections_not_served_total", NULL,
	  "Passive connections on ports outside the policy.", NO_SERVICE },
	{ "cc_preset", "ccs_edge_route_cc_preset_total", NULL,
	  "Route CCs: connections that already ran the CC decided (no switch)." },
	{ "cc_reset", "ccs_edge_route_cc_reset_total", NULL,
	  "Route CCs: connections whose route CC was not the decision, put back to the default "
	  "(unlabelled: on unserved ports).", ALSO_NO_SERVICE },
};

static const struct counter_metric flow_metrics[CCS_FCNT__MAX] = {
	{ "src_table", "ccs_edge_decision_source_total", "source=\"table\"",
	  "Lookups by what decided the CC (table, flow tree, both, fallback, default)." },
	{ "src_flow", "ccs_edge_decision_source_total", "source=\"flow\"", NULL },
	{ "src_table_flow", "ccs_edge_decision_source_total", "source=\"table_flow\"", NULL },
	{ "src_fallback", "ccs_edge_decision_source_total", "source=\"fallback\"", NULL },
	{ "src_default", "ccs_edge_decision_source_total", "source=\"default\"", NULL },
	{ "tree_evals", "ccs_edge_flow_tree_evals_total", NULL, "Flow tree walks." },
	{ "tree_no_leaf", "ccs_edge_flow_tree_no_leaf_total", NULL,
	  "Flow tree walks that found no leaf within the bound." },
};

/* what one reading of the pinned maps holds */
struct snapshot {
	bool maps;                      /* the pin dir has the program's maps */
	struct link_state ls;
	struct bpf_prog_info prog;
	int live;                       /* slot, or -1 */
	bool ok[CCS_SLOTS];
	struct ccs_meta meta[CCS_SLOTS];
	struct ccs_model model[CCS_SLOTS];
	bool has_model[CCS_SLOTS];
	struct ccs_version ver;
	struct floor fl;                /* the version rule's floor on disk (floor.c) */
	bool floor_ok;                  /* readable (absent counts: no table was made live yet) */
	struct ccs_log_state log;
	bool has_log;
	__u64 cnt[CCS_CNT__MAX];
	__u64 fcnt[CCS_FCNT__MAX];
	bool has_fcnt;
	/* ccs_svc_counters' slots 0..cfg->n_services summed over the CPUs (NULL: no such map) */
	struct ccs_svc_counters *svc;
};

/* a label value, escaped as the exposition format says (backslash, double quote, newline) */
static void label_value(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(o, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", o);
		else
			fputc(*s, o);
	}
	fputc('"', o);
}

static void header(FILE *o, const char *name, const char *type, const char *help)
{
	fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* a per-CPU array of n counters, summed; false when the map is not there */
static bool read_percpu(const struct config *cfg, const char *map, __u64 *sum, __u32 n)
{
	int fd = open_pinned(cfg->pin_dir, map), ncpu = libbpf_num_possible_cpus(), c;
	__u64 *vals;
	__u32 k;

	if (fd < 0)
		return false;
	vals = calloc(ncpu > 0 ? ncpu : 1, sizeof(__u64));
	for (k = 0; vals && k < n; k++) {
		sum[k] = 0;
		if (!bpf_map_lookup_elem(fd, &k, vals))
			for (c = 0; c < ncpu; c++)
				sum[k] += vals[c];
	}
	free(vals);
	close(fd);
	return true;
}

/* ccs_svc_counters' slots 0..cfg->n_services, each summed over the CPUs; NULL without the map */
static struct ccs_svc_counters *read_services(const struct config *cfg)
{
	int fd = open_pinned(cfg->pin_dir, "ccs_svc_counters"), c;
	int ncpu = libbpf_num_possible_cpus();
	struct ccs_svc_counters *sum, *vals;
	__u32 id, k;

	if (fd < 0)
		return NULL;
	if (ncpu < 1)
		ncpu = 1;
	sum = calloc(cfg->n_services + 1, sizeof(*sum));
	vals = calloc(ncpu, sizeof(*vals));
	for (id = 0; sum && vals && id <= (__u32)cfg->n_services; id++) {
		if (bpf_map_lookup_elem(fd, &id, vals))
			continue;
		for (c = 0; c < ncpu; c++) {
			for (k = 0; k < CCS_CNT__MAX; k++)
				sum[id].cnt[k] += vals[c].cnt[k];
			for (k = 0; k < CCS_FCNT__MAX; k++)
				sum[id].fcnt[k] += vals[c].fcnt[k];
		}
	}
	if (!vals) {
		free(sum);
		sum = NULL;
	}
	free(vals);
	close(fd);
	return sum;
}

static void read_snapshot(const struct config *cfg, struct snapshot *s)
{
	const char *pin = cfg->pin_dir;
	int ctl_fd = open_pinned(pin, "ccs_ctl"), meta_fd = open_pinned(pin, "ccs_meta");
	int tables_fd = open_pinned(pin, "ccs_tables"), model_fd = open_pinned(pin, "ccs_model");
	int version_fd = open_pinned(pin, "ccs_version"), log_fd = open_pinned(pin, "ccs_log"), prog_fd;
	__u32 zero = 0, slot, index_id, ilen = sizeof(s->prog);
	struct ccs_ctl ctl = {};

	memset(s, 0, sizeof(*s));
	s->live = -1;
	s->ls.fd = -1;
	s->maps = ctl_fd >= 0 && meta_fd >= 0;
	if (s->maps) {
		bpf_map_lookup_elem(ctl_fd, &zero, &ctl);
		if (ctl.live >= 1 && ctl.live <= CCS_SLOTS)
			s->live = ctl.live - 1;
		for (slot = 0; slot < CCS_SLOTS; slot++) {
			index_id = 0;
			bpf_map_lookup_elem(meta_fd, &slot, &s->meta[slot]);
			if (tables_fd >= 0)
				slot_map_id(tables_fd, slot, &index_id);
			s->ok[slot] = slot_consistent(&s->meta[slot], index_id);
			s->has_model[slot] = model_fd >= 0 &&
					     !bpf_map_lookup_elem(model_fd, &slot, &s->model[slot]);
		}
		if (version_fd >= 0)
			bpf_map_lookup_elem(version_fd, &zero, &s->ver);
		s->has_log = log_fd >= 0 && !bpf_map_lookup_elem(log_fd, &zero, &s->log);
		read_percpu(cfg, "ccs_counters", s->cnt, CCS_CNT__MAX);
		s->has_fcnt = read_percpu(cfg, "ccs_flow_counters", s->fcnt, CCS_FCNT__MAX);
		s->svc = read_services(cfg);
	}
	/* a damaged floor file: floor_read says so on stderr (every load refuses until it is put right) */
	s->floor_ok = !floor_read(cfg->state_dir, &s->fl);
	link_state(cfg, &s->ls);
	if (s->ls.prog_id && (prog_fd = bpf_prog_get_fd_by_id(s->ls.prog_id)) >= 0) {
		bpf_obj_get_info_by_fd(prog_fd, &s->prog, &ilen);
		close(prog_fd);
	}
	if (s->ls.fd >= 0)
		close(s->ls.fd);
	for (int *fd = (int[]){ ctl_fd, meta_fd, tables_fd, model_fd, version_fd, log_fd, -2 };
	     *fd != -2; fd++)
		if (*fd >= 0)
			close(*fd);
}

/* the slots shown: the live table and the previous one (rollback's target), as status shows them */
static int shown_slot(const struct snapshot *s, bool previous)
{
	int slot;

	if (s->live < 0 || !s->ok[s->live])
		return -1;
	if (!previous)
		return s->live;
	slot = (s->live + 1) % CCS_SLOTS;
	return s->ok[slot] && s->meta[slot].valid != CCS_META_STAGED ? slot : -1;
}

static void print_tables(FILE *o, const struct snapshot *s)
{
	static const char *const which[2] = { "live", "previous" };
	__u64 now_mono = clock_ns(CLOCK_MONOTONIC);
	time_t now = time(NULL);
	int slot[2] = { shown_slot(s, false), shown_slot(s, true) }, i;
	const struct ccs_meta *m;

	header(o, "ccs_edge_table_present", "gauge",
	       "1 when the slot (live, previous) holds a whole table.");
	for (i = 0; i < 2; i++)
		fprintf(o, "ccs_edge_table_present{slot=\"%s\"} %d\n", which[i], slot[i] >= 0);
	header(o, "ccs_edge_table_info", "gauge",
	       "The table in the slot: its version, model version and sha256 as labels (value 1).");
	for (i = 0; i < 2; i++) {
		const struct ccs_model *md = slot[i] >= 0 && s->has_model[slot[i]] ? &s->model[slot[i]] : NULL;
		char mv[CCS_MODEL_VERSION_MAX], sha[65];

		if (slot[i] < 0)
			continue;
		m = &s->meta[slot[i]];
		mv[0] = 0;
		if (md && md->version == m->version && md->loaded_unix == m->loaded_unix)
			snprintf(mv, sizeof(mv), "%.*s", (int)sizeof(mv) - 1, md->model_version);
		hex(m->sha256, 32, sha);
		fprintf(o, "ccs_edge_table_info{slot=\"%s\",version=\"%llu\",model_version=", which[i],
			(unsigned long long)m->version);
		label_value(o, mv);
		fprintf(o, ",sha256=\"%s\"} 1\n", sha);
	}
#define PER_SLOT(name, type, help, fmt, expr)                                                 \
	do {                                                                                  \
		header(o, name, type, help);                                                  \
		for (i = 0; i < 2; i++) {                                                     \
			if (slot[i] < 0)                                                      \
				continue;                                                     \
			m = &s->meta[slot[i]];                                                \
			fprintf(o, name "{slot=\"%s\"} " fmt "\n", which[i], expr);           \
		}                                                                             \
	} while (0)
	PER_SLOT("ccs_edge_table_version", "gauge", "The table's version.", "%llu",
		 (unsigned long long)m->version);
	PER_SLOT("ccs_edge_table_created_timestamp_seconds", "gauge",
		 "When the table was built (Unix time).", "%llu", (unsigned long long)m->created_unix);
	PER_SLOT("ccs_edge_table_loaded_timestamp_seconds", "gauge",
		 "When this node loaded the table (Unix time).", "%llu",
		 (unsigned long long)m->loaded_unix);
	PER_SLOT("ccs_edge_table_expiry_timestamp_seconds", "gauge",
		 "When the table stops being enforced (Unix time).", "%llu",
		 (unsigned long long)m->expires_unix);
	PER_SLOT("ccs_edge_table_age_seconds", "gauge", "Seconds since the table was built.",
		 "%lld", (long long)now - (long long)m->created_unix);
	/* on the kernel's own clock, as status: negative once past */
	PER_SLOT("ccs_edge_table_expires_in_seconds", "gauge",
		 "Seconds until the table expires on the kernel's clock; negative once expired.",
		 "%.3f", m->expires_mono_ns >= now_mono ? (double)(m->expires_mono_ns - now_mono) / 1e9
						     : -((double)(now_mono - m->expires_mono_ns) / 1e9));
	PER_SLOT("ccs_edge_table_expired", "gauge", "1 when the table is past its expiry.", "%d",
		 now_mono >= m->expires_mono_ns);
	header(o, "ccs_edge_table_entries", "gauge", "Prefix entries of the table, by family.");
	for (i = 0; i < 2; i++) {
		if (slot[i] < 0)
			continue;
		m = &s->meta[slot[i]];
		fprintf(o, "ccs_edge_table_entries{slot=\"%s\",family=\"v4\"} %u\n", which[i], m->n_v4);
		fprintf(o, "ccs_edge_table_entries{slot=\"%s\",family=\"v6\"} %u\n", which[i], m->n_v6);
	}
#undef PER_SLOT
	header(o, "ccs_edge_table_enforced", "gauge",
	       "1 when a live table is enforced: attached to the configured cgroup and not expired.");
	fprintf(o, "ccs_edge_table_enforced %d\n", slot[0] >= 0 && s->ls.attached &&
		now_mono < s->meta[slot[0]].expires_mono_ns);
}

/* the service label's value: its name, or its port where it has none */
static const char *service_label(const struct config *cfg, int i, char *buf, size_t n)
{
	if (cfg->services[i].name[0])
		return cfg->services[i].name;
	snprintf(buf, n, "%u", cfg->services[i].port);
	return buf;
}

/* counter k of service slot id: ccs_counters' (flow: ccs_flow_counters') entry */
static __u64 svc_value(const struct ccs_svc_counters *svc, int id, bool flow, int k)
{
	return flow ? svc[id].fcnt[k] : svc[id].cnt[k];
}

/* v: the node totals; svc: per service (NULL: the totals alone, unlabelled) */
static void print_counters(const struct config *cfg, FILE *o, const struct counter_metric *cm,
			   const __u64 *v, int n, const struct ccs_svc_counters *svc, bool flow)
{
	const char *last = "", *label;
	char buf[16], obuf[16];
	__u64 sum;
	int k, i, j;

	for (k = 0; k < n; k++) {
		if (strcmp(cm[k].name, last)) {
			header(o, cm[k].name, "counter", cm[k].help);
			last = cm[k].name;
		}
		/* the part of no service: where it can have one, and wherever it has one (a
		 * connection logged by a program from before the map closes with service 0) */
		if (!svc || cm[k].scope != PER_SERVICE || svc_value(svc, 0, flow, k))
			fprintf(o, "%s%s%s%s %llu\n", cm[k].name, cm[k].label ? "{" : "",
				cm[k].label ? cm[k].label : "", cm[k].label ? "}" : "",
				(unsigned long long)(svc ? svc_value(svc, 0, flow, k) : v[k]));
		if (!svc || cm[k].scope == NO_SERVICE)
			continue;
		for (i = 0; i < cfg->n_services; i++) {
			label = service_label(cfg, i, buf, sizeof(buf));
			for (j = 0; j < i; j++)
				if (!strcmp(service_label(cfg, j, obuf, sizeof(obuf)), label))
					break;
			if (j < i)
				continue;	/* a name already given: summed there */
			for (sum = 0, j = i; j < cfg->n_services; j++)
				if (!strcmp(service_label(cfg, j, obuf, sizeof(obuf)), label))
					sum += svc_value(svc, j + 1, flow, k);
			fprintf(o, "%s{service=", cm[k].name);
			label_value(o, label);
			fprintf(o, "%s%s} %llu\n", cm[k].label ? "," : "", cm[k].label ? cm[k].label : "",
				(unsigned long long)sum);
		}
	}
}

static void print_state(const struct config *cfg, FILE *o, const struct snapshot *s)
{
	static const char *const links[] = { "ok", "none", "severed", "elsewhere", "unreadable" };
	long routes;
	int i;

	header(o, "ccs_edge_agent_info", "gauge", "The agent's node id and default CC (value 1).");
	fprintf(o, "ccs_edge_agent_info{node_id=");
	label_value(o, cfg->node_id);
	fprintf(o, ",default_cc=");
	label_value(o, cfg->default_cc);
	fprintf(o, "} 1\n");
	header(o, "ccs_edge_maps_present", "gauge", "1 when the pin dir holds the program's maps.");
	fprintf(o, "ccs_edge_maps_present %d\n", s->maps);
	header(o, "ccs_edge_attached", "gauge",
	       "1 when the pinned link runs the program for the configured cgroup.");
	fprintf(o, "ccs_edge_attached %d\n", s->ls.attached);
	header(o, "ccs_edge_link_state", "gauge", "The pinned link's state (one series per state).");
	for (i = 0; i < (int)(sizeof(links) / sizeof(links[0])); i++)
		fprintf(o, "ccs_edge_link_state{state=\"%s\"} %d\n", links[i],
			s->ls.state && !strcmp(s->ls.state, links[i]));
	header(o, "ccs_edge_program_runs_total", "counter",
	       "Runs of the sock_ops program (kernel bpf_stats; 0 while stats are off).");
	fprintf(o, "ccs_edge_program_runs_total %llu\n", (unsigned long long)s->prog.run_cnt);
	header(o, "ccs_edge_program_run_seconds_total", "counter",
	       "Time spent in the sock_ops program (kernel bpf_stats; 0 while stats are off).");
	fprintf(o, "ccs_edge_program_run_seconds_total %.9f\n", (double)s->prog.run_time_ns / 1e9);
	/* the floor is the file once there is one (floor.c), the pinned ccs_version before it */
	header(o, "ccs_edge_version_floor_readable", "gauge",
	       "0 when the version floor's file is damaged: no table loads until it is put right.");
	fprintf(o, "ccs_edge_version_floor_readable %d\n", s->floor_ok);
	header(o, "ccs_edge_version_floor", "gauge",
	       "The newest table version made live here: a load needs one at least as new (in its epoch).");
	fprintf(o, "ccs_edge_version_floor %llu\n", (unsigned long long)(s->floor_ok && s->fl.present ?
									 s->fl.version : s->ver.highest));
	header(o, "ccs_edge_epoch_floor", "gauge",
	       "The deployment epoch of the newest table made live here (0: tables without one).");
	fprintf(o, "ccs_edge_epoch_floor %llu\n", (unsigned long long)(s->floor_ok && s->fl.present ?
								       s->fl.epoch : 0));
	header(o, "ccs_edge_version_overrides_total", "counter",
	       "Older tables made live by an explicit override (rollback, load --allow-downgrade).");
	fprintf(o, "ccs_edge_version_overrides_total %llu\n", (unsigned long long)(s->floor_ok && s->fl.present ?
										   s->fl.overrides : s->ver.overrides));
	header(o, "ccs_edge_route_ccs_enabled", "gauge", "1 when route CCs are configured.");
	fprintf(o, "ccs_edge_route_ccs_enabled %d\n", routes_enabled(cfg));
	if (routes_enabled(cfg) && (routes = routes_count(cfg)) >= 0) {
		header(o, "ccs_edge_route_ccs_routes", "gauge", "Routes of this agent's route CCs now.");
		fprintf(o, "ccs_edge_route_ccs_routes %ld\n", routes);
	}
	header(o, "ccs_edge_service_info", "gauge",
	       "A served port of the policy, with its name and switches (value 1).");
	for (i = 0; i < cfg->n_services; i++) {
		const struct service *sv = &cfg->services[i];

		fprintf(o, "ccs_edge_service_info{port=\"%u\",service=", sv->port);
		label_value(o, sv->name);
		fprintf(o, ",ab=\"%s\",caps=\"%s\",flow_mode=\"%s\"} 1\n", sv->ab ? "true" : "false",
			sv->caps ? "true" : "false",
			sv->flow_mode <= CCS_FLOW__MAX ? ccs_flow_mode_names[sv->flow_mode] : "unknown");
	}
}

static void print_log(FILE *o, const struct snapshot *s)
{
	if (!s->has_log)
		return;
	header(o, "ccs_edge_log_records_written_total", "counter",
	       "Transport log records written whole into a log file (all runs).");
	fprintf(o, "ccs_edge_log_records_written_total %llu\n", (unsigned long long)s->log.written);
	header(o, "ccs_edge_log_records_lost_total", "counter",
	       "Transport log records taken from the ring that no file holds (all runs).");
	fprintf(o, "ccs_edge_log_records_lost_total %llu\n", (unsigned long long)s->log.lost);
	header(o, "ccs_edge_log_write_errors_total", "counter",
	       "Failed file calls of the transport log (all runs).");
	fprintf(o, "ccs_edge_log_write_errors_total %llu\n", (unsigned long long)s->log.errors);
	header(o, "ccs_edge_log_degraded", "gauge",
	       "1 from a failed log file call until a write succeeds again.");
	fprintf(o, "ccs_edge_log_degraded %d\n", s->log.degraded ? 1 : 0);
	header(o, "ccs_edge_log_last_error_timestamp_seconds", "gauge",
	       "When the transport log last failed (Unix time; 0: never).");
	fprintf(o, "ccs_edge_log_last_error_timestamp_seconds %llu\n",
		(unsigned long long)s->log.last_error_unix);
}

static void print_metrics(const struct config *cfg, FILE *o)
{
	struct snapshot s;

	read_snapshot(cfg, &s);
	print_state(cfg, o, &s);
	print_tables(o, &s);
	if (s.maps) {
		print_counters(cfg, o, counter_metrics, s.cnt, CCS_CNT__MAX, s.svc, false);
		if (s.has_fcnt)
			print_counters(cfg, o, flow_metrics, s.fcnt, CCS_FCNT__MAX, s.svc, true);
	}
	print_log(o, &s);
	free(s.svc);
}

/* PATH written whole or not at all: a temporary file beside it (not *.prom, so node_exporter
 * never reads it half-written), then rename */
int metrics_write(const struct config *cfg, const char *path)
{
	char tmp[PATH_MAX + 16];
	const char *slash = strrchr(path, '/');
	FILE *o;
	int fd, err;

	if (snprintf(tmp, sizeof(tmp), "%.*s.%s.tmp", slash ? (int)(slash - path + 1) : 0, path,
		     slash ? slash + 1 : path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	o = fdopen(fd, "w");
	if (!o) {
		err = -errno;
		close(fd);
		unlink(tmp);
		return err;
	}
	print_metrics(cfg, o);
	err = ferror(o) ? -EIO : 0;
	if (fclose(o) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

int cmd_metrics(const struct config *cfg, const char *path)
{
	struct config named = *cfg;   /* the node named as run names it (translog.c) */
	int err;

	if (!named.node_id[0] && gethostname(named.node_id, sizeof(named.node_id) - 1))
		named.node_id[0] = 0;
	cfg = &named;
	if (!path) {
		print_metrics(cfg, stdout);
		return fflush(stdout) ? 1 : 0;
	}
	err = metrics_write(cfg, path);
	if (err)
		print_error("metrics %s: %s", path, strerror(-err));
	return err ? 1 : 0;
}

/* run's loop: rewrite metrics_file when due; a failure is said once until a write succeeds */
void metrics_tick(const struct config *cfg)
{
	static __u64 last;
	static bool failing;
	__u64 now = clock_ns(CLOCK_MONOTONIC);
	int err;

	if (!cfg->metrics_file[0] || (last && now - last < METRICS_INTERVAL_S * 1000000000ull))
		return;
	last = now;
	err = metrics_write(cfg, cfg->metrics_file);
	if (err && !failing)
		fprintf(stderr, "ccs-edge: metrics %s: %s (retrying every %d s)\n", cfg->metrics_file,
			strerror(-err), METRICS_INTERVAL_S);
	failing = err != 0;
}
