"""The simulator's output pinned to the bytes: a small fleet's every file, and the follow mode's
node-hours, digested and compared with the digests the code wrote before a refactoring (issue 63:
`sim/traffic.py`'s node-hour split by stage with every random stream unchanged).

A change that is meant to move the fleet (a new draw, a grounded parameter: docs/simulator.md)
records new digests here and says so in its commit; so does an upgrade of numpy or polars that
changes how a number is drawn or written (requirements.lock pins both)."""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import zlib
from dataclasses import replace

import numpy as np

from ccselect.sim.fleet import simulate
from ccselect.sim.follow import Choice
from ccselect.sim.params import SimParams
from ccselect.sim.traffic import generate_node_hour
from ccselect.sim.world import World

#: recorded at commit 8c0bf55 (before generate_node_hour was split), by this file's functions
FLEET_DIGESTS = {
    "ab_fault": "2330b61ef5d006815258c7e0b9d588f42268e55c92201383ab8723ffa00b807d",
    "table_per_type_rotated": "5df535062a2cfeb36ade07ddf04ded46e1de859241be5d0b4ac47ac78687522b",
}
FOLLOW_DIGEST = "10a278e159c46703925ccfeae6a9b0a50cc394c10876f112455b1c43e5030712"


def _fleet_digest(out: str) -> str:
    """Every file `simulate` wrote under `out`, by relative path and bytes; the manifest without
    what is not the fleet (its wall time, the source's digest, the table's absolute path)."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(out):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, out)
            data = open(path, "rb").read()
            if rel == "manifest.json":
                m = json.loads(data)
                del m["seconds"], m["code_version"]
                if m["params"]["table_path"]:
                    m["params"]["table_path"] = os.path.basename(m["params"]["table_path"])
                data = json.dumps(m, sort_keys=True).encode()
            h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def _simulate_fleets(tmp) -> dict[str, str]:
    """Two small fleets between them through every branch of a node-hour: the A/B split with the
    planted MSS fault from hour 1 (hourly files); a CC table with A/B control, the pre-2026-11-28
    client window (`per_type_tables`) and the agent's 10-minute segments."""
    ab = SimParams(nodes=3, hours=2, conns_per_node_hour=150, seed=23, fault_mss_prefix16="auto", fault_start_hour=1)
    simulate(ab, str(tmp / "ab"), workers=1, progress=False)
    ips = []
    for folder, _, files in os.walk(tmp / "ab" / "transport"):
        for name in sorted(files):
            ips += [json.loads(line)["client_ip"] for line in open(os.path.join(folder, name))]
    nets = sorted({str(ipaddress.ip_network(f"{ip}/{48 if ':' in ip else 24}", strict=False)) for ip in ips})
    table = tmp / "table.csv"
    table.write_text("cidr,cc\n" + "".join(f"{c},{'bbr' if i % 3 else 'cubic'}\n" for i, c in enumerate(nets[::2])))
    tab = replace(ab, fault_mss_prefix16=None, cc_mode="table", table_path=str(table), table_ab=True,
                  client_window="per_type_tables")
    simulate(tab, str(tmp / "table"), workers=1, progress=False, rotate_minutes=10)
    return {"ab_fault": _fleet_digest(str(tmp / "ab")),
            "table_per_type_rotated": _fleet_digest(str(tmp / "table"))}


def _follow_digest() -> str:
    """The follow mode (a chooser: per-connection retransmission streams), a node-hour under the
    kernel's A/B split written out by hand, every frame as CSV."""
    def chooser(conns):
        odd = np.array([zlib.crc32(ipaddress.ip_address(ip).packed) & 1 for ip in conns.client_ip], dtype=bool)
        return Choice(np.where(odd, "bbr", "cubic"), np.where(odd, "table", "ab_control"),
                      np.where(odd, "ab-bbr", "ab-cubic"))
    w = World(SimParams(nodes=2, hours=1, conns_per_node_hour=200, seed=31, cc_mode="default"))
    h = hashlib.sha256()
    for node in range(2):
        nh = generate_node_hour(w, node, 0, chooser=chooser)
        h.update(json.dumps(nh.follow, sort_keys=True).encode())
        for df in (nh.transport, nh.access, nh.qoe, nh.truth):
            h.update(df.write_csv().encode())
    return h.hexdigest()


def test_a_small_fleet_is_the_bytes_it_was(tmp_path):
    assert _simulate_fleets(tmp_path) == FLEET_DIGESTS


def test_the_follow_modes_node_hours_are_the_bytes_they_were():
    assert _follow_digest() == FOLLOW_DIGEST
