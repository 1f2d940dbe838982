"""Part `postgres`: Debian's PostgreSQL as the metadata database of Airflow and of MLflow.

One data directory under `<cluster.home>/postgres/data`, made once by initdb (bootstrap superuser
`postgres`, trust on loopback only); its address is the one the configuration's own URIs name
(`airflow.sql_alchemy_conn`, `mlflow.backend_store_uri`), and the role and databases those URIs
name are created at `up`. Postgres refuses to run as root, so under root (CI) every server-side
command runs as the Debian `postgres` user through `setpriv`, which execs: the pid file holds the
postmaster itself, in the foreground, not a wrapper.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from ccselect.config import Config

from ccselect.topology import address, home
from ccselect.topology.proc import ClusterError, Server, free_port, group_members
# Imported inside the functions that use them (heavy, not needed to import this module): psycopg2.

BIN_DIRS = ("/usr/lib/postgresql/15/bin",)   # Debian's versioned binaries; PATH is searched after
SUPERUSER = "postgres"                       # initdb's bootstrap role, also when not run as root
OS_USER = "postgres"                         # who runs the server when we are root

#: one machine, 2 cores: a small cache; every Airflow and MLflow process keeps a pool of connections
SERVER_CONF = {
    "shared_buffers": "32MB",
    "max_connections": "100",
    "work_mem": "4MB",
    "maintenance_work_mem": "32MB",
    "max_wal_size": "256MB",
    "unix_socket_directories": "''",      # TCP only: every client uses the configured host:port
    "log_destination": "'stderr'",        # into the server's log under its Server home
    "logging_collector": "off",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
    "timezone": "'UTC'",
}


class PostgresServer(Server):
    def stop(self, timeout: float = 30.0) -> bool:
        """Fast shutdown (SIGINT to the postmaster: sessions ended, no waiting for clients, a clean
        checkpoint), then the generic group kill for anything left."""
        pid = self.pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and group_members(pid):
                time.sleep(0.1)
        return super().stop(timeout=10.0) or pid is not None


def available() -> str | None:
    """The directory of Postgres's server binaries, or None when PostgreSQL is not installed."""
    for d in (*BIN_DIRS, *(os.environ.get("PATH", "").split(os.pathsep))):
        if d and all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres")):
            return d
    return None


def databases(cfg: Config) -> list[tuple[str, str]]:
    """(role, database) of every configured URI that points at this server."""
    out = []
    for uri in _uris(cfg):
        u = urlparse(uri)
        role, db = unquote(u.username or SUPERUSER), unquote(u.path.lstrip("/"))
        if not db:
            raise ClusterError(f"no database name in {uri!r}")
        out.append((role, db))
    return out


def _uris(cfg: Config) -> list[str]:
    s = cfg.settings
    uris = [u for u in (s.airflow.sql_alchemy_conn, s.mlflow.backend_store_uri)
            if u and urlparse(u).scheme.split("+")[0] in ("postgresql", "postgres")]
    if not uris:
        raise ClusterError(f"{cfg.path}: neither airflow.sql_alchemy_conn nor mlflow.backend_store_uri "
                           "is a postgresql:// URI, so there is no Postgres to start")
    hosts = {address(u, 5432) for u in uris}
    if len(hosts) > 1:
        raise ClusterError(f"{cfg.path}: the Postgres URIs name different servers {sorted(hosts)}; "
                           "the one-machine topology has one")
    return uris


def servers(cfg: Config) -> list[Server]:
    host, port = address(_uris(cfg)[0], 5432)
    return [PostgresServer("postgres", Path(home(cfg)) / "postgres", port, host)]


def data_dir(cfg: Config) -> Path:
    return servers(cfg)[0].home / "data"


def dsn(cfg: Config, dbname: str = "postgres", user: str = SUPERUSER) -> str:
    """A libpq connection string to this server (no password: the server trusts loopback)."""
    s = servers(cfg)[0]
    return f"host={s.host} port={s.port} dbname={dbname} user={user} connect_timeout=3"


def connect(cfg: Config, dbname: str = "postgres", user: str = SUPERUSER):
    import psycopg2
    conn = psycopg2.connect(dsn(cfg, dbname, user))
    conn.autocommit = True
    return conn


def accepts_connections(cfg: Config) -> bool:
    try:
        conn = connect(cfg)
    except Exception:  # starting up, shutting down, not listening: not ready
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    finally:
        conn.close()


# ---- server side --------------------------------------------------------------------------------

