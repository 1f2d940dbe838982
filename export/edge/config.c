// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * config.c - the edge config: the flat YAML subset of infra/edge/edge.yaml, read strictly.
 *
 *   key: value                top level, at column 0; each key at most once
 *   services:                 then one item per line: `- {port: 443, name: video, ab: true}`
 *                             (keys port, name, ab, caps, flow_mode: off|fill|combine|flow|prior)
 *   # comment                 from a '#' at the start of a line or after a blank
 *
 * Values are plain scalars, or 'single' / "double" quoted (\" and \\ escapes). Whatever the
 * reader does not understand is an error naming the file and line, never a silent default:
 * unknown or repeated keys, a number with anything after it (`443x`, `1%`), a number out of
 * range, a boolean that is not one of YAML's (true/false, yes/no, on/off, in any of their
 * three spellings), more than MAX_SERVICES services, two services on one port, a line longer
 * than the reader takes, a string too long for its field, a rotate_minutes that does not divide
 * the hour.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

/* the settings before the config file and the options: these, everything else 0 or "" */
void config_defaults(struct config *cfg)
{
	static const struct config defaults = {
		.pin_dir = "/sys/fs/bpf/ccs",
		.default_cc = "",
		.sample_rate = 0.01,
		.rotate_minutes = 1,
		.version_max_step = CCS_VERSION_MAX_STEP,
		.max_entries = CCS_MAX_ENTRIES,
		.max_tree_nodes = CCS_TREE_MAX_NODES + 1,
		.max_artifact_bytes = CCS_MAX_TABLE_BYTES,
	};

	*cfg = defaults;
}

#define MAX_LINE 4096

/* where we are, for the messages */
struct pos {
	const char *path;
	int line;
};

#define cfg_err(p, fmt, ...) print_error("config %s:%d: " fmt, (p)->path, (p)->line, ##__VA_ARGS__)

static const char *const top_keys[] = {
	"node_id", "cgroup", "pin_dir", "public_key", "default_cc", "sample_rate", "log_dir",
	"rotate_minutes", "route_ccs", "route_table", "route_spec", "route_within", "metrics_file", "state_dir",
	"version_max_step", "max_entries", "max_tree_nodes", "max_artifact_bytes", "max_growth",
	"growth_floor_entries", "services", NULL,
};
static const char *const service_keys[] = { "port", "name", "ab", "caps", "flow_mode", NULL };

static int key_index(const char *const *keys, const char *k)
{
	int i;

	for (i = 0; keys[i]; i++)
		if (!strcmp(keys[i], k))
			return i;
	return -1;
}

