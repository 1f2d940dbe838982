package ccselect.udf;

import org.apache.spark.sql.api.java.UDF1;

/**
 * ccs_plain_ip(text): whether the text is an address in one of the forms nearly every log line
 * carries — a dotted quad without leading zeros, octets up to 255; IPv6 as 1 to 4 hex digit groups,
 * 8 of them, or at most 7 around one `::` — in one pass over its characters. False (never null)
 * means "some other text": a dotted-quad tail, a zone id, an IPv4-mapped form, garbage, which
 * jobs/parse.py then judges with ccselect.ipaddr.with_ip. Every text true here is one with_ip
 * accepts (tests/test_ingest_parse.py checks the two agree).
 */
public final class PlainIp implements UDF1<String, Boolean> {
    private static final long serialVersionUID = 1L;

    @Override
    public Boolean call(String s) {
        return s != null && (v4(s) || v6(s));
    }

    static boolean v4(String s) {
        int n = s.length();
        int i = 0;
        for (int octet = 0; octet < 4; octet++) {
            if (octet > 0) {
                if (i >= n || s.charAt(i) != '.') {
                    return false;
                }
                i++;
            }
            int start = i;
            int value = 0;
            while (i < n && i - start < 3 && s.charAt(i) >= '0' && s.charAt(i) <= '9') {
                value = value * 10 + (s.charAt(i) - '0');
                i++;
            }
            int digits = i - start;
            if (digits == 0 || value > 255 || (digits > 1 && s.charAt(start) == '0')) {
                return false;
            }
        }
        return i == n;
    }

    private static boolean hex(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }

    static boolean v6(String s) {
        int n = s.length();
        if (n < 2 || n > 39) {
            return false;
        }
        int i = 0;
        int groups = 0;
        boolean compressed = false;
        if (s.charAt(0) == ':') {
            if (s.charAt(1) != ':') {
                return false;
            }
            compressed = true;
            i = 2;
            if (i == n) {
                return true;
            }
        }
        while (true) {
            int start = i;
            while (i < n && i - start < 4 && hex(s.charAt(i))) {
                i++;
            }
            if (i == start) {
                return false;
            }
            groups++;
            if (i == n) {
                break;
            }
            if (s.charAt(i) != ':') {
                return false;
            }
            i++;
            if (i < n && s.charAt(i) == ':') {
                if (compressed) {
                    return false;
                }
                compressed = true;
                i++;
                if (i == n) {
                    break;
                }
            } else if (i == n) {
                return false;
            }
        }
        return compressed ? groups <= 7 : groups == 8;
    }
}
