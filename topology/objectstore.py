"""The object store of the one-machine topology: s3proxy, a real S3 server (org.gaul:s3proxy from
Maven Central, its jar with dependencies, checked against a pinned sha256), over a folder under
`<cluster.home>/objectstore/data` (jclouds' filesystem-nio2 provider).

It speaks S3's REST API with AWS signature v2/v4 authentication, path-style buckets, on the port
of `object_store.endpoint`. It listens on every address of the machine (0.0.0.0), so the edge
hosts in their network namespaces reach it at their veth's host side (topology/edges.py); every
request must be signed with the store's key. The key pair is generated at the first `up` into
`credentials.json` (mode 600) beside the data, never into the repository or the configuration;
clients get it as the AWS SDKs' standard environment variables (`client_env`), as an instance role
or a profile would give them in production."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import urllib.request
from pathlib import Path

from ccselect import files
from ccselect.config import Config

from ccselect.topology import address, home
from ccselect.topology.proc import ClusterError, Server, free_port

#: the jar with its dependencies of each s3proxy version we run, and its sha256
JARS = {"4.1.0": "a4d025969aaf796616ed4b1e2491d87d455ce84bb28cb9db086b2e6aaa68b48d"}
MAVEN = "https://repo1.maven.org/maven2/org/gaul/s3proxy/{v}/s3proxy-{v}-jar-with-dependencies.jar"


def _dir(cfg: Config) -> Path:
    return Path(home(cfg)) / "objectstore"


def servers(cfg: Config) -> list[Server]:
    if not cfg.settings.object_store.endpoint:
        return []
    host, port = address(cfg.settings.object_store.endpoint, 80)
    return [Server("s3proxy", _dir(cfg), port, host)]


def jar(version: str) -> Path:
    """s3proxy's jar in the user's cache (~/.cache/ccselect), fetched from Maven Central once."""
    if version not in JARS:
        raise ClusterError(f"no pinned sha256 for s3proxy {version} (known: {', '.join(JARS)})")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ccselect"
    path = cache / f"s3proxy-{version}-jar-with-dependencies.jar"
    if path.exists() and _sha256(path) == JARS[version]:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".part")
    os.close(fd)
    try:
        with urllib.request.urlopen(MAVEN.format(v=version), timeout=120) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out)
        if (got := _sha256(Path(tmp))) != JARS[version]:
            raise ClusterError(f"s3proxy {version} from Maven Central has sha256 {got}, not {JARS[version]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def credentials(cfg: Config, create: bool = False) -> dict | None:
    """The store's key pair ({"access_key", "secret_key"}), generated once when `create`."""
    path = _dir(cfg) / "credentials.json"
    if path.exists():
        return json.loads(path.read_text())
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    cred = {"access_key": "ccs" + secrets.token_hex(8), "secret_key": secrets.token_urlsafe(30)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cred, f)
    return cred


def client_env(cfg: Config) -> dict[str, str]:
    """The AWS SDKs' standard variables for this store: the key pair (when the topology made one;
    otherwise the environment's own or the SDK's chain stays in charge), region, endpoint (boto3's
    AWS_ENDPOINT_URL, MLflow's MLFLOW_S3_ENDPOINT_URL)."""
    st = cfg.settings.object_store
    env = {"AWS_DEFAULT_REGION": st.region, "AWS_REGION": st.region}
    if st.endpoint:
        env.update({"AWS_ENDPOINT_URL": st.endpoint, "MLFLOW_S3_ENDPOINT_URL": st.endpoint})
    if cfg.settings.cluster.home and (cred := credentials(cfg)):
        env.update({"AWS_ACCESS_KEY_ID": cred["access_key"], "AWS_SECRET_ACCESS_KEY": cred["secret_key"]})
    return env


def client(cfg: Config):
    """A boto3 S3 client for the store, with the topology's key pair when it made one."""
    env = client_env(cfg)
    return files.s3_client(cfg, env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"))


def _properties(cfg: Config, port: int, cred: dict) -> Path:
    d = _dir(cfg)
    data = d / "data"
    data.mkdir(parents=True, exist_ok=True)
    props = d / "s3proxy.conf"
    props.write_text("\n".join([
        f"s3proxy.endpoint=http://0.0.0.0:{port}",
        "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={cred['access_key']}",
        f"s3proxy.credential={cred['secret_key']}",
        "jclouds.provider=filesystem-nio2",
        f"jclouds.filesystem.basedir={data}",
        "",
    ]))
    os.chmod(props, 0o600)
    return props


def up(cfg: Config, env: dict[str, str]) -> None:
    """Start s3proxy (when not running) and create the configured buckets that are missing."""
    if not (srv := servers(cfg)):
        raise ClusterError(f"{cfg.path}: object_store.endpoint is not set")
    s = srv[0]
    if not s.running():
        free_port(s.host, s.port)
        cred = credentials(cfg, create=True)
        props = _properties(cfg, s.port, cred)
        java = shutil.which("java", path=os.path.join(env["JAVA_HOME"], "bin")) if env.get("JAVA_HOME") else None
        s.start([java or "java", "-Xmx512m", "-jar", str(jar(cfg.settings.cluster.s3proxy_version)),
                 "--properties", str(props)], env=env, timeout=90)
    s3 = client(cfg)
    have = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    for bucket in cfg.settings.cluster.buckets:
        if bucket not in have:
            s3.create_bucket(Bucket=bucket)


def buckets(cfg: Config) -> dict[str, int]:
    """Objects per bucket (for `status`)."""
    s3 = client(cfg)
    out = {}
    for b in s3.list_buckets().get("Buckets", []):
        n = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=b["Name"]):
            n += page.get("KeyCount", 0)
        out[b["Name"]] = n
    return out

