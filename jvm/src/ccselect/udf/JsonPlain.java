package ccselect.udf;

import org.apache.spark.sql.api.java.UDF2;

/**
 * ccs_json_plain(text, fields): whether a JSON line is certainly the record Spark's from_json reads
 * from it, key for key — null text gives null, PLAIN (1) means sure, NOT_SURE (0) means the caller
 * diagnoses the line exactly (jobs/parse.py), TEXT_AFTER (2) that the line is a whole object
 * followed by more text, which from_json (and try_parse_json) would silently ignore.
 *
 * PLAIN only when the text is one JSON object (JSON whitespace around it allowed) whose top-level
 * keys are double-quoted without escapes and all distinct, and where each top-level key named in
 * `fields` holds null or a value of its type: `fields` is "name:s,name:i,..." (s a JSON string, i
 * an integer of at most 18 digits without leading zeros, an optional minus sign before them).
 * from_json silently keeps the last of a repeated key, and reads a number into a string field as
 * its text, or a quoted number into a bigint field as null: those are the lines this sends to the
 * diagnosis.
 *
 * One pass over the characters. Anything unexpected (single quotes, an escaped key, text after the
 * object, a truncated line) is "not sure". It does not check that the text is valid JSON: where
 * it is not, from_json reads every field as null, and the line is diagnosed for that.
 */
public final class JsonPlain implements UDF2<String, String, Integer> {
    private static final long serialVersionUID = 1L;
    /** What `call` returns: certainly the record; not sure; a whole object with text after it. */
    public static final int PLAIN = 1, NOT_SURE = 0, TEXT_AFTER = 2;

    private transient String lastSpec;
    private transient String[] names;
    private transient char[] kinds;

    private void parseSpec(String spec) {
        String[] items = spec.isEmpty() ? new String[0] : spec.split(",");
        names = new String[items.length];
        kinds = new char[items.length];
        for (int k = 0; k < items.length; k++) {
            int colon = items[k].lastIndexOf(':');
            names[k] = items[k].substring(0, colon);
            kinds[k] = items[k].charAt(colon + 1);
        }
        lastSpec = spec;
    }

    /** The index in `names` of the key s[from, to), or -1; `hint` is tried first (keys usually
     * come in the order the fields are listed). */
    private int field(String s, int from, int to, int hint) {
        int len = to - from;
        int n = names.length;
        for (int m = 0; m < n; m++) {
            int k = (hint + m) % n;
            String name = names[k];
            if (name.length() == len && s.regionMatches(from, name, 0, len)) {
                return k;
            }
        }
        return -1;
    }

    private static boolean ws(char c) {
        return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    }

    /** Index after the string starting at the quote `i`, or -1 when it does not end. */
    private static int skipString(String s, int i, int n) {
        for (int j = i + 1; j < n; j++) {
            char c = s.charAt(j);
            if (c == '\\') {
                j++;
            } else if (c == '"') {
                return j + 1;
            }
        }
        return -1;
    }

    /** Index after the value starting at `i` (a string, a nested object or array, or a bare token). */
    private static int skipValue(String s, int i, int n) {
        char c = s.charAt(i);
        if (c == '"') {
            return skipString(s, i, n);
        }
        if (c == '{' || c == '[') {
            int depth = 0;
            for (int j = i; j < n; j++) {
                char d = s.charAt(j);
                if (d == '"') {
                    j = skipString(s, j, n);
                    if (j < 0) {
                        return -1;
                    }
                    j--;
                } else if (d == '{' || d == '[') {
                    depth++;
                } else if (d == '}' || d == ']') {
                    if (--depth == 0) {
                        return j + 1;
                    }
                }
            }
            return -1;
        }
        // a bare token: a number, true, false, null (Spark's reader also takes NaN and Infinity, and
        // strings in single quotes, which may hold anything: not sure)
        int j = i;
        while (j < n) {
            char d = s.charAt(j);
            if (d == ',' || d == '}' || ws(d)) {
                break;
            }
            if (d == '\'' || d == '"' || d == '{' || d == '[') {
                return -1;
            }
            j++;
        }
        return j;
    }

    /** For `scan` with `out`: the value s[vs, ve) of field `f` (-1: a key not among the fields) into
     * `out`, or `simple` false when the value is not simple. */
    private void capture(String s, int vs, int ve, int f, Object[] out) {
        char c = s.charAt(vs);
        Object value = null;
        if (c == '"') {
            if (ve - vs - 2 > MAX_SIMPLE_STRING) {
                simple = false;
                return;
            }
            for (int j = vs + 1; j < ve - 1; j++) {
                char d = s.charAt(j);
                if (d == '\\' || d < ' ') {
                    simple = false;
                    return;
                }
            }
            value = f >= 0 ? s.substring(vs + 1, ve - 1) : null;
        } else if (isInteger(s, vs, ve)) {
            value = f >= 0 ? Long.parseLong(s, vs, ve, 10) : null;
        } else if (!(ve - vs == 4 && s.startsWith("null", vs))
                   && !(f < 0 && (ve - vs == 4 && s.startsWith("true", vs) || ve - vs == 5 && s.startsWith("false", vs)))) {
            simple = false;
            return;
        }
        if (f >= 0) {
            out[f] = value;
        }
    }

