/* Packing and parsing of frame headers; the parser trusts nothing it reads. */
#include "wire.h"

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static uint32_t get32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get64(const uint8_t *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

void sc_wire_pack(const struct sc_hdr *hdr, uint8_t out[SC_WIRE_HEADER_SIZE]) {
    out[0] = SC_WIRE_MAGIC;
    out[1] = hdr->op;
    put16(out + 2, hdr->flags);
    put32(out + 4, hdr->seq);
    put32(out + 8, hdr->length);
    put32(out + 12, hdr->rkey);
    put32(out + 16, hdr->imm);
    put64(out + 20, hdr->addr);
    put64(out + 28, hdr->arg1);
    put64(out + 36, hdr->arg2);
    put32(out + 44, hdr->ack);
}

static int known_op(unsigned op) {
    return (op >= SC_OP_HELLO && op <= SC_OP_FETCH_ADD) || (op >= SC_OP_ACK && op <= SC_OP_REFUSE);
}

int sc_wire_is_request(unsigned op) { return op >= SC_OP_SEND && op <= SC_OP_FETCH_ADD; }

enum sc_wire_problem sc_wire_parse(const uint8_t in[SC_WIRE_HEADER_SIZE], struct sc_hdr *hdr) {
    hdr->magic = in[0];
    hdr->op = in[1];
    hdr->flags = get16(in + 2);
    hdr->seq = get32(in + 4);
    hdr->length = get32(in + 8);
    hdr->rkey = get32(in + 12);
    hdr->imm = get32(in + 16);
    hdr->addr = get64(in + 20);
    hdr->arg1 = get64(in + 28);
    hdr->arg2 = get64(in + 36);
    hdr->ack = get32(in + 44);
    if (hdr->magic != SC_WIRE_MAGIC) return SC_WIRE_BAD_MAGIC;
    if (!known_op(hdr->op)) return SC_WIRE_BAD_OP;
    if (hdr->length > SC_WIRE_MAX_PAYLOAD) return SC_WIRE_BAD_LENGTH;
    return SC_WIRE_OK;
}

const char *sc_wire_problem_text(enum sc_wire_problem problem) {
    switch (problem) {
    case SC_WIRE_OK: return "ok";
    case SC_WIRE_BAD_MAGIC: return "bad magic";
    case SC_WIRE_BAD_OP: return "unknown opcode";
    case SC_WIRE_BAD_LENGTH: return "bad length";
    }
    return "unknown problem";
}

uint32_t sc_wire_payload_length(const struct sc_hdr *hdr) {
    switch (hdr->op) {
    case SC_OP_SEND:
    case SC_OP_SEND_IMM:
    case SC_OP_WRITE:
    case SC_OP_WRITE_IMM:
    case SC_OP_READ_RESP: return hdr->length;
    default: return 0;
    }
}
