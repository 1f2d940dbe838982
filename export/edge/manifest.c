// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * manifest.c - a table's manifest: the Ed25519 signature over its exact bytes first, then its
 * fields, read with a JSON parser (cJSON) the way read_manifest in export/artifact/signing.py
 * reads them (json.loads), only stricter where Python would be lenient:
 *
 *   - the file is one JSON object in UTF-8, nothing after it (json.loads: no "Extra data");
 *   - a key repeated in any object is refused (json.loads would keep the last one, cJSON keeps
 *     both: the manifest would mean different things to different readers);
 *   - format, version, created, expires, entries.v4, entries.v6 (and epoch, when there) are JSON
 *     integers in the range of their header fields, version and epoch at most CCS_SERIAL_MAX
 *     (no 5.0, 5e0, "5", objects or arrays); model_version, table and
 *     sha256 are strings; entries is an object; a \u0000 escape is refused anywhere;
 *   - format 2 only (the flow tree): tree is an object, tree.model a string (at most 63 bytes),
 *     tree.nodes an integer in 0..CCS_TREE_MAX_NODES.
 *
 * cJSON keeps numbers only as doubles, so integers are read from their text: valid JSON has
 * digits outside strings only in numbers, so the document's number tokens, in order, are the
 * number items of cJSON's tree in depth-first order.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "agent.h"

struct numtok {
	const char *s;
	size_t n;
};

struct jdoc {
	const char *text;
	cJSON *root;
	struct numtok *nums;
	size_t n_nums;
};

static int verify_signature(const char *public_key, const unsigned char *msg, size_t len,
			    const unsigned char *sig, size_t sig_len)
{
	EVP_PKEY *pkey = NULL;
	EVP_MD_CTX *ctx = NULL;
	FILE *f;
	int ok = 0;

	if (!public_key[0]) {
		print_error("no public key (--pubkey or config public_key:)");
		return -1;
	}
	f = fopen(public_key, "r");
	if (!f) {
		print_error("public key %s: %s", public_key, strerror(errno));
		return -1;
	}
	pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL);
	fclose(f);
	if (!pkey || EVP_PKEY_id(pkey) != EVP_PKEY_ED25519) {
		print_error("public key %s: not an Ed25519 PEM public key", public_key);
		goto cleanup;
	}
	if (sig_len != 64) {
		print_error("signature must be 64 bytes, got %zu", sig_len);
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

/* offset of the first byte that is not well-formed UTF-8 (RFC 3629), or len */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
	size_t i = 0, k, n;
	unsigned cp, min;

	while (i < len) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if ((s[i] & 0xe0) == 0xc0)
			n = 1, cp = s[i] & 0x1f, min = 0x80;
		else if ((s[i] & 0xf0) == 0xe0)
			n = 2, cp = s[i] & 0x0f, min = 0x800;
		else if ((s[i] & 0xf8) == 0xf0)
			n = 3, cp = s[i] & 0x07, min = 0x10000;
		else
			return i;
		if (len - i <= n)
			return i;
		for (k = 1; k <= n; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return i;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return i;
		i += n + 1;
	}
	return len;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* length of the JSON number at p, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, or 0 */
static size_t number_len(const char *p)
{
	const char *s = p;

	if (*p == '-')
		p++;
	if (*p == '0')
		p++;
	else if (is_digit(*p))
		while (is_digit(*p))
			p++;
	else
		return 0;
	if (*p == '.') {
		if (!is_digit(*++p))
			return 0;
		while (is_digit(*p))
			p++;
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!is_digit(*p))
			return 0;
		while (is_digit(*p))
			p++;
	}
	return *p && strchr("+-.0123456789eE", *p) ? 0 : p - s;
}

static int add_number(struct jdoc *d, const char *s, size_t n, size_t *cap)
{
	struct numtok *grown;

	if (d->n_nums == *cap) {
		*cap = *cap ? 2 * *cap : 16;
		grown = realloc(d->nums, *cap * sizeof(*grown));
		if (!grown) {
			print_error("manifest: out of memory");
			return -1;
		}
		d->nums = grown;
	}
	d->nums[d->n_nums++] = (struct numtok){ s, n };
	return 0;
}

/*
 * What cJSON lets through and json.loads does not: control characters (raw in a string, or
 * other than space, tab, CR, LF between tokens) and numbers such as 01, 1. or 1.e5; and a
 * \u0000 escape, where cJSON would cut the string and Python would not. Collects the number
 * tokens of the (syntactically valid) text, in order.
 */
