// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table.c - the commands load and rollback, their steps in order; table.h names the file of each.
 * load: the manifest (manifest.c), then the sha256 of the .bin, its header against the manifest,
 * the expiry and every entry (address space rule included) (table_verify.c); then the version rule
 * (table_rule.c) and the growth against the live table (check_growth); only then a new index (ccs.h: the lookup hash) is built (table_index.c), and the
 * idle slot is changed in an order a crash cannot make inconsistent (table_slots.c swap_in). The
 * previous table stays in the other slot: rollback flips back to it, if that slot is valid, was
 * made live (not a load killed before its flip) and its index is the one its meta describes.
 *
 * The flow tree (format 2, issue 27) travels the same way: checked with the entries (check_tree:
 * the refusals of table_format.validate_tree, in its words), built into a fresh node array, and
 * installed in ccs_trees[slot] (or the slot's old one removed) with its ccs_flow record while the
 * slot is marked invalid; the flip makes table and tree live together, and a rollback to a table
 * without a tree stops the tree's decisions with that same one-word flip.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <openssl/evp.h>

#include "table.h"

/*
 * load's answer when the table is the live one already: nothing swapped. A pin dir from before the
 * floor file gets its floor on disk now (so that a purge or reboot from here on keeps it); with
 * route CCs the live table's routes are written again (an agent restarted, or routes turned on
 * since it was loaded). 0, or -1 after printing which of the two failed.
 */
static int load_unchanged(const struct config *cfg, struct state *st, const struct table *t,
			  __u32 slot, time_t now, bool json)
{
	int err = 0;

	if (!st->fl.present) {
		st->fl.present = true;
		st->fl.updated_unix = st->fl.epoch_since_unix = (__u64)now;
		if (floor_write(cfg->state_dir, &st->fl))
			err = -1;
	}
	if (routes_enabled(cfg) && routes_sync(cfg, t->ents, t->n) < 0) {
		print_error("load: table %llu is live, but step 7 (write its route CCs) failed",
			(unsigned long long)t->man.version);
		err = -1;
	}
	if (json)
		printf("{\"loaded\": true, \"unchanged\": true, \"epoch\": %llu, \"version\": %llu, "
		       "\"slot\": %u, \"entries\": {\"v4\": %u, \"v6\": %u}}\n",
		       (unsigned long long)t->man.epoch, (unsigned long long)t->man.version,
		       slot, t->h->n_v4, t->h->n_v6);
	else
		printf("table %llu is already live (slot %u): nothing to do\n",
		       (unsigned long long)t->man.version, slot);
	return err;
}

/*
 * Growth against the live table (issue 58, export.guards.max_growth): entries and bytes at most
 * max_growth x the live table's, once the live one has growth_floor_entries. The live table's
 * bytes are those its header implies (entries and tree nodes: a checked .bin has no others).
 * An override (--allow-downgrade: an operator naming an older table to go back to) is not
 * judged: the way back stays open whatever the live table's size. 0, or -1 after printing why.
 */
static int check_growth(const struct config *cfg, const struct slots *s, const struct state *st,
			const struct table *t)
{
	int live = live_slot(st);
	const struct ccs_meta *m;
	struct ccs_flow flow = {};
	__u32 slot;
	__u64 n_live, nodes_live = 0, bytes_live;
	double by_entries, by_bytes;

	if (cfg->max_growth <= 0 || live < 0 || !st->ok[live])
		return 0;
	slot = (__u32)live;
	m = &st->meta[slot];
	n_live = (__u64)m->n_v4 + m->n_v6;
	if (!n_live || n_live < cfg->growth_floor_entries)
		return 0;
	if (s->flow_fd >= 0 && !bpf_map_lookup_elem(s->flow_fd, &slot, &flow) &&
	    flow.version == m->version && flow.loaded_unix == m->loaded_unix)
		nodes_live = flow.n_nodes;
	bytes_live = sizeof(struct ccs_table_header) + n_live * sizeof(struct ccs_table_entry) +
		     nodes_live * sizeof(struct ccs_tree_node);
	by_entries = (double)t->n / (double)n_live;
	by_bytes = (double)t->len / (double)bytes_live;
	if (by_entries > cfg->max_growth || by_bytes > cfg->max_growth) {
		print_error("refused: table %llu is %.2fx the live table %llu's entries (%zu against %llu) "
			"and %.2fx its bytes (%zu against %llu), over max_growth (%gx)",
			(unsigned long long)t->man.version, by_entries, (unsigned long long)m->version,
			t->n, (unsigned long long)n_live, by_bytes, t->len,
			(unsigned long long)bytes_live, cfg->max_growth);
		return -1;
	}
	return 0;
}

/* load's answer for a table made live: what was loaded, and (json) how long each step took */
static void print_loaded(const struct table *t, __u32 slot, bool override, bool json, __u64 t0,
			 __u64 t1, __u64 t2, __u64 t3, __u64 t4, int n_routes)
{
	if (json)
		printf("{\"loaded\": true, \"epoch\": %llu, \"version\": %llu, \"slot\": %u, \"override\": %s, "
		       "\"entries\": {\"v4\": %u, \"v6\": %u}, \"tree_nodes\": %zu, \"verify_ms\": %.3f, "
		       "\"build_ms\": %.3f, \"swap_us\": %.3f, \"total_ms\": %.3f, \"routes\": %d, "
		       "\"routes_ms\": %.3f}\n",
		       (unsigned long long)t->man.epoch, (unsigned long long)t->man.version, slot,
		       override ? "true" : "false", t->h->n_v4, t->h->n_v6, t->n_nodes, (t1 - t0) / 1e6,
		       (t2 - t1) / 1e6, (t3 - t2) / 1e3, (t3 - t0) / 1e6, n_routes,
		       t4 ? (t4 - t3) / 1e6 : 0.0);
	else
		printf("loaded table %llu (%u v4 + %u v6 entries) into slot %u\n",
		       (unsigned long long)t->man.version, t->h->n_v4, t->h->n_v6, slot);
}

int cmd_load(const struct config *cfg, const char *manifest_path, bool json,
	     const char *allow_downgrade)
{
	struct floor nf;
	int live;
	struct slots s = { -1, -1, -1, -1, -1, -1, -1 };
	struct state st;
	struct table t = {};
	__u64 t0, t1, t2, t3, t4 = 0;
	int n_routes = 0;
	int index_fd = -1, tree_fd = -1, lock_fd = -1, err = -1;
	struct ccs_meta lens = {};
	enum rule rule;
	__u32 slot = 0;
	time_t now = time(NULL);

	t0 = clock_ns(CLOCK_MONOTONIC);
	/* 1-3. the manifest's signature and fields, the .bin's sha256, header, expiry, entries */
	if (table_read(cfg, manifest_path, &t, now))
		goto cleanup;
	t1 = clock_ns(CLOCK_MONOTONIC);
	if (open_slots(cfg->pin_dir, &s))
		goto cleanup;
	if (t.n_nodes && s.trees_fd < 0) {
		print_error("refused: table %llu carries a flow tree, but the program attached under %s "
			"predates it (no ccs_trees): run `ccs-edge attach` first",
			(unsigned long long)t.man.version, cfg->pin_dir);
		goto cleanup;
	}
	lock_fd = lock_pin_dir(cfg->pin_dir);
	if (lock_fd < 0) {
		print_error("lock %s: %s", cfg->pin_dir, strerror(-lock_fd));
		goto cleanup;
	}
	/* 4. the version rule, against what the slots hold now */
	if (read_state(&s, cfg->state_dir, &st) || settle_live(&s, &st))
		goto cleanup;
	rule = version_rule(&st, &t, allow_downgrade, cfg->version_max_step);
	if (rule == RULE_REFUSED)
		goto cleanup;
	if (rule == RULE_ALREADY_LIVE) {
		slot = (__u32)live_slot(&st);
		err = load_unchanged(cfg, &st, &t, slot, now, json);
		goto cleanup;
	}
	/* 4b. growth against the live table (not for an operator's override) */
	if (rule != RULE_OVERRIDE && check_growth(cfg, &s, &st, &t))
		goto cleanup;
	/* 5. build the new lookup hash (nothing is live yet); 6. swap it in */
	index_fd = build_index(&t, &lens);
	if (index_fd < 0)
		goto cleanup;
	if (t.n_nodes) {
		tree_fd = build_tree(&t);
		if (tree_fd < 0)
			goto cleanup;
	}
	t2 = clock_ns(CLOCK_MONOTONIC);
	/* the floor on disk first: a crash after the flip must not leave it below the live table */
	live = live_slot(&st);
	next_floor(&st, &nf, t.man.epoch, t.man.version, t.sha256, rule == RULE_OVERRIDE,
		   "load --allow-downgrade", live >= 0 && st.ok[live] ? st.meta[live].version : 0);
	if (floor_write(cfg->state_dir, &nf)) {
		print_error("refused: table %llu not made live: the version floor could not be kept (%s)",
			(unsigned long long)t.man.version, cfg->state_dir);
		goto cleanup;
	}
	if (swap_in(&s, &st, &t, index_fd, &lens, tree_fd, now, &slot))
		goto cleanup;
	record_version(&s, &nf);
	t3 = clock_ns(CLOCK_MONOTONIC);
	err = 0;
	/* 7. route CCs for the new live table (routes.c): a head start only, so after the swap; a
	 * failure does not undo the swap (a missing route costs a switch in the program), but the
	 * load exits 1 naming the step */
	if (routes_enabled(cfg)) {
		n_routes = routes_sync(cfg, t.ents, t.n);
		t4 = clock_ns(CLOCK_MONOTONIC);
		if (n_routes < 0) {
			print_error("load: table %llu is live, but step 7 (write its route CCs) failed: the "
				"program switches the connections of the missing routes itself",
				(unsigned long long)t.man.version);
			err = -1;
		}
	}
	print_loaded(&t, slot, rule == RULE_OVERRIDE, json, t0, t1, t2, t3, t4, n_routes);
cleanup:
	if (index_fd >= 0)
		close(index_fd);
	if (tree_fd >= 0)
		close(tree_fd);
	close_slots(&s);
	if (lock_fd >= 0)
		close(lock_fd);
	free(t.bin);
	return err ? 1 : 0;
}

/*
 * Whether the slot rollback would make live may be: valid, holding the index (and the flow tree)
 * its meta describes, made live before (not a load killed before its flip), not expired. 0, or -1
 * after printing why not.
 */
static int rollback_target_ok(const struct slots *s, const struct state *st, __u32 prev)
{
	const struct ccs_meta *m = &st->meta[prev];
	struct ccs_flow flow = {};
	__u32 tree_id = 0;

	if (!m->valid) {
		print_error("rollback: no previous table (slot %u is empty, or a load changing it did not "
			"finish: its metadata is marked invalid)", prev);
		return -1;
	}
	if (!st->ok[prev]) {
		print_error("rollback: slot %u is inconsistent: its index (map id %u) is not the one its "
			"metadata describes (table %llu, map id %u); refusing", prev, st->index_id[prev],
			(unsigned long long)m->version, m->index_id);
		return -1;
	}
	if (m->valid == CCS_META_STAGED) {
		print_error("rollback: slot %u holds table %llu, whose load did not finish: it was never "
			"made live (killed between its metadata and the flip); refusing. Load it again "
			"to make it live", prev, (unsigned long long)m->version);
		return -1;
	}
	if (m->expires_mono_ns <= clock_ns(CLOCK_MONOTONIC)) {
		print_error("rollback: previous table %llu has expired", (unsigned long long)m->version);
		return -1;
	}
	/* the slot's flow tree must be the one its table's record names (or none, with none) */
	if (s->flow_fd >= 0 && !bpf_map_lookup_elem(s->flow_fd, &prev, &flow) &&
	    flow.version == m->version && flow.loaded_unix == m->loaded_unix &&
	    (slot_map_id(s->trees_fd, prev, &tree_id) || tree_id != flow.tree_id)) {
		print_error("rollback: slot %u is inconsistent: its flow tree (map id %u) is not the one "
			"its table's record names (map id %u); refusing", prev, tree_id, flow.tree_id);
		return -1;
	}
	return 0;
}

/*
 * Make the previous table live again: only a slot that is valid and holds the index its meta
 * describes (a load that died half-way left it invalid), and not expired. Going back to an older
 * version is the rollback's own override of the version rule: logged and recorded.
 */
int cmd_rollback(const struct config *cfg)
{
	struct slots s = { -1, -1, -1, -1, -1, -1, -1 };
	struct state st;
	struct ccs_ctl ctl;
	const struct ccs_meta *m;
	int lock_fd = -1, err = 1, live;
	__u32 zero = 0, prev;
	__u64 live_before;
	struct floor nf;
	bool override;

	if (open_slots(cfg->pin_dir, &s))
		goto cleanup;
	lock_fd = lock_pin_dir(cfg->pin_dir);
	if (lock_fd < 0) {
		print_error("lock %s: %s", cfg->pin_dir, strerror(-lock_fd));
		goto cleanup;
	}
	if (read_state(&s, cfg->state_dir, &st) || settle_live(&s, &st))
		goto cleanup;
	live = live_slot(&st);
	if (live < 0) {
		print_error("rollback: no live table");
		goto cleanup;
	}
	prev = (__u32)(live + 1) % CCS_SLOTS;
	m = &st.meta[prev];
	if (rollback_target_ok(&s, &st, prev))
		goto cleanup;
	live_before = st.ok[live] ? st.meta[live].version : 0;
	/* going back is the rollback's own override, unless the slot holds the floor's table; the
	 * floor on disk first (it does not move down: the override is counted) */
	override = !st.has_floor || m->version != st.fl.version ||
		   memcmp(m->sha256, st.fl.sha256, sizeof(m->sha256));
	next_floor(&st, &nf, st.fl.epoch, m->version, m->sha256, override, "rollback", live_before);
	if (override) {   /* the slot's epoch is not kept: the override names the floor's */
		nf.override_to_epoch = st.fl.epoch;
	}
	if (floor_write(cfg->state_dir, &nf)) {
		print_error("rollback: refused: the version floor could not be kept (%s)", cfg->state_dir);
		goto cleanup;
	}
	ctl = st.ctl;
	ctl.live = prev + 1;
	ctl.generation++;
	if (bpf_map_update_elem(s.ctl_fd, &zero, &ctl, BPF_ANY)) {
		print_error("rollback: swap (ccs_ctl): %s", strerror(errno));
		goto cleanup;
	}
	printf("rolled back to table %llu (slot %u)\n", (unsigned long long)m->version, prev);
	err = record_version(&s, &nf) ? 1 : 0;
	/* route CCs: the table rolled back from is not in memory here: its routes go, and the
	 * program switches every connection itself until the next load writes routes again. If
	 * they stay, they are stale: the rollback fails, naming the step */
	if (routes_enabled(cfg) && routes_flush(cfg)) {
		print_error("rollback: table %llu is live, but step 2 (flush the route CCs of table %llu) "
			"failed: its routes stay, stale, until a load or detach (the program corrects "
			"their connections' CCs)", (unsigned long long)m->version,
			(unsigned long long)live_before);
		err = 1;
	}
cleanup:
	close_slots(&s);
	if (lock_fd >= 0)
		close(lock_fd);
	return err;
}

