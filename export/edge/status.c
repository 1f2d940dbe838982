// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * status.c - status [--json]: attached? (the pinned link checked against the configured cgroup
 * as it is now), the program's id and run stats, the version rule's floor and overrides, the live
 * and the previous table (version, model version, age, expiry, expired, enforced, entries,
 * sha256, its flow tree), each slot's state and every counter summed over the CPUs (the decision
 * sources and tree counts of ccs_flow_counters beside ccs_counters'). Without --json a line, then
 * the same JSON object. Every string is JSON-escaped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "agent.h"

/*
 * model: the slot's ccs_model entry, NULL if none (model_version null unless it is this table's).
 * enforcing: the slot is live and the program is attached to the configured cgroup.
 */
static void print_meta(FILE *o, const struct ccs_meta *m, const struct ccs_model *model,
		       const struct ccs_flow *flow, __u32 slot, bool enforcing)
{
	__u64 now_mono = clock_ns(CLOCK_MONOTONIC);
	time_t now = time(NULL);
	char sha[65], mv[CCS_MODEL_VERSION_MAX];
	bool expired = now_mono >= m->expires_mono_ns;
	/* seconds left, without wrapping: a saturated expiry (U64_MAX) is far ahead, not behind */
	double left = m->expires_mono_ns >= now_mono ? (double)(m->expires_mono_ns - now_mono) / 1e9
						     : -((double)(now_mono - m->expires_mono_ns) / 1e9);

	hex(m->sha256, 32, sha);
	fprintf(o, "{\"version\": %llu, \"model_version\": ", (unsigned long long)m->version);
	if (model && model->version == m->version && model->loaded_unix == m->loaded_unix) {
		snprintf(mv, sizeof(mv), "%.*s", (int)sizeof(mv) - 1, model->model_version);
		json_str(o, mv);
	} else {
		fprintf(o, "null");
	}
	fprintf(o, ", \"slot\": %u, \"created\": %llu, \"expires\": %llu, "
		"\"loaded\": %llu, \"age_s\": %lld, \"expires_in_s\": %.3f, \"expired\": %s, "
		"\"enforced\": %s, \"entries\": {\"v4\": %u, \"v6\": %u}, \"sha256\": \"%s\"",
		slot, (unsigned long long)m->created_unix,
		(unsigned long long)m->expires_unix, (unsigned long long)m->loaded_unix,
		(long long)now - (long long)m->created_unix,
		left, expired ? "true" : "false", enforcing && !expired ? "true" : "false", m->n_v4,
		m->n_v6, sha);
	/* "tree": the slot's flow tree, null if it has none (or its record is another table's) */
	if (flow && flow->version == m->version && flow->loaded_unix == m->loaded_unix &&
	    flow->n_nodes) {
		snprintf(mv, sizeof(mv), "%.*s", (int)sizeof(mv) - 1, flow->model);
		fprintf(o, ", \"tree\": {\"model\": ");
		json_str(o, mv);
		fprintf(o, ", \"nodes\": %u, \"min_purity_permille\": %u, \"min_leaf_permille\": %u, \"map_id\": %u}",
			flow->n_nodes, flow->min_purity_permille, flow->min_leaf_permille, flow->tree_id);
	} else {
		fprintf(o, ", \"tree\": null");
	}
	fprintf(o, "}");
}

/* the program's run stats (bpf_stats) */
static void prog_info(__u32 prog_id, struct bpf_prog_info *pinfo)
{
	__u32 ilen = sizeof(*pinfo);
	int prog_fd;

	if (!prog_id)
		return;
	prog_fd = bpf_prog_get_fd_by_id(prog_id);
	if (prog_fd < 0)
		return;
	bpf_obj_get_info_by_fd(prog_fd, pinfo, &ilen);
	close(prog_fd);
}

/*
 * "slot_state" of a slot: empty, ok, incomplete (a load did not finish: marked invalid, or staged
 * and never made live), inconsistent
 */
static const char *slot_state(const struct ccs_meta *m, __u32 index_id, bool live)
{
	if (!m->valid)
		return m->version || index_id ? "incomplete" : "empty";
	if (m->valid == CCS_META_STAGED && !live)
		return "incomplete";
	return slot_consistent(m, index_id) ? "ok" : "inconsistent";
}

/*
 * "log": the transport log's ledger (ccs_log, kept by the agent writing the log): records written
 * whole, lost, failed file calls, degraded (from a failure until a write succeeds again) and the
 * last failure; null with a pin dir from before it.
 */
