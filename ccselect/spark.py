"""The one Spark session factory: `local[*]` or a cluster, with Delta Lake configured.

Delta's jars come from Maven Central via `spark.jars.packages` (delta-spark 4.4.0's
`configure_spark_with_delta_pip`); `python -m ccselect.spark --warm` fetches them once.

Object storage (s3a:// paths): `spark.extra_packages` names `org.apache.hadoop:hadoop-aws` at the
version of the Hadoop client pyspark bundles (3.5.0 for pyspark 4.2). Maven gives hadoop-aws the
AWS SDK v2 `bundle`, one 686 MB jar of every AWS service, which each executor would fetch from the
driver; instead it is excluded and the two SDK modules S3A loads are named (`S3A_SDK_MODULES`, found
by running: without s3-transfer-manager the first write fails with ClassNotFoundException
software.amazon.awssdk.transfer.s3.model.ObjectTransfer), 18 MB in all. With
`object_store.endpoint` set, S3A is pointed at it (path-style, region, TLS only for https).
Credentials are never in the configuration: S3A's provider (`fs.s3a.aws.credentials.provider`, the
SDK v2's default chain in the shipped files) finds them in the environment, a profile or the
instance's role.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import zipfile
from typing import TYPE_CHECKING

from ccselect import spark_cds
from ccselect.config import Config, load_config
# Imported inside the functions that use them (heavy, not needed to import this module): delta, pyspark.

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSIONS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

HADOOP_AWS = "org.apache.hadoop:hadoop-aws:"
#: hadoop-aws version → the AWS SDK v2 version its pom names (hadoop-project's aws-java-sdk-v2.version)
AWS_SDK_FOR_HADOOP = {"3.5.0": "2.35.4"}
#: the SDK v2 modules S3A needs (their own dependencies come with them)
S3A_SDK_MODULES = ("software.amazon.awssdk:s3", "software.amazon.awssdk:s3-transfer-manager")
#: left out of the resolution when hadoop-aws is in: the SDK's all-services bundle; its Netty HTTP
#: client and with it Netty 4.1 (S3A's clients use the Apache one; Spark ships Netty 4.2); a second
#: Hadoop client (3.4.2, asked for by Delta's Unity Catalog module) beside the one pyspark ships
S3A_EXCLUDES = ("software.amazon.awssdk:bundle", "software.amazon.awssdk:netty-nio-client",
                "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime")
#: S3A keys that would put a secret into the configuration
S3A_SECRETS = ("fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token")

#: Our JVM functions (jvm/src, Java against Spark's API): built into one jar by `udf_jar` and handed
#: to spark-submit as `--jars` (`submit_args`): on the driver's classpath, and fetched from the
#: driver by a cluster's executors like the Maven packages' jars
JVM_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jvm", "src")
JVM_JAR = os.path.join(os.path.dirname(JVM_SRC), "build", "ccselect-udf.jar")
#: SQL name → (class, return type) of each function `register_udfs` declares
JSON_PLAIN, IS_IP, IP, SPLIT_LINES = "ccs_json_plain", "ccs_is_ip", "ccs_ip", "ccs_split_lines"
UDFS = {JSON_PLAIN: ("ccselect.udf.JsonPlain", "int"), IS_IP: ("ccselect.udf.IsIp", "boolean"),
        SPLIT_LINES: ("ccselect.udf.SplitLines", "array<binary>"),
        IP: ("ccselect.udf.IpAddress", "struct<family:int,text:string,packed:binary,hex:string,v4_int:bigint,"
                                       "prefix16:string,prefix24:string,prefix48:string,prefix64:string>")}


def pyspark_hadoop_version() -> str:
    """The version of the Hadoop client jars pyspark ships (hadoop-client-api-<v>.jar)."""
    import pyspark
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    for name in os.listdir(jars):
        if name.startswith("hadoop-client-api-") and name.endswith(".jar"):
            return name[len("hadoop-client-api-"):-len(".jar")]
    raise RuntimeError(f"no hadoop-client-api jar in {jars}")


def packages(extra: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(Maven packages besides Delta's, exclusions) for `spark.extra_packages`: hadoop-aws gets
    the SDK modules S3A needs instead of the SDK's bundle."""
    extra = list(extra)
    aws = [p for p in extra if p.startswith(HADOOP_AWS)]
    if not aws:
        return extra, []
    version = aws[0][len(HADOOP_AWS):]
    if version != (have := pyspark_hadoop_version()):
        raise ValueError(f"spark.extra_packages names hadoop-aws {version}, but pyspark ships Hadoop {have}: "
                         f"S3A must be the same version as the Hadoop client (use {HADOOP_AWS}{have})")
    if version not in AWS_SDK_FOR_HADOOP:
        raise ValueError(f"no AWS SDK version known for hadoop-aws {version} (known: {', '.join(AWS_SDK_FOR_HADOOP)})")
    sdk = [f"{m}:{AWS_SDK_FOR_HADOOP[version]}" for m in S3A_SDK_MODULES]
    return extra + [m for m in sdk if m not in extra], list(S3A_EXCLUDES)


