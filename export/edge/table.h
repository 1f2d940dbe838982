/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * table.h - what the load's and rollback's files share (agent.h is the agent's). A load goes
 * by step, one file each:
 *
 *   table_verify.c  verify: the config's caps, the .bin the manifest names, its sha256, header,
 *                   expiry, every entry and the flow tree (table_read)
 *   table_rule.c    the version rule against the floor (version_rule), the floor after a table
 *                   is made live (next_floor)
 *   table_index.c   build: the lookup index (a hash with prefix-length markers, ccs.h) and the
 *                   flow tree's map, nothing live yet (build_index, build_tree)
 *   table_slots.c   the pinned slots: read them (read_state), fill the idle one and flip
 *                   ccs_ctl.live (swap_in), the ccs_version copy of the floor (record_version)
 *   table.c         the commands: load (the steps in order) and rollback
 */
#ifndef CCS_AGENT_TABLE_H
#define CCS_AGENT_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "agent.h"

/* a verified table: the manifest's fields and the .bin they describe */
struct table {
	struct manifest man;
	unsigned char *bin;
	size_t len;
	unsigned char sha256[32];
	const struct ccs_table_header *h;
	const struct ccs_table_entry *ents;
	size_t n;
	const struct ccs_tree_node *nodes;  /* the flow tree, NULL if none */
	size_t n_nodes;
};

/* the pinned maps a load or rollback reads and writes */
struct slots {
	int ctl_fd;
	int meta_fd;
	int tables_fd;
	int model_fd;    /* -1 while the program attached predates ccs_model: then not recorded */
	int version_fd;  /* -1 while it predates ccs_version: the rule then stands on the slots */
	int trees_fd;    /* ccs_trees and ccs_flow: -1 while it predates the flow tree (a table */
	int flow_fd;     /*   with a tree is then refused; one without loads as before) */
	const char *pin_dir;  /* where they are pinned (the messages name it) */
};

/* what the slots hold now */
struct state {
	struct ccs_ctl ctl;
	struct ccs_meta meta[CCS_SLOTS];
	__u32 index_id[CCS_SLOTS];   /* map id of the index in ccs_tables[slot], 0 if none */
	bool ok[CCS_SLOTS];         /* slot_consistent() */
	struct ccs_version ver;
	__u64 floor;                /* the newest version the pinned maps saw made live here */
	struct floor fl;            /* the version rule's floor: the file (floor.c), else seeded from
				     * a pin dir older than it (epoch 0, `floor` above) */
	bool has_floor;             /* a table was made live here before (fl means something) */
};

enum rule { RULE_NEWER, RULE_SAME_TABLE, RULE_ALREADY_LIVE, RULE_OVERRIDE, RULE_REFUSED };

/* table_verify.c: the manifest (manifest.c), then the .bin beside it, verified; 0 with *t filled
 * (t->bin: the caller frees it), or -1 after printing why the table is refused */
int table_read(const struct config *cfg, const char *manifest_path, struct table *t, time_t now);

/* table_index.c: a new map, nothing live yet: its fd, or -1 after printing why */
int build_index(const struct table *t, struct ccs_meta *meta);
int build_tree(const struct table *t);

/* table_rule.c */
enum rule version_rule(const struct state *st, const struct table *t, const char *allow,
		       __u64 max_step);
void next_floor(const struct state *st, struct floor *f, __u64 epoch, __u64 version,
		const __u8 *sha256, bool override, const char *how, __u64 live_before);

/* table_slots.c: 0, or -1 after printing why */
int open_slots(const char *pin_dir, struct slots *s);
void close_slots(struct slots *s);
int read_state(const struct slots *s, const char *state_dir, struct state *st);
int live_slot(const struct state *st);
int settle_live(const struct slots *s, struct state *st);
int record_version(const struct slots *s, const struct floor *f);
int swap_in(const struct slots *s, const struct state *st, const struct table *t,
	    int index_fd, const struct ccs_meta *lens, int tree_fd, time_t now, __u32 *slotp);

#endif /* CCS_AGENT_TABLE_H */
