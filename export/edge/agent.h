/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * agent.h - what the ccs-edge agent's files share (not the kernel: that is ccs.h).
 *
 *   ccs.c       main: options, config precedence, command dispatch
 *   config.c    the edge YAML subset (infra/edge/edge.yaml) -> struct config, strictly
 *   util.c      messages, clocks, files, JSON strings, pinned objects, link state, pin-dir lock
 *   attach.c    attach / detach / policy (the only user of the skeleton)
 *   manifest.c  signature over the manifest bytes, then the manifest's fields (cJSON)
 *   table.c     load and rollback, by step (table.h: verify, the version rule, build the
 *               index, swap), one file each
 *   floor.c     the version rule's (epoch, version) floor, kept on disk (state_dir)
 *   routes.c    route CCs: the live table's CCs as routes (congctl), a head start for the program
 *   status.c    status [--json]
 *   translog.c  ring buffer -> JSONL transport log (rotated segments or hourly files), TTL
 *               watchdog (log, run)
 *   metrics.c   metrics [FILE]: counters and state in Prometheus's text format (run: metrics_file)
 */
#ifndef CCS_AGENT_H
#define CCS_AGENT_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ccs.h"

#define MAX_SERVICES 256
/* the largest table the format lets the agent take: the header, CCS_MAX_ENTRIES entries and a
 * full flow tree (the compiled bound on max_artifact_bytes) */
#define CCS_MAX_TABLE_BYTES (sizeof(struct ccs_table_header) + \
			     (__u64)CCS_MAX_ENTRIES * sizeof(struct ccs_table_entry) + \
			     (__u64)CCS_TREE_MAX_NODES * sizeof(struct ccs_tree_node))
_Static_assert(MAX_SERVICES < CCS_SVC_SLOTS, "a ccs_svc_counters slot per service id (1..MAX_SERVICES)");

struct service {
	unsigned port;
	char name[64];
	bool ab;
	bool caps;
	__u8 flow_mode;   /* enum ccs_flow_mode */
};

struct config {
	char node_id[128];
	char cgroup[PATH_MAX];
	char pin_dir[PATH_MAX];
	char public_key[PATH_MAX];
	char default_cc[16];
	char log_dir[PATH_MAX];
	int rotate_minutes;   /* transport log segments: a divisor of 60; 0 = hourly files */
	double sample_rate;
	int route_ccs;           /* route CCs (routes.c): ROUTE_CCS_AUTO (default), _ON or _OFF */
	char route_table[32];    /*   the routing table; "" = the agent's own (from pin_dir) */
	char route_spec[256];    /*   what each route says besides prefix, table, proto and congctl */
	char route_within[1024]; /*   comma-separated prefixes the routes are confined to; "" = all */
	char metrics_file[PATH_MAX]; /* run rewrites it (metrics.c): node_exporter's textfile; "" = off */
	char state_dir[PATH_MAX]; /* the version floor's folder (floor.c); default
				   * /var/lib/ccs-edge/<the pin dir's last component> */
	__u64 version_max_step;  /* the most a table's version may pass the floor's in one epoch */
	/*
	 * Caps on one table (issue 58; the deployment writes them from export.guards), each at most
	 * the compiled bound, which is also the default. A load over one is refused, naming the cap,
	 * and the live table stays (table_verify.c check_caps, table.c check_growth).
	 */
	__u64 max_entries;        /* n_v4 + n_v6 over it: refused (1..CCS_MAX_ENTRIES) */
	__u32 max_tree_nodes;     /* a flow tree of this many nodes or more: refused, as
				   * export.guards.max_tree_nodes (2..CCS_TREE_MAX_NODES + 1) */
	__u64 max_artifact_bytes; /* the .bin over it: refused before it is read (1..CCS_MAX_TABLE_BYTES) */
	double max_growth;        /* entries or bytes over max_growth x the live table's: refused;
				   * 0 (default) = not judged; else 1..1000 */
	__u64 growth_floor_entries; /* growth judged once the live table has this many entries */
	int n_services;
	struct service services[MAX_SERVICES];
};

enum { ROUTE_CCS_AUTO, ROUTE_CCS_ON, ROUTE_CCS_OFF };

/*
 * The settings: defaults, then the config file, then the command-line options, filled by main
 * (ccs.c) and passed, read-only, to what needs them: a command takes the whole config, a helper
 * the part it reads (a pin dir, a state dir, a key). No global: the one signal handler (translog.c)
 * only sets its stop flag.
 */