def udf_jar() -> str:
    """The jar of jvm/src, compiled (javac, against the Spark API jar pyspark ships) when it is
    missing or older than a source file; written to a temporary name and renamed, so a process
    building it beside another never loads half a jar."""
    import pyspark

    sources = sorted(glob.glob(os.path.join(JVM_SRC, "**", "*.java"), recursive=True))
    if not sources:
        raise FileNotFoundError(f"no Java sources under {JVM_SRC}")
    if os.path.exists(JVM_JAR) and os.path.getmtime(JVM_JAR) >= max(os.path.getmtime(s) for s in sources):
        return JVM_JAR
    api = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-sql-api_*.jar"))
    os.makedirs(os.path.dirname(JVM_JAR), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ccs-jvm-", dir=os.path.dirname(JVM_JAR)) as tmp:
        classes = os.path.join(tmp, "classes")
        # (javac comes with the JDK: the Makefile's Debian packages name openjdk-17-jdk-headless)
        done = subprocess.run(["javac", "--release", "17", "-nowarn", "-d", classes, "-cp", os.pathsep.join(api), *sources],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"javac failed building {JVM_JAR}:\n{done.stderr}")
        part = os.path.join(tmp, "udf.jar")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for root, _, names in os.walk(classes):
                for name in sorted(names):
                    path = os.path.join(root, name)
                    jar.write(path, os.path.relpath(path, classes))
        os.replace(part, JVM_JAR)
    return JVM_JAR


def submit_args(current: str, jar: str) -> str:
    """`PYSPARK_SUBMIT_ARGS` (`current`, pyspark's default "pyspark-shell" when unset) with `jar`
    in its `--jars`. Not `spark.jars` in the session's conf: pyspark sets its conf on the
    SparkContext after spark-submit has merged `spark.jars` with the jars `spark.jars.packages`
    resolved, so a `spark.jars` there would drop Delta's jars from every executor."""
    args = shlex.split(current or "pyspark-shell")
    for i, a in enumerate(args):
        # the list is the next argument (--jars a,b) or this one's value (--jars=a,b)
        at, skip = (i + 1, 0) if a == "--jars" and i + 1 < len(args) else (i, len("--jars="))
        if at > i or a.startswith("--jars="):
            if jar not in args[at][skip:].split(","):
                args[at] += f",{jar}"
            return shlex.join(args)
    return shlex.join(["--jars", jar, *args])


def register_udfs(spark: "SparkSession") -> None:
    """Declare our JVM functions (`UDFS`) in `spark`'s session (temporary functions are per session;
    declaring one again replaces it)."""
    for name, (cls, returns) in UDFS.items():
        spark.udf.registerJavaFunction(name, cls, returns)


def register_json_record(spark: "SparkSession", name: str, record_type: str) -> None:
    """Declare `name` as `ccselect.udf.JsonRecord` returning struct<plain:int, record:`record_type`>
    (a DDL struct type: its return type depends on the record's fields, so it is not in `UDFS`)."""
    spark.udf.registerJavaFunction(name, "ccselect.udf.JsonRecord", f"struct<plain:int,record:{record_type}>")


def object_store_conf(cfg: Config) -> dict[str, str]:
    """S3A's settings for `object_store` (none without an endpoint: S3A's own defaults, AWS)."""
    st = cfg.settings.object_store
    if not st.endpoint:
        return {}
    return {"spark.hadoop.fs.s3a.endpoint": st.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": st.region,
            "spark.hadoop.fs.s3a.path.style.access": str(st.path_style).lower(),
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(st.endpoint.startswith("https://")).lower()}


def get_spark(cfg: Config | None = None, app_name: str | None = None,
              overrides: dict[str, str] | None = None, master: str | None = None,
              cds: str | None = None) -> "SparkSession":
    """Build (or return the active) SparkSession for `cfg` (on `master` instead of the configured
    one when given), Delta Lake enabled; S3A set up for `object_store` (the file's own
    `spark.conf` wins over what is derived from it). A new driver maps the class archive
    (spark_cds.py) when there is one; `cds` replaces those JVM options (the warm-up's dump)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    cfg = cfg or load_config()
    sc = cfg.settings.spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master or sc.master).appName(app_name or sc.app_name)
    conf = {**DELTA_EXTENSIONS, **object_store_conf(cfg), **{k: str(v) for k, v in sc.conf.items()},
            **(overrides or {})}
    if secret := [k for k in conf if k.removeprefix("spark.hadoop.") in S3A_SECRETS]:
        raise ValueError(f"{cfg.path}: {', '.join(secret)} would put a secret into the configuration; "
                         "S3A's credentials provider finds them in the environment (AWS_ACCESS_KEY_ID, ...)")
    conf.setdefault("spark.sql.warehouse.dir", os.path.join(cfg.data_root, "spark-warehouse"))
    # Derby (a Hive metastore) only ever keeps local files
    derby = f"-Dderby.system.home={os.path.join(cfg.data_root, 'derby')}" if "://" not in cfg.data_root else ""
    mapped = spark_cds.use_options()
    cds = mapped if cds is None else cds
    if derby or cds:
        conf["spark.driver.extraJavaOptions"] = " ".join(
            o for o in (derby, cds, conf.get("spark.driver.extraJavaOptions", "")) if o)
    if mapped and spark_cds.executors_here(master or sc.master):    # a standalone master on this machine
        conf["spark.executor.extraJavaOptions"] = " ".join(
            o for o in (mapped, conf.get("spark.executor.extraJavaOptions", "")) if o)
    # read when pyspark starts the JVM (the first session of a process)
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(os.environ.get("PYSPARK_SUBMIT_ARGS", ""), udf_jar())
    extra, excludes = packages(sc.extra_packages)
    if excludes:
        conf["spark.jars.excludes"] = ",".join(filter(None, (conf.get("spark.jars.excludes"), *excludes)))
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = configure_spark_with_delta_pip(builder, extra_packages=extra)
    spark = quiet_launch(builder.getOrCreate)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: set (to anything but "" or "0") to see what the JVM prints while it starts (issue 57, item 8)
VERBOSE_ENV = "CCS_SPARK_VERBOSE"
_LAUNCHED = b"\0ccs-spark-launched\n"


def quiet_launch(create):
    """`create()` (the session's getOrCreate) with what the JVM prints while it starts — spark-
    submit's dependency resolution for `spark.jars.packages`, about 90 lines on stderr before every
    command's answer — held back, and shown only if the start fails. The JVM's stderr is a pipe from
    then on; a thread forwards what comes after the start to this process's stderr as it was.
    Nothing changes when a JVM is already up, or with CCS_SPARK_VERBOSE set."""
    from pyspark import SparkContext
    if os.environ.get(VERBOSE_ENV, "") not in ("", "0") or SparkContext._gateway is not None:
        return create()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):          # no stderr to redirect
        return create()
    out = os.dup(saved)                    # where the JVM's later lines go (the thread's own copy)
    r, w = os.pipe()
    held: list[bytes] = []
    started = threading.Event()

    def pump():
        with os.fdopen(r, "rb") as src:
            for line in src:
                if not started.is_set():
                    if line == _LAUNCHED:
                        started.set()
                    else:
                        held.append(line)
                    continue
                try:
                    os.write(out, line)
                except OSError:
                    pass

    t = threading.Thread(target=pump, name="ccs-jvm-stderr", daemon=True)
    t.start()
    os.dup2(w, 2)
    try:
        session = create()
    except BaseException:
        os.dup2(saved, 2)
        os.close(w)                        # the JVM may still hold the pipe: show what came so far
        t.join(timeout=2)
        for line in held:
            os.write(saved, line)
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    os.write(w, b"\n" + _LAUNCHED)        # after a partial line, the marker is a line of its own
    os.close(w)
    return session


@contextlib.contextmanager
def conf_set(spark: "SparkSession", conf: dict[str, str]):
    """Session settings `conf` for the duration of the block; each is restored (or unset) after."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def session_for(config: str | None, app_name: str) -> tuple[Config, "SparkSession"]:
    """The configuration named on a command line (or the default) and its Spark session."""
    cfg = load_config(config)
    return cfg, get_spark(cfg, app_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Spark session factory utilities")
    ap.add_argument("--warm", action="store_true",
                    help="start a session once so Delta's jars (and spark.extra_packages) are fetched")
    ap.add_argument("--config", default=None)
    args = ap.parse_args(argv)
    if args.warm:
        warm(load_config(args.config))
        print("spark + delta ready")
    return 0


def warm(cfg: Config) -> None:
    """Fetch the configuration's jars into the local Ivy cache and check they load: a Delta table
    written under a local data root; with a remote one (object storage, a cluster that may not be
    up yet) a session of this machine alone writes it to a temporary folder, and S3A's file system
    class must load when hadoop-aws is configured."""
    from pyspark import SparkContext

    if "://" not in cfg.data_root:
        # a fresh driver archives the classes it loaded as it exits (spark_cds.py): a Delta write,
        # a read and an aggregation load most of what every job's driver loads
        target = spark_cds.dump_target() if SparkContext._gateway is None else None
        spark = get_spark(cfg, app_name="ccs-warm", cds=spark_cds.dump_options(target) if target else None)
        proc = getattr(SparkContext._gateway, "proc", None)
        path = os.path.join(cfg.data_root, "tmp", "warm_delta")
        spark.range(3).write.format("delta").mode("overwrite").save(path)
        spark.read.format("delta").load(path).selectExpr("id % 2 as k").groupBy("k").count().collect()
        spark.stop()
        if target and proc is not None:
            spark_cds.finish(proc, target)
        return
    with tempfile.TemporaryDirectory(prefix="ccs-warm-") as tmp:
        spark = get_spark(cfg, app_name="ccs-warm", master="local[1]",
                          overrides={"spark.sql.warehouse.dir": os.path.join(tmp, "warehouse")})
        try:
            spark.range(3).write.format("delta").mode("overwrite").save(os.path.join(tmp, "warm_delta"))
            if any(p.startswith(HADOOP_AWS) for p in cfg.settings.spark.extra_packages):
                jvm = spark.sparkContext._jvm
                jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", spark.sparkContext._jsc.hadoopConfiguration())
        finally:
            spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