def _as_server_user() -> list[str]:
    """The prefix that runs a command as the Postgres user: nothing unless we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pw = pwd.getpwnam(OS_USER)
    except KeyError:
        raise ClusterError(f"running as root and there is no {OS_USER!r} user to run Postgres as") from None
    setpriv = shutil.which("setpriv")
    if setpriv:  # execs: the pid we record is the postmaster's
        return [setpriv, f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--"]
    return [shutil.which("runuser") or "runuser", "-u", OS_USER, "--"]


def _reachable_by(path: Path, pw) -> bool:
    st = path.stat()
    if st.st_uid == pw.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == pw.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _give_to_server_user(cfg: Config, data: Path) -> None:
    """As root: let the Postgres user reach `data` (search permission on the folders under
    cluster.home, which we made) and own it; a folder above cluster.home that it cannot pass is
    reported, not changed."""
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(OS_USER)
    top = Path(home(cfg)).resolve()
    for d in [*reversed(data.parent.resolve().parents), data.parent.resolve()]:
        if _reachable_by(d, pw):
            continue
        if d == top or top in d.parents:
            d.chmod(d.stat().st_mode | stat.S_IXOTH)
        else:
            raise ClusterError(f"the {OS_USER} user cannot enter {d} (mode {stat.filemode(d.stat().st_mode)}), "
                               f"on the way to {data}; choose a cluster.home it can reach or `chmod o+x {d}`")
    os.chown(data, pw.pw_uid, pw.pw_gid)


def init(cfg: Config) -> Path:
    """initdb once, then (every time) the configuration for this machine and address."""
    bindir = available()
    if bindir is None:
        raise ClusterError("PostgreSQL's server binaries (initdb, postgres) are not installed "
                           "(Debian: apt-get install postgresql)")
    data = data_dir(cfg)
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        _give_to_server_user(cfg, data)
        r = subprocess.run([*_as_server_user(), os.path.join(bindir, "initdb"), "-D", str(data),
                            f"--username={SUPERUSER}", "--auth=trust", "--encoding=UTF8", "--locale=C",
                            "--no-instructions"], capture_output=True, text=True)
        if r.returncode != 0:
            raise ClusterError(f"initdb {data} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    else:
        _give_to_server_user(cfg, data)
    _configure(cfg, data)
    return data


def _configure(cfg: Config, data: Path) -> None:
    s = servers(cfg)[0]
    conf = {"listen_addresses": f"'{s.host}'", "port": str(s.port), **SERVER_CONF}
    _write_as_owner(data / "ccselect.conf",
                    "# Written by `ccs cluster up` (topology/postgres.py) at every start.\n"
                    + "".join(f"{k} = {v}\n" for k, v in conf.items()))
    main = data / "postgresql.conf"
    include = "include_if_exists = 'ccselect.conf'\n"
    if include not in (text := main.read_text()):
        _write_as_owner(main, f"{text}\n# ccselect's one-machine settings (topology/postgres.py)\n{include}")
    # trust on loopback only; any other address must authenticate
    loopback = s.host in ("127.0.0.1", "localhost", "::1")
    _write_as_owner(data / "pg_hba.conf", "\n".join([
        "# Written by `ccs cluster up` (topology/postgres.py): TCP only.",
        "# TYPE  DATABASE  USER  ADDRESS        METHOD",
        "host    all       all   127.0.0.1/32   trust",
        "host    all       all   ::1/128        trust",
        *([] if loopback else ["host    all       all   samenet        scram-sha-256"]),
        ""]))


def _write_as_owner(path: Path, text: str) -> None:
    path.write_text(text)
    if os.geteuid() == 0:  # the data directory's owner, the Postgres user, must read it
        st = path.parent.stat()
        os.chown(path, st.st_uid, st.st_gid)
    path.chmod(0o600)


def ensure_databases(cfg: Config) -> None:
    """The role and database of every configured URI, created when missing (the role may log in,
    and owns its database so that Airflow's and MLflow's migrations may create their tables)."""
    from psycopg2 import sql
    conn = connect(cfg)
    try:
        with conn.cursor() as cur:
            for role, db in databases(cfg):
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                if cur.fetchone() is None:
                    cur.execute(sql.SQL("CREATE DATABASE {} OWNER {} ENCODING 'UTF8'").format(
                        sql.Identifier(db), sql.Identifier(role)))
    finally:
        conn.close()


def start(cfg: Config, env: dict[str, str] | None = None, timeout: float = 60.0) -> int:
    data = init(cfg)
    server = servers(cfg)[0]
    if server.pid() is None:
        free_port(server.host, server.port)
    # the database needs none of the object store's credentials that the topology's environment carries
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("AWS_")}
    return server.start([*_as_server_user(), os.path.join(available(), "postgres"), "-D", str(data)],
                        env=env, cwd=str(server.home), timeout=timeout, ready=lambda: accepts_connections(cfg))


def up(cfg: Config, env: dict[str, str] | None = None) -> None:
    start(cfg, env)
    ensure_databases(cfg)


def restart(cfg: Config, env: dict[str, str] | None = None) -> float:
    """Fast shutdown and start again (the fault the clients must survive); → seconds it was down."""
    t0 = time.monotonic()
    servers(cfg)[0].stop()
    start(cfg, env)
    return time.monotonic() - t0
