package ccselect.udf;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;

/**
 * ccs_json_record_&lt;stream&gt;(text, fields): `ccs_json_plain`'s answer and, for a line it calls
 * plain that is also simple, the record itself — struct&lt;plain:int, record:struct&lt;the fields&gt;&gt;;
 * `fields` as JsonPlain's ("name:s,name:i,...", the record's fields in order). Null text gives
 * null.
 *
 * Simple: every value (of a field or not) a string with no backslash and no control character,
 * an integer of at most 18 digits, true, false or null; no key with a control character. For such
 * a plain line the record is exactly what from_json reads with the same schema (the strings as
 * they stand, the integers as longs, an absent or null field null), in the same pass over the
 * characters; the record is null for any other line, and the caller reads it with from_json
 * (jobs/parse.py). from_json creates a JSON parser, and a reader with its own buffer, for every
 * line: on the access log that was about a third of the parse-and-write time.
 */
public final class JsonRecord implements UDF2<String, String, Row> {
    private static final long serialVersionUID = 1L;

    private final JsonPlain scanner = new JsonPlain();

    @Override
    public Row call(String s, String spec) {
        if (s == null) {
            return null;
        }
        Object[] out = new Object[scanner.fieldCount(spec)];
        int plain = scanner.scan(s, spec, out);
        return RowFactory.create(plain, plain == JsonPlain.PLAIN && scanner.simple ? RowFactory.create(out) : null);
    }
}
