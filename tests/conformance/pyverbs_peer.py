"""An RC peer written against pyverbs alone (no libshift), for the independent-peer test.

Run by Debian's python3 with its pyverbs. JSON lines on stdin/stdout: it reads {"device": NAME}, answers
with its QP's address and a receive-side MR; reads the other side's {"qpn", "gid", "psn", "addr", "rkey"},
connects, and answers {"ready": true} with a receive posted; once that receive completes it RDMA-writes
the message it got, reversed, into the other side's MR and answers {"received": TEXT, "wrote": true}.
"""

import ipaddress
import json
import sys
import time
from pathlib import Path

import pyverbs.addr as addr
import pyverbs.cq as cq
import pyverbs.device as device
import pyverbs.enums as e
import pyverbs.mr as mr
import pyverbs.pd as pd
import pyverbs.qp as qp
import pyverbs.wr as wr

PORT = 1
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def say(message: dict) -> None:
    print(json.dumps(message), flush=True)


def ipv4_gid_index(name: str) -> int:
    """The RoCE v2 GID of an IPv4 address: the one the other side uses too."""
    port = Path(f"/sys/class/infiniband/{name}/ports/{PORT}")
    for path in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
        try:
            mapped = ipaddress.IPv6Address(path.read_text().strip()).ipv4_mapped
            kind = (port / "gid_attrs" / "types" / path.name).read_text().strip()
        except (OSError, ValueError):
            continue
        if mapped is not None and kind == "RoCE v2":
            return int(path.name)
    raise SystemExit(f"{name}: no RoCE v2 IPv4 GID")


def wait(queue: cq.CQ) -> cq.WC:
    while True:
        count, wcs = queue.poll()
        if count:
            return wcs[0]
        time.sleep(0.001)  # under TCG a busy peer would starve the other side of CPU


def main() -> None:
    name = json.loads(sys.stdin.readline())["device"]
    ctx = device.Context(name=name)
    index = ipv4_gid_index(name)
    mtu = ctx.query_port(PORT).active_mtu
    domain = pd.PD(ctx)
    queue = cq.CQ(ctx, 16)
    memory = mr.MR(domain, 4096, ACCESS)
    init = qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=queue, rcq=queue, cap=qp.QPCap(4, 4, 1, 1))
    conn = qp.QP(domain, init)
    gid = str(ipaddress.IPv6Address(str(ctx.query_gid(PORT, index))))
    say({"qpn": conn.qp_num, "gid": gid, "psn": 0, "mtu": mtu, "addr": memory.buf, "rkey": memory.rkey})
    other = json.loads(sys.stdin.readline())

    attr = qp.QPAttr(qp_state=e.IBV_QPS_INIT, port_num=PORT)
    attr.qp_access_flags = ACCESS
    attr.pkey_index = 0
    conn.to_init(attr)
    attr = qp.QPAttr(qp_state=e.IBV_QPS_RTR, port_num=PORT)
    attr.path_mtu = mtu
    attr.dest_qp_num = other["qpn"]
    attr.rq_psn = other["psn"]
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    route = addr.GlobalRoute(dgid=addr.GID(ipaddress.IPv6Address(other["gid"]).exploded), sgid_index=index)
    route.hop_limit = 64
    attr.ah_attr = addr.AHAttr(is_global=1, gr=route, port_num=PORT)
    conn.to_rtr(attr)
    attr = qp.QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
    conn.to_rts(attr)

    conn.post_recv(wr.RecvWR(wr_id=1, num_sge=1, sg=[wr.SGE(memory.buf, 4096, memory.lkey)]))
    say({"ready": True})
    got = wait(queue)
    if got.status != e.IBV_WC_SUCCESS:
        raise SystemExit(f"receive failed: status {got.status}")
    text = memory.read(got.byte_len, 0).decode()
    answer = text[::-1].encode()
    memory.write(answer, len(answer))
    write = wr.SendWR(
        wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[wr.SGE(memory.buf, len(answer), memory.lkey)]
    )
    write.set_wr_rdma(other["rkey"], other["addr"])
    conn.post_send(write)
    done = wait(queue)
    say({"received": text, "wrote": done.status == e.IBV_WC_SUCCESS})


if __name__ == "__main__":
    main()
