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
 *     load MANIFEST [--json] [--allow-downgrade [E:]V]
 *                                               verify, build a new index, swap it in; (epoch,
 *                                               version) only goes forward unless the manifest's
 *                                               is named: an explicit, logged override
 *     floor [--json]                            the version rule's floor (state_dir), no pin dir
 *     rollback                                  make the previous table live again (an override
 *                                               of the version rule when it is older: logged)
 *     status [--json]
 *     log --out DIR [--drain]                   write <DIR>/transport/<node>/<hour>.jsonl
 *     run --out DIR                             log + TTL watchdog until SIGTERM (+ metrics_file)
 *     metrics [FILE]                            Prometheus text format, to stdout or FILE (metrics.c)
 *
 * Everything lives in pinned objects under the pin dir (default /sys/fs/bpf/ccs): the cgroup
 * link and every map, so enforcement survives the agent exiting, crashing or restarting.
 *
 * This file: options, the config precedence (file, then options), command dispatch. agent.h
 * lists the others.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <bpf/libbpf.h>

#include "agent.h"

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
	{ "allow-downgrade", required_argument, NULL, 'D' },
	{ "help", no_argument, NULL, 'h' },
	{},
};

struct args {
	const char *config, *pin, *pubkey, *node, *cgroup, *out, *sample, *downgrade;
	bool json, drain, purge;
	int np;
	char *pos[4];  /* the command and its operands */
};

static void usage(void)
{
	fprintf(stderr,
		"usage: ccs-edge [--config FILE] [--pin-dir DIR] [--pubkey PEM] [--node-id ID] CMD\n"
		"  attach --cgroup PATH [--sample-rate R] | detach [--purge] | policy\n"
		"  load MANIFEST [--json] [--allow-downgrade [EPOCH:]VERSION] | rollback\n"
		"  status [--json] | floor [--json]\n"
		"  log --out DIR [--drain] | run [--out DIR] | metrics [FILE]\n");
}

static int libbpf_print_fn(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG && !getenv("CCS_EDGE_DEBUG"))
		return 0;
	return vfprintf(stderr, fmt, args);
}

/* options may come before or after the command; the first non-option is the command */
static int parse_options(int argc, char **argv, struct args *a)
{
	int c;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1 || optind < argc) {
		if (c == -1) {
			/* a non-option: keep it in place and carry on after it */
			optind++;
			continue;
		}
		switch (c) {
		case 'c': a->config = optarg; break;
		case 'p': a->pin = optarg; break;
		case 'k': a->pubkey = optarg; break;
		case 'n': a->node = optarg; break;
		case 'g': a->cgroup = optarg; break;
		case 's': a->sample = optarg; break;
		case 'o': a->out = optarg; break;
		case 'j': a->json = true; break;
		case 'd': a->drain = true; break;
		case 'P': a->purge = true; break;
		case 'D': a->downgrade = optarg; break;
		default: return -1;
		}
	}
	return 0;
}

/* the arguments that are neither options nor their values */
static void collect_positional(int argc, char **argv, struct args *a)
{
	const struct option *o;
	int i;

	for (i = 1; i < argc; i++) {
		const char *s = argv[i];
		bool takes = false;

		if (s[0] == '-' && s[1] == '-') {
			for (o = opts; o->name; o++)
				if (!strncmp(s + 2, o->name, strlen(o->name)) &&
				    s[2 + strlen(o->name)] == 0 && o->has_arg == required_argument)
					takes = true;
			if (takes)
				i++;
			continue;
		}
		if (s[0] == '-' && s[1])
			continue;
		if (a->np < 4)
			a->pos[a->np++] = argv[i];
	}
}

/* the config file, then the command-line options over it */
static int apply_settings(struct config *cfg, struct args *a)
{
	config_defaults(cfg);
	if (a->config && load_config(cfg, a->config))
		return -1;
	if (a->pin)
		snprintf(cfg->pin_dir, sizeof(cfg->pin_dir), "%s", a->pin);
	if (a->pubkey)
		snprintf(cfg->public_key, sizeof(cfg->public_key), "%s", a->pubkey);
	if (a->node) {
		if (check_node_id(a->node) || strlen(a->node) >= sizeof(cfg->node_id)) {
			print_error("--node-id \"%s\": printable, without '/', at most %zu bytes", a->node,
				sizeof(cfg->node_id) - 1);
			return -1;
		}
		snprintf(cfg->node_id, sizeof(cfg->node_id), "%s", a->node);
	}
	if (a->cgroup)
		snprintf(cfg->cgroup, sizeof(cfg->cgroup), "%s", a->cgroup);
	if (a->sample && parse_fraction_option("--sample-rate", a->sample, &cfg->sample_rate))
		return -1;
	if (!a->out && cfg->log_dir[0])
		a->out = cfg->log_dir;
	if (!cfg->state_dir[0]) {   /* the floor of the enforcer the pin dir names */
		const char *base = strrchr(cfg->pin_dir, '/');

		base = base && base[1] ? base + 1 : cfg->pin_dir;
		snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/var/lib/ccs-edge/%s", base);
	}
	return 0;
}

static int dispatch(const struct config *cfg, const struct args *a)
{
	const char *cmd = a->pos[0];

	if (!strcmp(cmd, "attach"))
		return cmd_attach(cfg);
	if (!strcmp(cmd, "detach"))
		return cmd_detach(cfg, a->purge);
	if (!strcmp(cmd, "policy"))
		return cmd_policy(cfg);
	if (!strcmp(cmd, "load")) {
		if (a->np < 2) {
			usage();
			return 2;
		}
		return cmd_load(cfg, a->pos[1], a->json, a->downgrade);
	}
	if (!strcmp(cmd, "floor"))
		return cmd_floor(cfg, a->json);
	if (!strcmp(cmd, "rollback"))
		return cmd_rollback(cfg);
	if (!strcmp(cmd, "status"))
		return cmd_status(cfg, a->json);
	if (!strcmp(cmd, "log"))
		return cmd_log(cfg, a->out, a->drain, false);
	if (!strcmp(cmd, "metrics"))
		return cmd_metrics(cfg, a->np > 1 ? a->pos[1] : NULL);
	if (!strcmp(cmd, "run"))
		return cmd_log(cfg, a->out, false, true);
	usage();
	return 2;
}

int main(int argc, char **argv)
{
	struct config cfg;   /* apply_settings fills it; each command gets it, read-only */
	struct args a = {};

	if (parse_options(argc, argv, &a)) {
		usage();
		return 2;
	}
	collect_positional(argc, argv, &a);
	if (a.np < 1) {
		usage();
		return 2;
	}
	if (apply_settings(&cfg, &a))
		return 1;
	libbpf_set_print(libbpf_print_fn);
	/* a pipe whose reader died (ip -batch, a closed stdout) is an error to report, not the end */
	signal(SIGPIPE, SIG_IGN);
	return dispatch(&cfg, &a);
}
