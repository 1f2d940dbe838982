package ccselect.udf;

import org.apache.spark.sql.api.java.UDF1;

/**
 * ccs_is_ip(text): whether ccs_ip (IpAddress.java) gives the text a family, that is whether it is
 * an address; false (never null) for null. The same parse, without building the struct: jobs/parse.py's
 * `bad_ip` rule asks it of every line (a struct-valued function there made the transport parse's
 * generated code pass the JVM's 64 KB a method, and Spark ran the stage interpreted).
 */
public final class IsIp implements UDF1<String, Boolean> {
    private static final long serialVersionUID = 1L;

    @Override
    public Boolean call(String s) {
        if (s == null) {
            return false;
        }
        return s.indexOf(':') < 0 ? IpAddress.v4(s, 0, s.length()) >= 0 : IpAddress.v6(s) != null;
    }
}
