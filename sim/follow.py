"""The reacting fleet (issue 58): a node's traffic takes the CC its agent would give each
connection under the table live on the node at the connection's accept, so that the outcomes in
its logs follow what was deployed. The truth of every connection stays apart as always.

The simulator knows nothing of tables, agents or stores (it imports only ccselect/): it asks a
`Chooser` — given what the node's agent sees at PASSIVE_ESTABLISHED (the client's address and
port, the served port, the handshake features as the transport log records them, the accept
time) — for each connection's CC, decision and table version. The layer above provides the
chooser that mirrors the agent (flows/follow.py, over export/artifact/table_format.py).

How a node-hour is made (`generate`): every random draw of sim/traffic.py is positional and its
count does not depend on the CCs, so the same node-hour generated under other CCs has the same
clients, paths and handshakes; only the CC-dependent arithmetic changes (rates, transfer times,
hence each connection's duration and start inside its epoch). So:

1. the hour is generated once with every connection on the default CC, which gives each
   connection's accept time and handshake;
2. the chooser decides; the hour is generated again with those CCs;
3. a connection whose CC changed starts at a slightly different time (its duration changed);
   the chooser is asked again on the new accept times, and the hour regenerated, until no
   decision changes (at most `MAX_PASSES` generations). A connection still decided on another
   pass's accept time than the one logged (a table swap falling between the two) is counted in
   `NodeHour.follow["decided_off_start"]`, never hidden.

Retransmissions are drawn from one stream per connection in this mode (sim/traffic.py): a
connection's CC then never moves another connection's draws, so an hour regenerated after a
table change keeps every connection accepted before the change exactly as it was logged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from ccselect.sim import physics

#: generations of a node-hour at most (the first under the default CC)
MAX_PASSES = 4
#: the simulator's CCs by name (sim/physics.py models these two)
CC_CODES = {"cubic": physics.CUBIC, "bbr": physics.BBR}


@dataclass(frozen=True)
class Connections:
    """What a node's agent sees of each connection when it decides, in generation order."""
    node_id: str
    accept_ms: np.ndarray            # ts_start_ms as logged
    client_ip: np.ndarray            # text, v4 or v6
    server_port: np.ndarray
    mss_bytes: np.ndarray            # the handshake, as the transport log records it
    init_snd_wnd_bytes: np.ndarray
    connection_time_us: np.ndarray


@dataclass(frozen=True)
class Choice:
    """Per connection: the CC's name (cubic or bbr), the transport log's decision
    (ccselect.contract.DECISIONS) and table version (str, or None without a table)."""
    cc: np.ndarray
    decision: np.ndarray
    version: np.ndarray


class Chooser(Protocol):
    def __call__(self, conns: Connections) -> Choice: ...


@dataclass(frozen=True)
class Forced:
    """The CCs of one generation (physics codes), with their decisions and versions; None:
    every connection on the default CC (decision `default`, no table)."""
    cc: np.ndarray | None
    decision: np.ndarray | None
    version: np.ndarray | None

    def arrays(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.cc is None:
            return np.zeros(n, dtype=np.int64), np.full(n, "default", dtype=object), np.full(n, None, dtype=object)
        if len(self.cc) != n:
            raise ValueError(f"{len(self.cc)} choices for {n} connections")
        return self.cc, self.decision, self.version


DEFAULT = Forced(None, None, None)


def _forced(choice: Choice) -> Forced:
    names = np.asarray(choice.cc, dtype=object)
    unknown = sorted(set(names) - set(CC_CODES))
    if unknown:
        raise ValueError(f"the simulator models {sorted(CC_CODES)} only, a chooser gave {unknown}")
    cc = np.array([CC_CODES[c] for c in names], dtype=np.int64)
    return Forced(cc, np.asarray(choice.decision, dtype=object), np.asarray(choice.version, dtype=object))


def _view(nh, n: int) -> Connections:
    t = nh.transport
    idx = np.array([int(c[-6:], 16) for c in t["conn_id"].to_list()], dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    order[idx] = np.arange(n)

    def col(name):
        return t[name].to_numpy()[order]
    return Connections(str(t["node_id"][0]) if n else "", col("ts_start_ms"), col("client_ip"), col("server_port"),
                       col("mss_bytes"), col("init_snd_wnd_bytes"), col("connection_time_us"))


def generate(world, node_idx: int, hour_idx: int, chooser: Chooser, gen: Callable):
    """One node-hour whose CCs follow `chooser` (module doc); `gen` is sim.traffic._generate."""
    nh = gen(world, node_idx, hour_idx, None, DEFAULT)  # every connection on the default CC
    n = nh.transport.height
    choice = _forced(chooser(_view(nh, n)))
    passes, changed = 1, n
    while passes < MAX_PASSES and changed:
        nh = gen(world, node_idx, hour_idx, None, choice)
        passes += 1
        again = _forced(chooser(_view(nh, n)))
        changed = int(np.sum((again.cc != choice.cc) | (again.decision != choice.decision)
                             | (again.version != choice.version)))
        choice = choice if not changed else again
    # `changed`: connections whose logged decision is not the one the chooser gives at their
    # logged accept time (a swap between two passes' accept times); 0 once the passes agree
    nh.follow = {"passes": passes, "decided_off_start": changed}
    return nh