static const char *skip_blank(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

/*
 * One scalar at *sp, ending at a character of `stops` (or the end of the line) when plain;
 * written to out (n bytes). *sp is left after it (after the closing quote when quoted).
 */
static int read_scalar(const struct pos *p, const char **sp, const char *stops, char *out,
		       size_t n)
{
	const char *s = skip_blank(*sp);
	size_t k = 0;

	if (*s == '"' || *s == '\'') {
		char q = *s++;

		for (;; s++) {
			char c = *s;

			if (!c) {
				cfg_err(p, "unterminated %s-quoted string", q == '"' ? "double" : "single");
				return -1;
			}
			if (c == q) {
				if (q == '\'' && s[1] == '\'') { /* '' is a quote in single quotes */
					s++;
				} else {
					s++;
					break;
				}
			} else if (q == '"' && c == '\\') {
				c = *++s;
				if (c != '"' && c != '\\' && c != '/') {
					cfg_err(p, "unsupported escape \\%c in a double-quoted string",
						c ? c : '0');
					return -1;
				}
			}
			if ((unsigned char)c < 0x20) {
				cfg_err(p, "control character in a string");
				return -1;
			}
			if (k + 1 >= n) {
				cfg_err(p, "value longer than %zu bytes", n - 1);
				return -1;
			}
			out[k++] = c;
		}
	} else {
		const char *e = s;

		while (*e && !strchr(stops, *e))
			e++;
		while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		for (; s < e; s++) {
			if ((unsigned char)*s < 0x20 && *s != '\t') {
				cfg_err(p, "control character in a value");
				return -1;
			}
			if (k + 1 >= n) {
				cfg_err(p, "value longer than %zu bytes", n - 1);
				return -1;
			}
			out[k++] = *s;
		}
		s = e;
	}
	out[k] = 0;
	*sp = s;
	return 0;
}

/* an unsigned decimal integer and nothing else, in lo..hi */
static int parse_uint(const struct pos *p, const char *what, const char *v, unsigned long lo,
		      unsigned long hi, unsigned long *out)
{
	const char *s = v;
	unsigned long x = 0;

	if (!*s) {
		cfg_err(p, "%s: empty, expected an integer", what);
		return -1;
	}
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s)) {
			cfg_err(p, "%s: \"%s\" is not an integer (unexpected \"%s\")", what, v, s);
			return -1;
		}
		x = x * 10 + (unsigned long)(*s - '0');
		if (x > hi)
			break;
	}
	if (x < lo || x > hi) {
		cfg_err(p, "%s: %s is out of range %lu..%lu", what, v, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

/*
 * A real number and nothing else ("0.01", "1", "1e-05"), finite, in lo..hi. `p` may be NULL
 * (a command-line option): then the message names `what` only.
 */
static int parse_real(const struct pos *p, const char *what, const char *v, double lo, double hi,
	       double *out)
{
	const char *s;
	char *end;
	double x;

	for (s = v; *s; s++)
		if (!strchr("0123456789.eE+-", *s))
			break;
	errno = 0;
	x = *v ? strtod(v, &end) : 0;
	if (!*v || *s || *end || errno || !isfinite(x)) {
		if (p)
			cfg_err(p, "%s: \"%s\" is not a number%s", what, v,
				strchr(v, '%') ? " (a fraction 0..1, not a percentage)" : "");
		else
			print_error("%s: \"%s\" is not a number%s", what, v,
				strchr(v, '%') ? " (a fraction 0..1, not a percentage)" : "");
		return -1;
	}
	if (x < lo || x > hi) {
		if (p)
			cfg_err(p, "%s: %s is out of range %g..%g", what, v, lo, hi);
		else
			print_error("%s: %s is out of range %g..%g", what, v, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

/* --sample-rate R: the same rule as the config's sample_rate */
int parse_fraction_option(const char *what, const char *v, double *out)
{
	return parse_real(NULL, what, v, 0.0, 1.0, out);
}

/* YAML 1.1 booleans (what PyYAML's safe_load reads as bool), nothing else */
static int parse_bool(const struct pos *p, const char *what, const char *v, bool *out)
{
	static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On",
					   "ON", NULL };
	static const char *const no[] = { "false", "False", "FALSE", "no", "No", "NO", "off", "Off",
					  "OFF", NULL };
	int i;

	for (i = 0; yes[i]; i++)
		if (!strcmp(v, yes[i]))
			return *out = true, 0;
	for (i = 0; no[i]; i++)
		if (!strcmp(v, no[i]))
			return *out = false, 0;
	cfg_err(p, "%s: \"%s\" is not a boolean (true or false)", what, v);
	return -1;
}

/* a node id names a directory of the transport log: printable, no '/', not "." or ".." */
int check_node_id(const char *v)
{
	const unsigned char *s;

	if (!*v || !strcmp(v, ".") || !strcmp(v, ".."))
		return -1;
	for (s = (const unsigned char *)v; *s; s++)
		if (*s < 0x20 || *s == 0x7f || *s == '/')
			return -1;
	return 0;
}

/* `{port: N, name: x, ab: bool, caps: bool}` (after the '-') -> the next service */
static int parse_service(struct config *cfg, const struct pos *p, const char *s)
{
	struct service *svc;
	bool seen[5] = {};
	char key[64], val[256];
	unsigned long port;
	int i, k;

	if (cfg->n_services >= MAX_SERVICES) {
		cfg_err(p, "more than %d services", MAX_SERVICES);
		return -1;
	}
	s = skip_blank(s);
	if (*s != '{') {
		cfg_err(p, "a service must be a one-line flow mapping {port: N, ...}");
		return -1;
	}
	svc = &cfg->services[cfg->n_services];
	memset(svc, 0, sizeof(*svc));
	s = skip_blank(s + 1);
	while (*s != '}') {
		if (read_scalar(p, &s, ":,}", key, sizeof(key)))
			return -1;
		s = skip_blank(s);
		if (*s != ':') {
			cfg_err(p, "expected key: value in the service mapping, got \"%s\"", key);
			return -1;
		}
		k = key_index(service_keys, key);
		if (k < 0) {
			cfg_err(p, "unknown service key \"%s\" (known: port, name, ab, caps, flow_mode)",
				key);
			return -1;
		}
		if (seen[k]) {
			cfg_err(p, "service key \"%s\" given twice", key);
			return -1;
		}
		seen[k] = true;
		s++;
		if (read_scalar(p, &s, ",}", val, sizeof(val)))
			return -1;
		if (k == 0) {
			if (parse_uint(p, "port", val, 1, 65535, &port))
				return -1;
			svc->port = (unsigned)port;
		} else if (k == 1) {
			if (strlen(val) >= sizeof(svc->name)) {
				cfg_err(p, "service name longer than %zu bytes", sizeof(svc->name) - 1);
				return -1;
			}
			strcpy(svc->name, val);
		} else if (k == 4) {
			int m;

			for (m = 0; m <= CCS_FLOW__MAX; m++)
				if (!strcmp(val, ccs_flow_mode_names[m]))
					break;
			if (m > CCS_FLOW__MAX) {
				cfg_err(p, "flow_mode \"%s\" is not one of off, fill, combine, flow, prior", val);
				return -1;
			}
			svc->flow_mode = (__u8)m;
		} else if (parse_bool(p, key, val, k == 2 ? &svc->ab : &svc->caps)) {
			return -1;
		}
		s = skip_blank(s);
		if (*s == ',')
			s = skip_blank(s + 1);
		else if (*s != '}') {
			cfg_err(p, "expected , or } in the service mapping at \"%s\"", s);
			return -1;
		}
	}
	if (*skip_blank(s + 1)) {
		cfg_err(p, "unexpected \"%s\" after the service mapping", skip_blank(s + 1));
		return -1;
	}
	if (!seen[0]) {
		cfg_err(p, "service without port");
		return -1;
	}
	for (i = 0; i < cfg->n_services; i++) {
		if (cfg->services[i].port == svc->port) {
			cfg_err(p, "port %u is already a service (%s)", svc->port, cfg->services[i].name);
			return -1;
		}
	}
	cfg->n_services++;
	return 0;
}

/* rotate_minutes: 0 (hourly files) or a divisor of the hour (ccselect/contract.py ROTATE_MINUTES) */
static int parse_rotate(struct config *cfg, const struct pos *p, const char *v)
{
	unsigned long m;

	if (parse_uint(p, "rotate_minutes", v, 0, 30, &m))
		return -1;
	if (m && 60 % m) {
		cfg_err(p, "rotate_minutes: %lu does not divide the hour (one of 1, 2, 3, 4, 5, 6, 10, "
			"12, 15, 20, 30; or 0 for hourly files)", m);
		return -1;
	}
	cfg->rotate_minutes = (int)m;
	return 0;
}

static int set_str(const struct pos *p, const char *key, char *dst, size_t n, const char *v)
{
	if (strlen(v) >= n) {
		cfg_err(p, "%s longer than %zu bytes", key, n - 1);
		return -1;
	}
	strcpy(dst, v);
	return 0;
}

/*
 * route_table: a number or local / main; route_spec: words of [A-Za-z0-9._:/-] (ip's own syntax,
 * checked by ip at the first load), none of table / proto / congctl (the agent's); route_within:
 * prefixes, checked here as routes.c reads them (a bad one is a config error, not a load that
 * writes no route). Each goes to ip as words on a line of
 * `ip -batch` (no shell).
 */
static int parse_route_key(struct config *cfg, const struct pos *p, const char *key, const char *val)
{
	const char *c;

	if (!strcmp(key, "route_table")) {
		char *end;
		unsigned long t = strtoul(val, &end, 10);

		if (val[0] && strcmp(val, "local") && strcmp(val, "main") &&
		    (*end || val[0] == '-' || t == 0 || t > 0xffffffffUL)) {
			cfg_err(p, "route_table \"%s\": a table number (1..2^32-1), local or main", val);
			return -1;
		}
		return set_str(p, key, cfg->route_table, sizeof(cfg->route_table), val);
	}
	for (c = val; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
		      strchr("._:/- ,", *c))) {
			cfg_err(p, "%s: character '%c' not allowed", key, *c);
			return -1;
		}
	if (!strcmp(key, "route_spec")) {
		char buf[256], *tok, *save = NULL;

		if (set_str(p, key, cfg->route_spec, sizeof(cfg->route_spec), val))
			return -1;
		strcpy(buf, val);
		for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
			if (!strcmp(tok, "table") || !strcmp(tok, "proto") || !strcmp(tok, "congctl") ||
			    strchr(tok, ',')) {
				cfg_err(p, "route_spec: \"%s\" is the agent's to write", tok);
				return -1;
			}
		return 0;
	}
	if (!strcmp(key, "route_within")) {
		char why[256];

		if (routes_check_within(val, why, sizeof(why))) {
			cfg_err(p, "%s", why);
			return -1;
		}
	}
	return set_str(p, key, cfg->route_within, sizeof(cfg->route_within), val);
}

/*
 * The caps on one table (issue 58): written by the deployment from export.guards, each at most
 * the compiled bound (a config above it is an error, not a cap quietly lowered).
 */
static int parse_cap(struct config *cfg, const struct pos *p, const char *key, const char *val)
{
	unsigned long x;

	if (!strcmp(key, "max_entries")) {
		if (parse_uint(p, key, val, 1, CCS_MAX_ENTRIES, &x))
			return -1;
		cfg->max_entries = x;
	} else if (!strcmp(key, "max_tree_nodes")) {
		/* a tree of max_tree_nodes or more is refused: 2 lets a one-node tree through, and
		 * CCS_TREE_MAX_NODES + 1 any tree the program can walk */
		if (parse_uint(p, key, val, 2, CCS_TREE_MAX_NODES + 1, &x))
			return -1;
		cfg->max_tree_nodes = (__u32)x;
	} else if (!strcmp(key, "max_artifact_bytes")) {
		if (parse_uint(p, key, val, 1, CCS_MAX_TABLE_BYTES, &x))
			return -1;
		cfg->max_artifact_bytes = x;
	} else if (!strcmp(key, "growth_floor_entries")) {
		if (parse_uint(p, key, val, 0, CCS_MAX_ENTRIES, &x))
			return -1;
		cfg->growth_floor_entries = x;
	} else {
		double g;

		if (parse_real(p, key, val, 0.0, 1000.0, &g))
			return -1;
		if (g != 0.0 && g < 1.0) {
			cfg_err(p, "max_growth: %s is below 1 (a table could not keep the live one's size); "
				"0 turns the growth check off", val);
			return -1;
		}
		cfg->max_growth = g;
	}
	return 0;
}

/* a top-level `key: value` line; *in_services says whether `- {...}` items may follow */
static int parse_setting(struct config *cfg, const struct pos *p, const char *s, bool *seen, bool *in_services)
{
	char key[64], val[PATH_MAX];
	int k;

	*in_services = false;
	if (read_scalar(p, &s, ":", key, sizeof(key)))
		return -1;
	if (*s != ':' || (s[1] && s[1] != ' ' && s[1] != '\t')) {
		cfg_err(p, "expected key: value");
		return -1;
	}
	k = key_index(top_keys, key);
	if (k < 0) {
		cfg_err(p, "unknown key \"%s\" (known: node_id, cgroup, pin_dir, public_key, "
			"default_cc, sample_rate, log_dir, rotate_minutes, route_ccs, route_table, route_spec, "
			"route_within, metrics_file, state_dir, version_max_step, max_entries, max_tree_nodes, "
			"max_artifact_bytes, max_growth, growth_floor_entries, services)", key);
		return -1;
	}
	if (seen[k]) {
		cfg_err(p, "key \"%s\" given twice", key);
		return -1;
	}
	seen[k] = true;
	s++;
	if (read_scalar(p, &s, "", val, sizeof(val)))
		return -1;
	if (*skip_blank(s)) {
		cfg_err(p, "unexpected \"%s\" after the value of %s", skip_blank(s), key);
		return -1;
	}
	if (!strcmp(key, "services")) {
		if (val[0] && strcmp(val, "[]")) {
			cfg_err(p, "services: items go on the following lines as - {port: N, ...}");
			return -1;
		}
		*in_services = !val[0];
		return 0;
	}
	if (!strcmp(key, "sample_rate"))
		return parse_real(p, key, val, 0.0, 1.0, &cfg->sample_rate);
	if (!strcmp(key, "rotate_minutes"))
		return parse_rotate(cfg, p, val);
	if (!strcmp(key, "node_id")) {
		if (val[0] && check_node_id(val)) {
			cfg_err(p, "node_id \"%s\": must be printable, without '/', not . or ..", val);
			return -1;
		}
		return set_str(p, key, cfg->node_id, sizeof(cfg->node_id), val);
	}
	if (!strcmp(key, "default_cc"))
		return set_str(p, key, cfg->default_cc, sizeof(cfg->default_cc), val);
	if (!strcmp(key, "route_ccs")) {
		static const char *const modes[] = { "auto", "on", "off" };
		int m;

		for (m = 0; m < 3; m++)
			if (!strcmp(val, modes[m]))
				break;
		if (m == 3) {
			cfg_err(p, "route_ccs \"%s\": auto, on or off", val);
			return -1;
		}
		cfg->route_ccs = m;
		return 0;
	}
	if (!strcmp(key, "route_table") || !strcmp(key, "route_spec") || !strcmp(key, "route_within"))
		return parse_route_key(cfg, p, key, val);
	if (!strcmp(key, "cgroup"))
		return set_str(p, key, cfg->cgroup, sizeof(cfg->cgroup), val);
	if (!strcmp(key, "pin_dir"))
		return set_str(p, key, cfg->pin_dir, sizeof(cfg->pin_dir), val);
	if (!strcmp(key, "public_key"))
		return set_str(p, key, cfg->public_key, sizeof(cfg->public_key), val);
	if (!strcmp(key, "metrics_file"))
		return set_str(p, key, cfg->metrics_file, sizeof(cfg->metrics_file), val);
	if (!strcmp(key, "state_dir")) {
		if (val[0] && val[0] != '/') {
			cfg_err(p, "state_dir \"%s\": an absolute path", val);
			return -1;
		}
		return set_str(p, key, cfg->state_dir, sizeof(cfg->state_dir), val);
	}
	if (!strcmp(key, "version_max_step")) {
		/* 1 .. 2^32: past that a handful of tables would use up an epoch's 2^53 versions */
		unsigned long step;

		if (parse_uint(p, key, val, 1, 4294967296ul, &step))
			return -1;
		cfg->version_max_step = step;
		return 0;
	}
	if (!strcmp(key, "max_entries") || !strcmp(key, "max_tree_nodes") ||
	    !strcmp(key, "max_artifact_bytes") || !strcmp(key, "max_growth") ||
	    !strcmp(key, "growth_floor_entries"))
		return parse_cap(cfg, p, key, val);
	return set_str(p, key, cfg->log_dir, sizeof(cfg->log_dir), val);
}

/* cut a comment: '#' at the start or after a blank, outside quotes */
static void cut_comment(char *s)
{
	char q = 0, *c;

	for (c = s; *c; c++) {
		if (q) {
			if (*c == q)
				q = 0;
			else if (q == '"' && *c == '\\' && c[1])
				c++;
		} else if (*c == '"' || *c == '\'') {
			if (c == s || c[-1] == ' ' || c[-1] == '\t' || c[-1] == ':' || c[-1] == '{' ||
			    c[-1] == ',' || c[-1] == '-')
				q = *c;
		} else if (*c == '#' && (c == s || c[-1] == ' ' || c[-1] == '\t')) {
			*c = 0;
			return;
		}
	}
}

int load_config(struct config *cfg, const char *path)
{
	struct pos p = { .path = path };
	bool seen[sizeof(top_keys) / sizeof(top_keys[0])] = {}, in_services = false;
	char *line = NULL, *s, *e;
	size_t cap = 0;
	ssize_t n;
	int err = 0;
	FILE *f = fopen(path, "r");

	if (!f) {
		print_error("config %s: %s", path, strerror(errno));
		return -1;
	}
	while (!err && (n = getline(&line, &cap, f)) >= 0) {
		p.line++;
		if (n > MAX_LINE) {
			cfg_err(&p, "line longer than %d bytes", MAX_LINE);
			err = -1;
			break;
		}
		if ((size_t)n != strlen(line)) {
			cfg_err(&p, "NUL byte in the line");
			err = -1;
			break;
		}
		e = line + n;
		while (e > line && (e[-1] == '\n' || e[-1] == '\r'))
			*--e = 0;
		cut_comment(line);
		s = (char *)skip_blank(line);
		e = s + strlen(s);
		while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
			*--e = 0;
		if (!*s)
			continue;
		if (s[0] == '-' && (s[1] == ' ' || s[1] == '\t' || !s[1])) {
			if (!in_services) {
				cfg_err(&p, "a list item outside services:");
				err = -1;
			} else {
				err = parse_service(cfg, &p, s + 1);
			}
		} else if (s != line) {
			cfg_err(&p, "unexpected indentation (top-level keys start at column 1)");
			err = -1;
		} else {
			err = parse_setting(cfg, &p, s, seen, &in_services);
		}
	}
	free(line);
	fclose(f);
	return err;
}
