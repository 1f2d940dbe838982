"""A prefix→CC table the simulator can serve traffic from (cc_mode="table"), so that later
stages can close the loop: a CSV of `cidr,cc` (the export's artifact can be converted to it).
Lookup is longest-prefix match, vectorized per prefix length."""
from __future__ import annotations

import csv
import ipaddress
from dataclasses import dataclass, field

import numpy as np

CC_CODES = {"cubic": 0, "bbr": 1}


@dataclass
class CcTable:
    version: str
    # family -> list of (prefix length, sorted keys, cc codes), longest first
    levels: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: list[tuple[str, str]], version: str) -> "CcTable":
        by: dict[tuple[int, int], dict[int, int]] = {}
        for cidr, cc in rows:
            if cc not in CC_CODES:
                raise ValueError(f"table entry {cidr}: unknown cc {cc!r}")
            net = ipaddress.ip_network(cidr, strict=True)
            if net.version == 6 and net.prefixlen > 64:
                raise ValueError(f"table entry {cidr}: IPv6 entries longer than /64 are not supported by the simulator")
            bits = 32 if net.version == 4 else 64
            key = (int(net.network_address) >> (128 - 64 if net.version == 6 else 0)) >> (bits - net.prefixlen) \
                if net.prefixlen else 0
            by.setdefault((net.version, net.prefixlen), {})[key] = CC_CODES[cc]
        levels: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {4: [], 6: []}
        for (fam, plen), d in sorted(by.items(), key=lambda kv: -kv[0][1]):
            keys = np.array(sorted(d), dtype=np.uint64)
            levels[fam].append((plen, keys, np.array([d[int(k)] for k in keys], dtype=np.int64)))
        return cls(version, levels)

    @classmethod
    def from_csv(cls, path: str) -> "CcTable":
        with open(path, newline="") as fh:
            rows = [(r["cidr"], r["cc"]) for r in csv.DictReader(fh)]
        return cls.from_rows(rows, version=path.rsplit("/", 1)[-1])

    def lookup(self, family: np.ndarray, addr_hi: np.ndarray, addr_lo: np.ndarray) -> np.ndarray:
        """CC code of the longest matching entry per address, -1 on a miss. IPv4 addresses are
        in `addr_lo`; IPv6 uses the top 64 bits in `addr_hi`."""
        out = np.full(len(family), -1, dtype=np.int64)
        for fam, bits, src in ((4, 32, addr_lo), (6, 64, addr_hi)):
            sel = family == fam
            a = np.asarray(src).astype(np.uint64)
            for plen, keys, ccs in self.levels.get(fam, []):
                todo = sel & (out < 0)
                if not todo.any() or len(keys) == 0:
                    continue
                k = a >> np.uint64(bits - plen) if plen else np.zeros_like(a)
                pos = np.clip(np.searchsorted(keys, k), 0, len(keys) - 1)
                hit = todo & (keys[pos] == k)
                out[hit] = ccs[pos[hit]]
        return out
