package ccselect.udf;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

import org.apache.spark.sql.api.java.UDF1;

/**
 * ccs_split_lines(bytes): a whole file's bytes → its lines, each line's bytes without the '\n'
 * (array&lt;binary&gt;; jobs/sources.py explode_lines). A final '\n' ends the last line and does not
 * start another; an empty file has no lines; null gives null. '\r' stays in its line.
 *
 * The lines are cut at the byte 0x0A, which no multi-byte UTF-8 sequence contains. A line with a
 * byte over 0x7F is decoded and encoded again, as Spark's UTF8String.toString and fromString do:
 * bytes that are not UTF-8 become U+FFFD, exactly what the string functions this replaces gave
 * (`split(regexp_replace(value, '\n\z', ''), '\n', -1)`). Those decoded each whole file into a
 * Java String twice (the regex replace and then the split, each giving back UTF-8), and the
 * replace's regex tried every character of the file: on the access log that was about a tenth of
 * the stream's parse-and-write time.
 */
public final class SplitLines implements UDF1<byte[], byte[][]> {
    private static final long serialVersionUID = 1L;
    private static final byte[][] NONE = new byte[0][];

    @Override
    public byte[][] call(byte[] text) {
        if (text == null) {
            return null;
        }
        int n = text.length;
        if (n == 0) {
            return NONE;
        }
        int end = text[n - 1] == '\n' ? n - 1 : n;
        int count = 1;
        for (int i = 0; i < end; i++) {
            if (text[i] == '\n') {
                count++;
            }
        }
        byte[][] out = new byte[count][];
        int start = 0;
        int k = 0;
        boolean ascii = true;
        for (int i = 0; i < end; i++) {
            byte b = text[i];
            if (b == '\n') {
                out[k++] = line(text, start, i, ascii);
                start = i + 1;
                ascii = true;
            } else if (b < 0) {
                ascii = false;
            }
        }
        out[k] = line(text, start, end, ascii);
        return out;
    }

    private static byte[] line(byte[] text, int from, int to, boolean ascii) {
        if (ascii) {
            return Arrays.copyOfRange(text, from, to);
        }
        return new String(text, from, to - from, StandardCharsets.UTF_8).getBytes(StandardCharsets.UTF_8);
    }
}
