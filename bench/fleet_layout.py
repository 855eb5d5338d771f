"""The simulated fleet of bench/fleet_scale.py: hosts, their NICs' GIDs, and the keys a job publishes.

Pure functions of the shape, so that the driver (which checks what etcd holds) and every worker (which
publishes and looks up) agree on each key without telling each other. Keys and values are shiftd's own
(`shiftd.agents.qp_key`, `mr_key`, `encode`), so their sizes are those of a real fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

from libshift.api.shift.v1 import common_pb2
from libshift.gid import gid_of_ipv4
from shiftd.agents import encode, mr_key, qp_key

QPN_BASE = 0x1000  # above the reserved QPNs, as the soak's synthetic mappings
JOB_STRIDE = 1 << 16  # QPNs and rkeys of job j start at QPN_BASE + j * JOB_STRIDE


@dataclass(frozen=True)
class Fleet:
    hosts: int
    nics: int = 2  # NICs (rails) per host
    qps: int = 64  # QPs per host a job publishes, spread over its NICs
    mrs: int = 16  # MRs per host a job publishes, spread over its NICs
    peers: int = 8  # hosts each host's QPs connect to

    @property
    def mappings_per_host(self) -> int:
        return self.qps + self.mrs

    @property
    def qp_mappings(self) -> int:
        return self.hosts * self.qps

    @property
    def mappings(self) -> int:
        return self.hosts * self.mappings_per_host

    def name(self, host: int) -> str:
        return f"f{host}"

    def gid(self, host: int, nic: int) -> str:
        # 10.nic.x.y: only a spelling in etcd keys, never an address anything is sent to
        return gid_of_ipv4(f"10.{nic}.{host >> 8 & 0xFF}.{host & 0xFF}")

    def rail(self, qp: int) -> int:
        return qp % self.nics

    def peer(self, host: int, qp: int) -> int:
        """The host that QP `qp` of `host` is connected to: one of its `peers` next hosts."""
        return (host + 1 + (qp // self.nics) % min(self.peers, self.hosts - 1 or 1)) % self.hosts

    def publishes(self, host: int, job: int) -> dict[str, str]:
        """Every mapping `host` publishes for job `job`: relative key -> value, as shiftd writes them."""
        out: dict[str, str] = {}
        for q in range(self.qps):
            nic, qpn = self.rail(q), QPN_BASE + job * JOB_STRIDE + q
            primary = self._endpoint(host, nic, qpn)
            backup = self._endpoint(host, (nic + 1) % self.nics, qpn)
            out[qp_key(primary.gid, qpn)] = encode(common_pb2.QpMapping(primary=primary, backup=backup))
        for m in range(self.mrs):
            nic, rkey = m % self.nics, QPN_BASE + job * JOB_STRIDE + m
            gid, backup_gid = self.gid(host, nic), self.gid(host, (nic + 1) % self.nics)
            mapping = common_pb2.MrMapping(gid=gid, rkey=rkey, backup_gid=backup_gid, backup_rkey=rkey + 1)
            out[mr_key(gid, rkey)] = encode(mapping)
        return out

    def peer_qp_key(self, host: int, qp: int, job: int) -> str:
        """The key QP `qp` of `host` looks up at connect: its peer's QP mapping on the same rail."""
        return qp_key(self.gid(self.peer(host, qp), self.rail(qp)), QPN_BASE + job * JOB_STRIDE + qp)

    def peer_mr_key(self, host: int, qp: int, job: int) -> str:
        """The peer MR key QP `qp` of `host` uses (its backup rkey is looked up after a failover)."""
        rail_mrs = [m for m in range(self.mrs) if m % self.nics == self.rail(qp)] or [0]
        rkey = QPN_BASE + job * JOB_STRIDE + rail_mrs[(qp // self.nics) % len(rail_mrs)]
        return mr_key(self.gid(self.peer(host, qp), self.rail(qp)), rkey)

    def _endpoint(self, host: int, nic: int, qpn: int) -> common_pb2.Endpoint:
        return common_pb2.Endpoint(
            gid=self.gid(host, nic), qpn=qpn, psn=qpn * 7919 & 0xFFFFFF, device=f"mlx5_{nic}", provider="tcp"
        )

    def host_record(self, host: int) -> str:
        """What shiftd puts under hosts/<host> at start (the size matters, not the fields)."""
        return f'{{"host":"{self.name(host)}","pid":1,"socket":"/run/shift/shiftd.sock","version":"bench"}}'

    def nic_record(self, host: int, nic: int, up: bool = True) -> str:
        """What shiftd puts under nics/<host>/<device> at start and on every transition."""
        state = common_pb2.NIC_STATE_UP if up else common_pb2.NIC_STATE_DOWN
        record = common_pb2.Nic(
            device=f"mlx5_{nic}", netdev=f"ens{nic + 1}f0np0", provider="tcp", state=state,
            reason="up" if up else "carrier_lost", admin_up=True, operstate="up" if up else "down",
            carrier=up, addresses=[f"10.{nic}.{host >> 8 & 0xFF}.{host & 0xFF}"], gid=self.gid(host, nic),
        )  # fmt: skip
        return encode(record)

    def startup_records(self, host: int) -> dict[str, str]:
        """The keys a shiftd writes as it starts: its host record and one record per NIC."""
        records = {f"hosts/{self.name(host)}": self.host_record(host)}
        for nic in range(self.nics):
            records[f"nics/{self.name(host)}/mlx5_{nic}"] = self.nic_record(host, nic)
        return records