static void print_log(FILE *o, const struct ccs_log_state *l)
{
	char what[sizeof(l->last_op) + 1];

	if (!l) {
		fprintf(o, "\"log\": null, ");
		return;
	}
	fprintf(o, "\"log\": {\"written\": %llu, \"lost\": %llu, \"errors\": %llu, \"degraded\": %s, "
		"\"last_error\": ", (unsigned long long)l->written, (unsigned long long)l->lost,
		(unsigned long long)l->errors, l->degraded ? "true" : "false");
	if (l->errors) {
		snprintf(what, sizeof(what), "%.*s", (int)sizeof(l->last_op), l->last_op);
		fprintf(o, "{\"at\": %llu, \"what\": ", (unsigned long long)l->last_error_unix);
		json_str(o, what);
		fprintf(o, ", \"error\": ");
		json_str(o, strerror(l->last_errno));
		fprintf(o, "}");
	} else {
		fprintf(o, "null");
	}
	fprintf(o, "}, ");
}

/*
 * "counters": {name: sum over the CPUs, ...}, then the log's ledger as log_written, log_lost,
 * log_errors (so that log_emitted = log_written + log_lost once the agent has drained the ring);
 * vals has room for ncpu values
 */
static void print_counters(FILE *o, int cnt_fd, int fcnt_fd, __u64 *vals, int ncpu,
			   const struct ccs_log_state *l)
{
	__u64 total;
	__u32 k;
	int c;

	fprintf(o, "\"counters\": {");
	for (k = 0; k < CCS_CNT__MAX; k++) {
		total = 0;
		if (!bpf_map_lookup_elem(cnt_fd, &k, vals))
			for (c = 0; c < ncpu; c++)
				total += vals[c];
		fprintf(o, "%s\"%s\": %llu", k ? ", " : "", ccs_counter_names[k],
			(unsigned long long)total);
	}
	for (k = 0; fcnt_fd >= 0 && k < CCS_FCNT__MAX; k++) {
		total = 0;
		if (!bpf_map_lookup_elem(fcnt_fd, &k, vals))
			for (c = 0; c < ncpu; c++)
				total += vals[c];
		fprintf(o, ", \"%s\": %llu", ccs_flow_counter_names[k], (unsigned long long)total);
	}
	if (l)
		fprintf(o, ", \"log_written\": %llu, \"log_lost\": %llu, \"log_errors\": %llu",
			(unsigned long long)l->written, (unsigned long long)l->lost,
			(unsigned long long)l->errors);
	fprintf(o, "}");
}

/* the pinned maps status reads (-1: not pinned; a program from before the map) */
struct status_maps {
	int ctl, meta, cnt, tables, model, version, flow, fcnt, log;
};

static void open_status_maps(const char *pin, struct status_maps *m)
{
	m->ctl = open_pinned(pin, "ccs_ctl");
	m->meta = open_pinned(pin, "ccs_meta");
	m->cnt = open_pinned(pin, "ccs_counters");
	m->tables = open_pinned(pin, "ccs_tables");
	m->model = open_pinned(pin, "ccs_model");
	m->version = open_pinned(pin, "ccs_version");
	m->flow = open_pinned(pin, "ccs_flow");
	m->fcnt = open_pinned(pin, "ccs_flow_counters");
	m->log = open_pinned(pin, "ccs_log");
}

