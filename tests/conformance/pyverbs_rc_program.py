"""An RC program written the way pyverbs' documentation writes one, whose imports alone are libshift's.

Each import line names, in its comment, the pyverbs module it replaces: test_pyverbs_program.py runs this
file as it is (libshift, on the tcp provider or the verbs one) and, in the Soft-RoCE VM, with those lines
turned back into pyverbs' own imports and nothing else changed, under Debian's python3.

Two RC QPs, one on each device named on the command line (the third argument is the GID index): they
exchange GID and QPN in-process, as a pair of hosts would over a socket, the client SENDs a message into
the server's posted receive and then RDMA-WRITEs into the server's MR. It prints what the server got.
"""

# ruff: noqa: I001 (one import line per pyverbs module, as the pyverbs program has them)
import sys
import time

from libshift.verbs import AHAttr, GlobalRoute  # pyverbs.addr
from libshift.verbs import CQ  # pyverbs.cq
from libshift.verbs import Context  # pyverbs.device
from libshift.verbs import enums as e  # pyverbs
from libshift.verbs import MR  # pyverbs.mr
from libshift.verbs import PD  # pyverbs.pd
from libshift.verbs import QP, QPAttr, QPCap, QPInitAttr  # pyverbs.qp
from libshift.verbs import SGE, RecvWR, SendWR  # pyverbs.wr

PORT = 1
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
MESSAGE = b"hello over RC"
WRITTEN = b"written in place"


class Side:
    def __init__(self, name, gid_index):
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, 4096, ACCESS)
        self.cq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.gid_index = gid_index
        self.gid = self.ctx.query_gid(PORT, gid_index)
        self.mtu = self.ctx.query_port(PORT).active_mtu

    def connect(self, remote_qpn, remote_gid, mtu):
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=PORT)
        attr.qp_access_flags = ACCESS
        attr.pkey_index = 0
        self.qp.to_init(attr)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR, port_num=PORT)
        attr.path_mtu = min(self.mtu, mtu)
        attr.dest_qp_num = remote_qpn
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        gr = GlobalRoute(dgid=remote_gid, sgid_index=self.gid_index)
        attr.ah_attr = AHAttr(is_global=1, gr=gr, port_num=PORT)
        self.qp.to_rtr(attr)
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.sq_psn = 0
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def poll(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            npolled, wcs = self.cq.poll()
            if npolled:
                return wcs[0]
            time.sleep(0.001)
        raise SystemExit("no completion within 30 s")


def main():
    server, client = Side(sys.argv[1], int(sys.argv[3])), Side(sys.argv[2], int(sys.argv[3]))
    server.connect(client.qp.qp_num, client.gid, client.mtu)
    client.connect(server.qp.qp_num, server.gid, server.mtu)

    server.qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(server.mr.buf, 4096, server.mr.lkey)]))
    client.mr.write(MESSAGE, len(MESSAGE))
    sge = SGE(client.mr.buf, len(MESSAGE), client.mr.lkey)
    client.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge]))
    sent, got = client.poll(), server.poll()
    assert sent.status == e.IBV_WC_SUCCESS and sent.wr_id == 2, sent
    assert got.status == e.IBV_WC_SUCCESS and got.opcode == e.IBV_WC_RECV, got
    print("received", server.mr.read(got.byte_len, 0).decode())

    client.mr.write(WRITTEN, len(WRITTEN), 64)
    sge = SGE(client.mr.buf + 64, len(WRITTEN), client.mr.lkey)
    wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge])
    wr.set_wr_rdma(server.mr.rkey, server.mr.buf + 1024)
    client.qp.post_send(wr)
    wrote = client.poll()
    assert wrote.status == e.IBV_WC_SUCCESS and wrote.wr_id == 3, wrote
    print("written", server.mr.read(len(WRITTEN), 1024).decode())
    print("qpns", server.qp.qp_num, client.qp.qp_num)


if __name__ == "__main__":
    main()
