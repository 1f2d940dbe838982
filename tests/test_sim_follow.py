"""The reacting fleet's simulator side (sim/follow.py, issue 58): a node-hour whose CCs a chooser
gives from what the agent sees. No agent here (tests/kernel/test_rollout_follow.py rolls out
through real ones); the chooser below is the kernel's A/B split written out by hand."""
from __future__ import annotations

import hashlib
import ipaddress
import zlib

import numpy as np
import pytest

from ccselect.sim.follow import Choice
from ccselect.sim.params import SimParams
from ccselect.sim.traffic import generate_node_hour
from ccselect.sim.world import World

RETRANS = ("total_retrans", "data_segs_out")


def _digest(world, nodes=2, hours=2):
    h = hashlib.sha256()
    for n in range(nodes):
        for hr in range(hours):
            nh = generate_node_hour(world, n, hr)
            assert nh.follow is None
            for df in (nh.transport, nh.access, nh.qoe, nh.truth):
                h.update(df.write_csv().encode())
    return h.hexdigest()


def _odd(ips):
    return np.array([zlib.crc32(ipaddress.ip_address(ip).packed) & 1 for ip in ips], dtype=bool)


def ab_chooser(conns):
    odd = _odd(conns.client_ip)
    return Choice(np.where(odd, "bbr", "cubic"), np.where(odd, "table", "ab_control"),
                  np.where(odd, "ab-bbr", "ab-cubic"))


@pytest.mark.parametrize("mode", ["ab", "default"])
def test_the_mode_off_is_the_fleet_it_was(mode):
    """Same seed, same bytes, with the chooser not given; the follow mode's passes leave no state."""
    p = SimParams(nodes=2, hours=2, conns_per_node_hour=200, seed=11, cc_mode=mode)
    first = _digest(World(p))
    generate_node_hour(World(p), 0, 0, chooser=ab_chooser)
    assert _digest(World(p)) == first


def test_a_chooser_that_splits_like_ab_mode_gives_ab_modes_connections():
    """Only what the CC decides moves: every column but the retransmission draws (one stream per
    connection in this mode) is the ab mode's, the truth included."""
    w = World(SimParams(nodes=2, hours=1, conns_per_node_hour=800, seed=3, cc_mode="ab"))
    a, f = generate_node_hour(w, 1, 0), generate_node_hour(w, 1, 0, chooser=ab_chooser)
    assert f.follow == {"passes": 2, "decided_off_start": 0}
    ta, tf_ = a.transport.sort("conn_id"), f.transport.sort("conn_id")
    keep = [c for c in ta.columns if c not in RETRANS]
    assert ta.select(keep).equals(tf_.select(keep))
    assert a.truth.equals(f.truth) and a.qoe.equals(f.qoe) and a.access.equals(f.access)
    assert (tf_["data_segs_out"] - tf_["total_retrans"]).equals(ta["data_segs_out"] - ta["total_retrans"])


def test_a_table_swap_changes_only_connections_accepted_after_it():
    """The node swaps from all-cubic to all-bbr at minute 30: connections accepted before stay
    exactly as the all-cubic hour logged them (regenerating an hour never rewrites its past),
    the ones after run bbr, and each connection's logged decision is the one at its accept."""
    w = World(SimParams(nodes=1, hours=1, conns_per_node_hour=1500, seed=5, cc_mode="default"))
    swap = w.hour_start_ms(0) + 30 * 60_000

    def table(at):
        def choose(conns):
            after = conns.accept_ms >= at
            return Choice(np.where(after, "bbr", "cubic"), np.where(after, "table", "default"),
                          np.where(after, "2", "1"))
        return choose
    before = generate_node_hour(w, 0, 0, chooser=table(2 ** 62)).transport
    swapped = generate_node_hour(w, 0, 0, chooser=table(swap))
    t = swapped.transport
    assert swapped.follow["decided_off_start"] == 0
    early = t.filter(t["ts_start_ms"] < swap)
    late = t.filter(t["ts_start_ms"] >= swap)
    assert early.height > 300 and late.height > 300
    assert early.equals(before.filter(before["conn_id"].is_in(early["conn_id"].implode())).select(early.columns))
    assert set(late["cc"]) == {"bbr"} and set(late["table_version"]) == {"2"}
    assert set(early["cc"]) == {"cubic"} and set(early["table_version"]) == {"1"}


def test_a_chooser_naming_a_cc_the_simulator_does_not_model_is_refused():
    w = World(SimParams(nodes=1, hours=1, conns_per_node_hour=100, seed=1))

    def reno(conns):
        n = len(conns.client_ip)
        return Choice(np.full(n, "reno"), np.full(n, "table"), np.full(n, "1"))
    with pytest.raises(ValueError, match=r"models \['bbr', 'cubic'\] only, a chooser gave \['reno'\]"):
        generate_node_hour(w, 0, 0, chooser=reno)