static void close_status_maps(struct status_maps *m)
{
	int *fds[] = { &m->ctl, &m->meta, &m->cnt, &m->tables, &m->model, &m->version, &m->flow,
		       &m->fcnt, &m->log };
	size_t i;

	for (i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (*fds[i] >= 0)
			close(*fds[i]);
}

/* what status shows of the slots, the version floor and the transport log */
struct status_view {
	int live;                       /* the live slot, -1 if none */
	struct ccs_ctl ctl;
	struct ccs_meta meta[CCS_SLOTS];
	__u32 index_id[CCS_SLOTS];
	bool ok[CCS_SLOTS];             /* slot_consistent() */
	struct ccs_model model[CCS_SLOTS];
	bool has_model[CCS_SLOTS];
	struct ccs_flow flow[CCS_SLOTS];
	bool has_flow[CCS_SLOTS];
	struct ccs_version ver;
	struct ccs_log_state logst;
	bool has_log;
	__u64 floor, floor_epoch;       /* the version rule's floor */
	struct floor fl;                /* the floor file (floor.c) */
	bool fl_ok;                     /* it could be read (absent is fine; damaged is not) */
};

static void read_status_view(const char *state_dir, const struct status_maps *m,
			     struct status_view *v)
{
	__u32 zero = 0, slot;

	v->live = -1;
	bpf_map_lookup_elem(m->ctl, &zero, &v->ctl);
	if (v->ctl.live >= 1 && v->ctl.live <= CCS_SLOTS)
		v->live = v->ctl.live - 1;
	for (slot = 0; slot < CCS_SLOTS; slot++) {
		bpf_map_lookup_elem(m->meta, &slot, &v->meta[slot]);
		if (m->tables >= 0)
			slot_map_id(m->tables, slot, &v->index_id[slot]);
		v->ok[slot] = slot_consistent(&v->meta[slot], v->index_id[slot]);
		v->has_model[slot] = m->model >= 0 &&
				     !bpf_map_lookup_elem(m->model, &slot, &v->model[slot]);
		v->has_flow[slot] = m->flow >= 0 && !bpf_map_lookup_elem(m->flow, &slot, &v->flow[slot]);
	}
	if (m->version >= 0)
		bpf_map_lookup_elem(m->version, &zero, &v->ver);
	v->has_log = m->log >= 0 && !bpf_map_lookup_elem(m->log, &zero, &v->logst);
	v->floor = v->ver.highest;
	for (slot = 0; slot < CCS_SLOTS; slot++)
		if (v->ok[slot] && v->meta[slot].version > v->floor)
			v->floor = v->meta[slot].version;
	/* the version rule's floor is the file (floor.c) once there is one; a damaged one is shown
	 * as null (every load refuses, naming the file) */
	v->fl_ok = !floor_read(state_dir, &v->fl);
	if (v->fl_ok && v->fl.present) {
		v->floor = v->fl.version;
		v->floor_epoch = v->fl.epoch;
		v->ver.overrides = v->fl.overrides;
		v->ver.override_unix = v->fl.override_unix;
		v->ver.override_from = v->fl.override_from;
		v->ver.override_to = v->fl.override_to;
	}
}

/* "version_floor", "epoch_floor", "version_max_step", "overrides" */
static void print_versions(FILE *o, const struct status_view *v, __u64 version_max_step)
{
	const struct floor *fl = &v->fl;

	if (v->fl_ok)
		fprintf(o, "\"version_floor\": %llu, \"epoch_floor\": %llu, ",
			(unsigned long long)v->floor, (unsigned long long)v->floor_epoch);
	else
		fprintf(o, "\"version_floor\": null, \"epoch_floor\": null, ");
	fprintf(o, "\"version_max_step\": %llu, \"overrides\": {\"count\": %llu, \"last\": ",
		(unsigned long long)version_max_step, (unsigned long long)v->ver.overrides);
	if (v->ver.overrides && v->fl_ok && fl->present)
		fprintf(o, "{\"at\": %llu, \"from_epoch\": %llu, \"from\": %llu, \"to_epoch\": "
			"%llu, \"to\": %llu}", (unsigned long long)fl->override_unix,
			(unsigned long long)fl->override_from_epoch, (unsigned long long)fl->override_from,
			(unsigned long long)fl->override_to_epoch, (unsigned long long)fl->override_to);
	else if (v->ver.overrides)
		fprintf(o, "{\"at\": %llu, \"from\": %llu, \"to\": %llu}",
			(unsigned long long)v->ver.override_unix, (unsigned long long)v->ver.override_from,
			(unsigned long long)v->ver.override_to);
	else
		fprintf(o, "null");
	fprintf(o, "}, ");
}

/* "table" (the live slot's), "previous" (rollback's target), "slot_state" */
static void print_slots(FILE *o, const struct status_view *v, bool attached)
{
	int live = v->live;
	__u32 slot;

	fprintf(o, "\"table\": ");
	if (live >= 0 && v->ok[live])
		print_meta(o, &v->meta[live], v->has_model[live] ? &v->model[live] : NULL,
			   v->has_flow[live] ? &v->flow[live] : NULL, live, attached);
	else
		fprintf(o, "null");
	fprintf(o, ", \"previous\": ");
	slot = live >= 0 ? (__u32)(live + 1) % CCS_SLOTS : 0;
	if (live >= 0 && v->ok[slot] && v->meta[slot].valid != CCS_META_STAGED)   /* rollback's target */
		print_meta(o, &v->meta[slot], v->has_model[slot] ? &v->model[slot] : NULL,
			   v->has_flow[slot] ? &v->flow[slot] : NULL, slot, false);
	else
		fprintf(o, "null");
	fprintf(o, ", \"slot_state\": [\"%s\", \"%s\"], ",
		slot_state(&v->meta[0], v->index_id[0], live == 0),
		slot_state(&v->meta[1], v->index_id[1], live == 1));
}

/* route CCs (routes.c): off, or the table, the prefixes and the routes of ours now; and why
 * they are off, or off for one family ("" when on for both) */
static void print_routes(FILE *o, const struct config *cfg)
{
	if (routes_enabled(cfg)) {
		fprintf(o, "\"route_ccs\": {\"table\": ");
		json_str(o, routes_table(cfg));
		fprintf(o, ", \"within\": ");
		json_str(o, routes_within(cfg));
		fprintf(o, ", \"routes\": %ld, \"mark\": %u}, ", routes_count(cfg), routes_mark(cfg));
	} else {
		fprintf(o, "\"route_ccs\": null, ");
	}
	fprintf(o, "\"route_ccs_off\": ");
	json_str(o, routes_why(cfg));
	fprintf(o, ", ");
}

int cmd_status(const struct config *cfg, bool json)
{
	struct status_maps m;
	struct status_view v = {};
	struct link_state ls = { .fd = -1 };
	struct bpf_prog_info pinfo = {};
	int ncpu = libbpf_num_possible_cpus(), err = 1;
	__u64 *vals = NULL;
	FILE *o = stdout;

	open_status_maps(cfg->pin_dir, &m);
	if (m.ctl < 0 || m.meta < 0 || m.cnt < 0) {
		if (json) {
			printf("{\"attached\": false, \"link\": \"none\", \"pin_dir\": ");
			json_str(o, cfg->pin_dir);
			printf(", \"table\": null}\n");
		} else {
			printf("not attached (no maps under %s)\n", cfg->pin_dir);
		}
		err = json ? 0 : 1;
		goto cleanup;
	}
	read_status_view(cfg->state_dir, &m, &v);
	link_state(cfg, &ls);
	prog_info(ls.prog_id, &pinfo);
	vals = calloc(ncpu, sizeof(__u64));
	if (!vals)
		goto cleanup;
	if (!json)
		printf("attached: %s (link %s)  pin dir %s  generation %u%s\n",
		       ls.attached ? "yes" : "no", ls.state, cfg->pin_dir, v.ctl.generation,
		       v.has_log && v.logst.degraded ? "  transport log DEGRADED (records lost: see \"log\")" : "");
	/*
	 * attached: the pinned link runs the program for the configured cgroup as it is now (its id
	 * is the link's). link: ok, none, severed (the link's cgroup was removed: recreating the
	 * directory does not bring it back; `attach` makes a new link), elsewhere (another cgroup).
	 */
	fprintf(o, "{\"attached\": %s, \"link\": \"%s\", \"pin_dir\": ", ls.attached ? "true" : "false",
		ls.state);
	json_str(o, cfg->pin_dir);
	fprintf(o, ", \"cgroup\": ");
	if (cfg->cgroup[0])
		json_str(o, cfg->cgroup);
	else
		fprintf(o, "null");
	fprintf(o, ", \"cgroup_path_id\": %llu, \"node_id\": ", (unsigned long long)ls.path_id);
	json_str(o, cfg->node_id);
	fprintf(o, ", \"default_cc\": ");
	json_str(o, cfg->default_cc);
	fprintf(o, ", \"generation\": %u, \"link_id\": %u, \"prog_id\": %u, \"cgroup_id\": %llu, "
		"\"run_cnt\": %llu, \"run_time_ns\": %llu, ", v.ctl.generation, ls.link_id, ls.prog_id,
		(unsigned long long)ls.cgroup_id, (unsigned long long)pinfo.run_cnt,
		(unsigned long long)pinfo.run_time_ns);
	print_versions(o, &v, cfg->version_max_step);
	/* the caps a load is held to (issue 58): the config's, else the compiled bounds */
	fprintf(o, "\"caps\": {\"max_entries\": %llu, \"max_tree_nodes\": %u, \"max_artifact_bytes\": "
		"%llu, \"max_growth\": %g, \"growth_floor_entries\": %llu}, ",
		(unsigned long long)cfg->max_entries, cfg->max_tree_nodes,
		(unsigned long long)cfg->max_artifact_bytes, cfg->max_growth,
		(unsigned long long)cfg->growth_floor_entries);
	print_slots(o, &v, ls.attached);
	print_routes(o, cfg);
	print_log(o, v.has_log ? &v.logst : NULL);
	print_counters(o, m.cnt, m.fcnt, vals, ncpu, v.has_log ? &v.logst : NULL);
	fprintf(o, "}\n");
	err = 0;
cleanup:
	free(vals);
	if (ls.fd >= 0)
		close(ls.fd);
	close_status_maps(&m);
	return err;
}