/* the fields of a verified manifest (ccs_table.h documents the format) */
struct manifest {
	__u64 format;
	__u64 epoch;         /* the deployment epoch (0 when the manifest has none: older tables) */
	__u64 version;
	__u64 created;
	__u64 expires;
	__u64 n_v4;
	__u64 n_v6;
	char model_version[CCS_MODEL_VERSION_MAX];
	char table[256];     /* file name, relative to the manifest */
	char sha256[65];     /* 64 lowercase hex */
	__u64 tree_nodes;    /* tree.nodes: the flow tree's node count, 0 = none */
	char tree_model[CCS_MODEL_VERSION_MAX]; /* tree.model */
};

/* the pinned link against the configured cgroup (util.c link_state) */
struct link_state {
	int fd;             /* the pinned link, -1 if none (the caller closes it) */
	__u32 link_id;
	__u32 prog_id;
	__u64 cgroup_id;    /* the link's cgroup; 0 once that cgroup was removed (severed) */
	__u64 path_id;      /* the id of the configured cgroup as it is now; 0 if unset or missing */
	const char *state;  /* "ok", "none", "severed", "elsewhere", "unreadable" */
	bool attached;      /* state "ok": the program runs for the configured cgroup */
};

/*
 * The version rule's floor (floor.c): the newest (epoch, version) made live here and its table's
 * sha256, the epoch's start, and the overrides (older tables made live on purpose), on disk.
 */
struct floor {
	bool present;            /* the file exists (else: no table was made live here since) */
	__u64 epoch;
	__u64 version;
	__u8 sha256[32];
	__u64 updated_unix;
	__u64 epoch_since_unix;  /* when this agent first made a table of `epoch` live */
	__u64 overrides;
	__u64 override_unix;
	__u64 override_from_epoch, override_from;
	__u64 override_to_epoch, override_to;
};

/* floor.c: 0 (f->present says whether there is one), or -1 after printing why */
int floor_path(const char *state_dir, char *buf, size_t n);
int floor_read(const char *state_dir, struct floor *f);
int floor_write(const char *state_dir, const struct floor *f);

/* config.c: the defaults; the file over them (0, or -1 after printing where and why) */
void config_defaults(struct config *cfg);
int load_config(struct config *cfg, const char *path);

/* routes.c (what the namespace can carry is read once per process, for the first cfg given) */
bool routes_enabled(const struct config *cfg);
int routes_sync(const struct config *cfg, const struct ccs_table_entry *ents, size_t n);
int routes_flush(const struct config *cfg);
long routes_count(const struct config *cfg);
__u32 routes_mark(const struct config *cfg);
const char *routes_why(const struct config *cfg);
const char *routes_table(const struct config *cfg);
const char *routes_within(const struct config *cfg);
int routes_check_within(const char *list, char *why, size_t why_n);
int parse_fraction_option(const char *what, const char *v, double *out);
int check_node_id(const char *v);

/* util.c */
/* prints "ccs-edge: <message>" on stderr and returns: it never exits; the caller returns its error */
void print_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t clock_ns(clockid_t id);
void hex(const unsigned char *b, size_t n, char *out);
void json_str(FILE *o, const char *s);
int json_escape(char *out, size_t n, const char *s);
__u64 cgroup_id_of(const char *path);
void link_state(const struct config *cfg, struct link_state *ls);
int read_file(const char *path, unsigned char **buf, size_t *len);
int pin_path(const char *pin_dir, char *buf, size_t n, const char *name);
int open_pinned(const char *pin_dir, const char *name);
int lock_pin_dir(const char *pin_dir);

/* manifest.c: 0 with *m filled, or -1 after printing why the manifest is refused */
int manifest_read(const char *public_key, const char *path, struct manifest *m);

/* table.c: the map id of the inner map in ccs_tables[slot] or ccs_trees[slot]; whether a slot's meta
 * describes its index */
int slot_map_id(int tables_fd, __u32 slot, __u32 *id);
bool slot_consistent(const struct ccs_meta *m, __u32 index_id);

/* the commands; each returns the process exit status */
int cmd_attach(const struct config *cfg);
int cmd_detach(const struct config *cfg, bool purge);
int cmd_policy(const struct config *cfg);
/* allow_downgrade: NULL, or the table the operator names (load --allow-downgrade [EPOCH:]VERSION) */
int cmd_load(const struct config *cfg, const char *manifest_path, bool json,
	     const char *allow_downgrade);
int cmd_floor(const struct config *cfg, bool json);
int cmd_rollback(const struct config *cfg);
int cmd_status(const struct config *cfg, bool json);
int cmd_log(const struct config *cfg, const char *out, bool drain, bool watch);
int cmd_metrics(const struct config *cfg, const char *path);

/* metrics.c: run's loop calls it; it rewrites cfg->metrics_file when due */
void metrics_tick(const struct config *cfg);

#endif /* CCS_AGENT_H */