    private static boolean isInteger(String s, int from, int to) {
        int i = s.charAt(from) == '-' ? from + 1 : from;
        if (i >= to || to - i > 18 || (s.charAt(i) == '0' && to - i > 1)) {
            return false;
        }
        for (; i < to; i++) {
            char c = s.charAt(i);
            if (c < '0' || c > '9') {
                return false;
            }
        }
        return true;
    }

    @Override
    public Integer call(String s, String spec) {
        return s == null ? null : scan(s, spec, null);
    }

    /** The number of fields of the last `spec` scanned. */
    int fieldCount(String spec) {
        String sp = spec == null ? "" : spec;
        if (!sp.equals(lastSpec)) {
            parseSpec(sp);
        }
        return names.length;
    }

    /** The longest key and string value of a simple line: far below Jackson's default limits (names of
     * 50,000 characters, strings of 20,000,000), past which from_json fails where a scan would not. */
    static final int MAX_SIMPLE_KEY = 1_000, MAX_SIMPLE_STRING = 1_000_000;

    /** Whether the last `scan` with `out` found a simple line (see JsonRecord): every value a string
     * with no backslash or control character, an integer of at most 18 digits, true, false or null,
     * and every key free of control characters; no key or string longer than MAX_SIMPLE_KEY or
     * MAX_SIMPLE_STRING. `out` then holds each field's value. */
    transient boolean simple;

    /** `call`'s answer for a non-null `s`; with `out` (one slot per field of `spec`), also the
     * values of a simple line (`simple`). */
    int scan(String s, String spec, Object[] out) {
        fieldCount(spec);
        simple = out != null;
        boolean[] seen = new boolean[names.length];
        int hint = 0;
        int n = s.length();
        int i = 0;
        while (i < n && ws(s.charAt(i))) {
            i++;
        }
        if (i >= n || s.charAt(i) != '{') {
            return NOT_SURE;
        }
        i++;
        int[] starts = new int[16];
        int[] ends = new int[16];
        int keys = 0;
        boolean any = false;
        while (true) {
            while (i < n && ws(s.charAt(i))) {
                i++;
            }
            if (i >= n) {
                return NOT_SURE;
            }
            if (s.charAt(i) == '}' && !any) {
                i++;
                break;
            }
            if (s.charAt(i) != '"') {
                return NOT_SURE;
            }
            int ks = i + 1;
            int ke = ks;
            while (ke < n && s.charAt(ke) != '"') {
                char kc = s.charAt(ke);
                if (kc == '\\') {
                    return NOT_SURE;
                }
                if (kc < ' ') {
                    simple = false;
                }
                ke++;
            }
            if (ke >= n) {
                return NOT_SURE;
            }
            if (ke - ks > MAX_SIMPLE_KEY) {
                simple = false;
            }
            int f = names.length == 0 ? -1 : field(s, ks, ke, hint);
            if (f >= 0) {
                if (seen[f]) {
                    return NOT_SURE;
                }
                seen[f] = true;
                hint = f + 1;
            } else {
                // a key not among the fields: compared with the other such keys
                int len = ke - ks;
                for (int k = 0; k < keys; k++) {
                    if (ends[k] - starts[k] == len && s.regionMatches(starts[k], s, ks, len)) {
                        return NOT_SURE;
                    }
                }
                if (keys == starts.length) {
                    starts = java.util.Arrays.copyOf(starts, keys * 2);
                    ends = java.util.Arrays.copyOf(ends, keys * 2);
                }
                starts[keys] = ks;
                ends[keys] = ke;
                keys++;
            }
            any = true;
            i = ke + 1;
            while (i < n && ws(s.charAt(i))) {
                i++;
            }
            if (i >= n || s.charAt(i) != ':') {
                return NOT_SURE;
            }
            i++;
            while (i < n && ws(s.charAt(i))) {
                i++;
            }
            if (i >= n) {
                return NOT_SURE;
            }
            int vs = i;
            i = skipValue(s, i, n);
            if (i < 0 || i == vs) {
                return NOT_SURE;
            }
            if (f >= 0 && !s.startsWith("null", vs)) {
                if (kinds[f] == 's' ? s.charAt(vs) != '"' : !isInteger(s, vs, i)) {
                    return NOT_SURE;
                }
            }
            if (simple) {
                capture(s, vs, i, f, out);
            }
            while (i < n && ws(s.charAt(i))) {
                i++;
            }
            if (i >= n) {
                return NOT_SURE;
            }
            char c = s.charAt(i++);
            if (c == '}') {
                break;
            }
            if (c != ',') {
                return NOT_SURE;
            }
        }
        while (i < n && ws(s.charAt(i))) {
            i++;
        }
        return i == n ? PLAIN : TEXT_AFTER;
    }
}