static int scan_tokens(struct jdoc *d)
{
	const char *p = d->text;
	size_t cap = 0, n;

	while (*p) {
		if (*p == '"') {
			for (p++; *p != '"'; p++) {
				if ((unsigned char)*p < 0x20) {
					print_error("refused: manifest is not valid JSON (control character in a "
						"string, byte %zu)", (size_t)(p - d->text));
					return -1;
				}
				if (*p == '\\' && !strncmp(++p, "u0000", 5)) {
					print_error("refused: manifest has a \\u0000 escape (byte %zu)",
						(size_t)(p - 1 - d->text));
					return -1;
				}
			}
			p++;
		} else if (*p == '-' || is_digit(*p)) {
			n = number_len(p);
			if (!n) {
				print_error("refused: manifest is not valid JSON (number at byte %zu)",
					(size_t)(p - d->text));
				return -1;
			}
			if (add_number(d, p, n, &cap))
				return -1;
			p += n;
		} else if ((unsigned char)*p < 0x20 && !strchr("\t\n\r", *p)) {
			print_error("refused: manifest is not valid JSON (control character at byte %zu)",
				(size_t)(p - d->text));
			return -1;
		} else {
			p++;
		}
	}
	return 0;
}

/* how many number items come before `target` in a depth-first walk from `node` */
static bool count_numbers_before(const cJSON *node, const cJSON *target, size_t *k)
{
	const cJSON *c;

	if (node == target)
		return true;
	if (cJSON_IsNumber(node))
		(*k)++;
	for (c = node->child; c; c = c->next)
		if (count_numbers_before(c, target, k))
			return true;
	return false;
}

static const struct numtok *number_text(const struct jdoc *d, const cJSON *item)
{
	size_t k = 0;

	if (!count_numbers_before(d->root, item, &k) || k >= d->n_nums)
		return NULL;
	return &d->nums[k];
}

/* a key twice in one object, anywhere in the document; path names where, for the message */
static int check_duplicate_keys(const cJSON *node, const char *path)
{
	const cJSON *a, *b;
	char sub[256];
	int i = 0;

	for (a = node->child; a; a = a->next, i++) {
		if (cJSON_IsObject(node)) {
			for (b = node->child; b != a; b = b->next) {
				if (!strcmp(a->string, b->string)) {
					print_error("refused: manifest has a duplicate key \"%s%s%s\"", path,
						*path ? "." : "", a->string);
					return -1;
				}
			}
			snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", a->string);
		} else {
			snprintf(sub, sizeof(sub), "%s[%d]", path, i);
		}
		if (a->child && check_duplicate_keys(a, sub))
			return -1;
	}
	return 0;
}

static const char *type_name(const cJSON *it)
{
	if (cJSON_IsObject(it))
		return "an object";
	if (cJSON_IsArray(it))
		return "an array";
	if (cJSON_IsString(it))
		return "a string";
	if (cJSON_IsBool(it))
		return "a boolean";
	if (cJSON_IsNull(it))
		return "null";
	return "a number";
}

static const cJSON *get_field(const cJSON *obj, const char *name, const char *path)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);

	if (!it)
		print_error("refused: manifest misses field \"%s\"", path);
	return it;
}

/* obj[name]: a JSON integer in 0..max (-0 is 0, as in Python) */
static int get_uint(const struct jdoc *d, const cJSON *obj, const char *name, const char *path,
		    __u64 max, __u64 *out)
{
	const cJSON *it = get_field(obj, name, path);
	const struct numtok *t;
	const char *digits;
	char *end;

	if (!it)
		return -1;
	if (!cJSON_IsNumber(it)) {
		print_error("refused: manifest field \"%s\" must be an integer, not %s", path,
			type_name(it));
		return -1;
	}
	t = number_text(d, it);
	if (!t) {
		print_error("refused: manifest field \"%s\": number not found in the text", path);
		return -1;
	}
	if (memchr(t->s, '.', t->n) || memchr(t->s, 'e', t->n) || memchr(t->s, 'E', t->n)) {
		print_error("refused: manifest field \"%s\" must be an integer, not a float (%.*s)", path,
			(int)t->n, t->s);
		return -1;
	}
	digits = t->s[0] == '-' ? t->s + 1 : t->s;
	errno = 0;
	*out = strtoull(digits, &end, 10);
	if (errno == ERANGE || (t->s[0] == '-' && *out) || *out > max) {
		print_error("refused: manifest field \"%s\" = %.*s is out of range 0..%llu", path,
			(int)t->n, t->s, (unsigned long long)max);
		return -1;
	}
	return 0;
}

/* obj[name]: a JSON string shorter than n bytes */
static int get_str(const cJSON *obj, const char *name, const char *path, char *out, size_t n)
{
	const cJSON *it = get_field(obj, name, path);

	if (!it)
		return -1;
	if (!cJSON_IsString(it)) {
		print_error("refused: manifest field \"%s\" must be a string, not %s", path, type_name(it));
		return -1;
	}
	if (strlen(it->valuestring) >= n) {
		print_error("refused: manifest field \"%s\" is longer than %zu bytes", path, n - 1);
		return -1;
	}
	strcpy(out, it->valuestring);
	return 0;
}

