"""Small files beside the lake (feature-statistics JSON, diagnosis reports) on a local disk or on
the object store, by the same path the configuration gives: `<data_root>/...` is a folder on one
machine and `s3a://bucket/...` (or `s3://`) on a cluster, where every host must see what the
training host wrote.

Local writes are atomic (a temporary file, then a rename); an S3 PUT of a whole object is atomic
too. S3 goes through boto3 with the configuration's `object_store` (endpoint, region, path-style)
and credentials from the environment or the SDK's standard chain, never from the configuration."""
from __future__ import annotations

import os
from urllib.parse import urlparse

from ccselect.config import Config
# Imported inside the functions that use them (heavy, not needed to import this module): boto3, botocore.

REMOTE = ("s3a://", "s3://")


def is_remote(path: str) -> bool:
    return str(path).startswith(REMOTE)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts]) if is_remote(base) else os.path.join(base, *parts)


def make_s3_client(endpoint: str | None, region: str | None, path_style: bool = True,
                   access_key: str | None = None, secret_key: str | None = None, **options):
    """A boto3 S3 client for an S3-compatible server; `options` go to botocore's Config (timeouts).
    Each client gets a session of its own: boto3's default session keeps the first credentials it
    found for the life of the process, so a key that changed since (rotated, another store) would
    be refused. Without a key pair, the environment or the SDK's standard chain gives it."""
    import boto3
    from botocore.config import Config as BotoConfig
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=BotoConfig(s3={"addressing_style": "path" if path_style else "auto"},
                          retries={"max_attempts": 5, "mode": "standard"}, **options))


def s3_client(cfg: Config, access_key: str | None = None, secret_key: str | None = None):
    """A boto3 S3 client for the configured object store (`make_s3_client`)."""
    st = cfg.settings.object_store
    return make_s3_client(st.endpoint, st.region, st.path_style, access_key, secret_key)


def is_missing(exc) -> bool:
    """Whether a botocore ClientError says the object (or key) is not there."""
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def _bucket_key(path: str) -> tuple[str, str]:
    u = urlparse(path)
    return u.netloc, u.path.lstrip("/")


def exists(cfg: Config, path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    from botocore.exceptions import ClientError
    bucket, key = _bucket_key(path)
    try:
        s3_client(cfg).head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as e:
        if is_missing(e):
            return False
        raise


def read_text(cfg: Config, path: str) -> str:
    if not is_remote(path):
        with open(path) as fh:
            return fh.read()
    bucket, key = _bucket_key(path)
    return s3_client(cfg).get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def write_text(cfg: Config, path: str, text: str) -> str:
    if is_remote(path):
        bucket, key = _bucket_key(path)
        s3_client(cfg).put_object(Bucket=bucket, Key=key, Body=text.encode())
        return path
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def upload_dir(cfg: Config, local_dir: str, remote_dir: str) -> list[str]:
    """Every file of `local_dir` (recursively) to `remote_dir`; → the remote paths."""
    s3 = s3_client(cfg)
    bucket, prefix = _bucket_key(remote_dir.rstrip("/") + "/")
    out = []
    for top, _, names in os.walk(local_dir):
        for name in sorted(names):
            src = os.path.join(top, name)
            key = prefix + os.path.relpath(src, local_dir).replace(os.sep, "/")
            s3.upload_file(src, bucket, key)
            out.append(f"{remote_dir.split('://', 1)[0]}://{bucket}/{key}")
    return out
