"""The one Spark session factory: `local[*]` or a cluster, with Delta Lake configured.

Delta's jars come from Maven Central via `spark.jars.packages` (delta-spark 4.4.0's
`configure_spark_with_delta_pip`); `python -m ccselect.spark --warm` fetches them once.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING

from ccselect.config import Config, load_config
# Imported inside the functions that use them (heavy, not needed to import this module): delta, pyspark.

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSIONS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def get_spark(cfg: Config | None = None, app_name: str | None = None,
              overrides: dict[str, str] | None = None) -> "SparkSession":
    """Build (or return the active) SparkSession for `cfg`, Delta Lake enabled."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    cfg = cfg or load_config()
    sc = cfg.settings.spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(sc.master).appName(app_name or sc.app_name)
    conf = {**DELTA_EXTENSIONS, **{k: str(v) for k, v in sc.conf.items()}, **(overrides or {})}
    conf.setdefault("spark.sql.warehouse.dir", os.path.join(cfg.data_root, "spark-warehouse"))
    derby = f"-Dderby.system.home={os.path.join(cfg.data_root, 'derby')}"
    conf["spark.driver.extraJavaOptions"] = " ".join(
        o for o in (derby, conf.get("spark.driver.extraJavaOptions", "")) if o)
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = configure_spark_with_delta_pip(builder, extra_packages=list(sc.extra_packages))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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
    ap.add_argument("--warm", action="store_true", help="start a session once so Delta's jars are fetched")
    ap.add_argument("--config", default=None)
    args = ap.parse_args(argv)
    if args.warm:
        spark = get_spark(load_config(args.config), app_name="ccs-warm")
        spark.range(3).write.format("delta").mode("overwrite").save(
            os.path.join(load_config(args.config).data_root, "tmp", "warm_delta"))
        spark.stop()
        print("spark + delta ready")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