/* the fields, in the manifest's order; then what the agent needs of their values */
static int read_fields(const struct jdoc *d, struct manifest *m)
{
	const cJSON *ents, *tree;

	if (get_uint(d, d->root, "format", "format", UINT16_MAX, &m->format) ||
	    get_uint(d, d->root, "version", "version", CCS_SERIAL_MAX, &m->version) ||
	    get_str(d->root, "model_version", "model_version", m->model_version,
		    sizeof(m->model_version)) ||
	    get_uint(d, d->root, "created", "created", UINT64_MAX, &m->created) ||
	    get_uint(d, d->root, "expires", "expires", UINT64_MAX, &m->expires))
		return -1;
	ents = get_field(d->root, "entries", "entries");
	if (!ents)
		return -1;
	if (!cJSON_IsObject(ents)) {
		print_error("refused: manifest field \"entries\" must be an object, not %s",
			type_name(ents));
		return -1;
	}
	if (get_uint(d, ents, "v4", "entries.v4", UINT32_MAX, &m->n_v4) ||
	    get_uint(d, ents, "v6", "entries.v6", UINT32_MAX, &m->n_v6) ||
	    get_str(d->root, "table", "table", m->table, sizeof(m->table)) ||
	    get_str(d->root, "sha256", "sha256", m->sha256, sizeof(m->sha256)))
		return -1;
	/* the deployment epoch (issue 56): a manifest without one is epoch 0, the tables signed
	 * before epochs; the version rule (table.c) orders tables by (epoch, version) */
	if (cJSON_GetObjectItemCaseSensitive(d->root, "epoch") &&
	    get_uint(d, d->root, "epoch", "epoch", CCS_SERIAL_MAX, &m->epoch))
		return -1;
	if (m->format != CCS_TABLE_FORMAT) {
		print_error("refused: unsupported format %llu (manifest field \"format\"): this agent reads "
			"format %d (tables with the flow tree) only", (unsigned long long)m->format,
			CCS_TABLE_FORMAT);
		return -1;
	}
	tree = get_field(d->root, "tree", "tree");
	if (!tree)
		return -1;
	if (!cJSON_IsObject(tree)) {
		print_error("refused: manifest field \"tree\" must be an object, not %s", type_name(tree));
		return -1;
	}
	if (get_str(tree, "model", "tree.model", m->tree_model, sizeof(m->tree_model)) ||
	    get_uint(d, tree, "nodes", "tree.nodes", CCS_TREE_MAX_NODES, &m->tree_nodes))
		return -1;
	if (!m->table[0] || strchr(m->table, '/') || !strcmp(m->table, ".") ||
	    !strcmp(m->table, "..")) {
		print_error("refused: manifest field \"table\" must name a file beside the manifest, not "
			"\"%s\"", m->table);
		return -1;
	}
	return 0;
}

static int parse_manifest(const char *text, size_t len, struct manifest *m)
{
	struct jdoc d = { .text = text };
	const char *end = NULL;
	size_t bad = utf8_invalid_at((const unsigned char *)text, len);
	int err = -1;

	if (bad < len) {
		print_error("refused: manifest is not valid UTF-8 (byte %zu)", bad);
		return -1;
	}
	/* len + 1: the NUL after the text must follow the value (and whitespace) */
	d.root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
	if (!d.root || end != text + len) {
		print_error("refused: manifest is not valid JSON (byte %zu)", end ? (size_t)(end - text) : 0);
		goto cleanup;
	}
	if (!cJSON_IsObject(d.root)) {
		print_error("refused: manifest is %s, not a JSON object", type_name(d.root));
		goto cleanup;
	}
	if (scan_tokens(&d) || check_duplicate_keys(d.root, "") || read_fields(&d, m))
		goto cleanup;
	err = 0;
cleanup:
	free(d.nums);
	cJSON_Delete(d.root);
	return err;
}

int manifest_read(const char *public_key, const char *path, struct manifest *m)
{
	unsigned char *man = NULL, *sig = NULL;
	char sig_path[PATH_MAX];
	size_t man_len, sig_len;
	int err = -1;

	memset(m, 0, sizeof(*m));
	if (read_file(path, &man, &man_len)) {
		print_error("read %s: %s", path, strerror(errno));
		goto cleanup;
	}
	snprintf(sig_path, sizeof(sig_path), "%s.sig", path);
	if (read_file(sig_path, &sig, &sig_len)) {
		print_error("refused: no signature %s", sig_path);
		goto cleanup;
	}
	if (verify_signature(public_key, man, man_len, sig, sig_len)) {
		print_error("refused: bad signature on %s", path);
		goto cleanup;
	}
	/* the fields are read only from verified bytes */
	if (memchr(man, 0, man_len)) {
		print_error("refused: manifest is not valid JSON (a NUL byte)");
		goto cleanup;
	}
	err = parse_manifest((const char *)man, man_len, m);
cleanup:
	free(man);
	free(sig);
	return err;
}
