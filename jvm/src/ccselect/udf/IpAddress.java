package ccselect.udf;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * ccs_ip(text): the client address of a log line, parsed in one pass over its characters, as the
 * struct ccselect/ipaddr.py's with_ip documents (family, text, packed, hex, v4_int, prefix16,
 * prefix24, prefix48, prefix64; every field null when the text is not an address).
 *
 * <p>The texts accepted are the ones Python's ipaddress.ip_address accepts, minus IPv6 zone ids
 * (`%eth0`): an IPv4 dotted quad of decimal octets up to 255 without leading zeros; IPv6 as hex
 * groups of 1 to 4 digits in either case, 8 of them, or fewer around one `::` that stands for at
 * least one zero group, the last two groups optionally written as a dotted quad (the rules of
 * CPython's IPv6Address._ip_int_from_string). An IPv4-mapped address (::ffff:0:0/96, RFC 4291
 * §2.5.5.2) is its IPv4 address: family 4, four packed bytes, its dotted quad as text. Any other
 * address keeps its text as written. tests/test_ingest_parse.py compares it with Python on fixed
 * and generated texts.
 */
public final class IpAddress implements UDF1<String, Row> {
    private static final long serialVersionUID = 1L;
    private static final char[] HEX = "0123456789abcdef".toCharArray();
    private static final Row NONE = RowFactory.create(null, null, null, null, null, null, null, null, null);

    @Override
    public Row call(String s) {
        if (s == null) {
            return NONE;
        }
        long v4 = s.indexOf(':') < 0 ? v4(s, 0, s.length()) : -1;
        if (v4 >= 0) {
            return ipv4(v4, s);
        }
        int[] g = v6(s);
        if (g == null) {
            return NONE;
        }
        if (g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0 && g[4] == 0 && g[5] == 0xffff) {
            long mapped = ((long) g[6] << 16) | g[7];
            return ipv4(mapped, null);
        }
        byte[] packed = new byte[16];
        char[] hex = new char[32];
        for (int i = 0; i < 8; i++) {
            packed[2 * i] = (byte) (g[i] >>> 8);
            packed[2 * i + 1] = (byte) g[i];
            for (int k = 0; k < 4; k++) {
                hex[4 * i + k] = HEX[(g[i] >>> (12 - 4 * k)) & 0xf];
            }
        }
        return RowFactory.create(6, s, packed, new String(hex), null, null, null, prefix(g, 3), prefix(g, 4));
    }

    /** The IPv4 address `v` (written as `text`, or null to write its dotted quad). */
    private static Row ipv4(long v, String text) {
        int a = (int) (v >>> 24), b = (int) (v >>> 16) & 0xff, c = (int) (v >>> 8) & 0xff, d = (int) v & 0xff;
        byte[] packed = {(byte) a, (byte) b, (byte) c, (byte) d};
        char[] hex = new char[8];
        for (int k = 0; k < 8; k++) {
            hex[k] = HEX[(int) (v >>> (28 - 4 * k)) & 0xf];
        }
        String ab = a + "." + b + ".";
        return RowFactory.create(4, text != null ? text : ab + c + "." + d, packed, new String(hex), v,
                                 ab + "0.0/16", ab + c + ".0/24", null, null);
    }

    /** `g1:g2:...::/<16*groups>` in the compressed form Python writes: past the first `groups`
     * groups all are zero, so that run is the longest and compressing drops the trailing zeros. */
    private static String prefix(int[] g, int groups) {
        int last = groups - 1;
        while (last >= 0 && g[last] == 0) {
            last--;
        }
        StringBuilder sb = new StringBuilder(24);
        for (int i = 0; i <= last; i++) {
            if (i > 0) {
                sb.append(':');
            }
            sb.append(Integer.toHexString(g[i]));
        }
        return sb.append("::/").append(16 * groups).toString();
    }

