/* The tcp transport's frame format (docs/wire.md): a fixed 48-byte big-endian header, then the payload.
 * libshift/core/wire.py hands these numbers and sc_wire_pack to Python (tests that play a peer). */
#ifndef SHIFT_CORE_WIRE_H
#define SHIFT_CORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define SC_WIRE_MAGIC 0x5F
#define SC_WIRE_HEADER_SIZE 48
#define SC_WIRE_MAX_PAYLOAD (1u << 31)
#define SC_WIRE_FLAG_SOLICITED 1u
#define SC_WIRE_FLAG_ACK 2u /* the request also carries a cumulative ack of the other direction in `ack` */
#define SC_WIRE_FLAG_ACK_REQ 4u /* the last request the requester has to send now: acknowledge it at once */
#define SC_WIRE_NAK_RNR 0xFFFFu

enum sc_wire_op {
    SC_OP_HELLO = 1, /* each side's first frame: seq = its own QPN, imm = the QPN it means to reach */
    SC_OP_SEND = 2,
    SC_OP_SEND_IMM = 3,
    SC_OP_WRITE = 4,
    SC_OP_WRITE_IMM = 5,
    SC_OP_READ_REQ = 6,
    SC_OP_CMP_SWP = 7,
    SC_OP_FETCH_ADD = 8,
    SC_OP_ACK = 16,
    SC_OP_NAK = 17,
    SC_OP_READ_RESP = 18,
    SC_OP_ATOMIC_RESP = 19,
    SC_OP_REFUSE = 20, /* a listener's answer to a HELLO it will not take: seq = the QPN sought, imm = the asker's */
};

struct sc_hdr {
    uint8_t magic, op;
    uint16_t flags;
    uint32_t seq, length, rkey, imm;
    uint64_t addr, arg1, arg2;
    uint32_t ack;
};

/* Why a header cannot be framed (the stream is then unusable). */
enum sc_wire_problem { SC_WIRE_OK = 0, SC_WIRE_BAD_MAGIC, SC_WIRE_BAD_OP, SC_WIRE_BAD_LENGTH };

void sc_wire_pack(const struct sc_hdr *hdr, uint8_t out[SC_WIRE_HEADER_SIZE]);
/* Decodes exactly SC_WIRE_HEADER_SIZE bytes and checks them; the header is filled in either way. */
enum sc_wire_problem sc_wire_parse(const uint8_t in[SC_WIRE_HEADER_SIZE], struct sc_hdr *hdr);
const char *sc_wire_problem_text(enum sc_wire_problem problem);
int sc_wire_is_request(unsigned op);
/* Bytes that follow the header on the stream (READ_REQ's length is what it asks for, not what it sends). */
uint32_t sc_wire_payload_length(const struct sc_hdr *hdr);

#endif