    /** The dotted quad in s[from, to) as an unsigned 32-bit value, or -1. */
    static long v4(String s, int from, int to) {
        long v = 0;
        int i = from;
        for (int octet = 0; octet < 4; octet++) {
            if (octet > 0) {
                if (i >= to || s.charAt(i) != '.') {
                    return -1;
                }
                i++;
            }
            int start = i, value = 0;
            while (i < to && s.charAt(i) >= '0' && s.charAt(i) <= '9') {
                if (i - start == 3) {
                    return -1;
                }
                value = value * 10 + (s.charAt(i) - '0');
                i++;
            }
            int digits = i - start;
            if (digits == 0 || value > 255 || (digits > 1 && s.charAt(start) == '0')) {
                return -1;
            }
            v = (v << 8) | value;
        }
        return i == to ? v : -1;
    }

    private static int hexValue(char c) {
        if (c >= '0' && c <= '9') {
            return c - '0';
        }
        if (c >= 'a' && c <= 'f') {
            return c - 'a' + 10;
        }
        if (c >= 'A' && c <= 'F') {
            return c - 'A' + 10;
        }
        return -1;
    }

    /** The eight 16-bit groups of an IPv6 text, or null (CPython's rules, class comment). */
    static int[] v6(String s) {
        int n = s.length();
        if (n < 2 || n > 45) {
            return null;
        }
        // the colon-separated parts; a dotted quad may only be the last one, and counts as two
        int parts = 1;
        for (int i = 0; i < n; i++) {
            if (s.charAt(i) == ':') {
                parts++;
            }
        }
        if (parts < 3) {
            return null;
        }
        int lastColon = s.lastIndexOf(':');
        int end = n;              // the hex parts end here; a dotted quad after the last colon, if any
        long quad = -1;
        if (s.indexOf('.', lastColon + 1) >= 0) {
            quad = v4(s, lastColon + 1, n);
            if (quad < 0) {
                return null;
            }
            end = lastColon;
        }
        int total = parts + (quad >= 0 ? 1 : 0);
        if (total > 9) {
            return null;
        }
        int[] vals = new int[total];
        int count = 0;
        int skip = -1;
        int start = 0;
        // walk the parts before `end` (all of them when there is no quad)
        for (int i = 0; i <= end; i++) {
            if (i == end || s.charAt(i) == ':') {
                int len = i - start;
                if (len == 0) {
                    vals[count] = -1;               // an empty part
                } else if (len > 4) {
                    return null;
                } else {
                    int v = 0;
                    for (int k = start; k < i; k++) {
                        int h = hexValue(s.charAt(k));
                        if (h < 0) {
                            return null;
                        }
                        v = (v << 4) | h;
                    }
                    vals[count] = v;
                }
                count++;
                start = i + 1;
                if (i == end) {
                    break;
                }
            }
        }
        if (quad >= 0) {
            vals[count++] = (int) (quad >>> 16);
            vals[count++] = (int) (quad & 0xffff);
        }
        // vals[0..count) are the parts, count == total
        for (int i = 1; i < count - 1; i++) {
            if (vals[i] == -1) {
                if (skip >= 0) {
                    return null;                    // a second `::`
                }
                skip = i;
            }
        }
        int hi, lo, skipped;
        if (skip >= 0) {
            hi = skip;
            lo = count - skip - 1;
            if (vals[0] == -1) {
                hi--;
                if (hi != 0) {
                    return null;                    // a leading ':' that is not '::'
                }
            }
            if (vals[count - 1] == -1) {
                lo--;
                if (lo != 0) {
                    return null;                    // a trailing ':' that is not '::'
                }
            }
            skipped = 8 - (hi + lo);
            if (skipped < 1) {
                return null;
            }
        } else {
            if (count != 8 || vals[0] == -1 || vals[count - 1] == -1) {
                return null;
            }
            hi = 8;
            lo = 0;
            skipped = 0;
        }
        int[] g = new int[8];
        int at = 0;
        for (int i = 0; i < hi; i++) {
            if (vals[i] < 0) {
                return null;                        // an empty part that is not the `::`
            }
            g[at++] = vals[i];
        }
        at += skipped;
        for (int i = count - lo; i < count; i++) {
            if (vals[i] < 0) {
                return null;
            }
            g[at++] = vals[i];
        }
        return g;
    }
}
