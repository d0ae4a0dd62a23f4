/*
 * Frame codec (docs/architecture.md): a pure function over bytes, no I/O, no allocation.
 *
 * A frame is a 20-byte header, meta_len bytes of protobuf meta, data_len bytes of raw
 * float32 payload:
 *
 *   offset 0  magic "TSR1"
 *          4  u16 protocol version (TS_PROTOCOL_VERSION)
 *          6  u16 type (ts_msg_type_t)
 *          8  u32 meta_len   (<= TS_FRAME_MAX_META)
 *         12  u64 data_len   (0 unless the type carries a payload; a multiple of 4)
 *
 * All integers are little-endian.
 */
#ifndef TS_FRAME_H
#define TS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TS_FRAME_MAGIC "TSR1"
#define TS_FRAME_HEADER_SIZE 20
#define TS_PROTOCOL_VERSION 1
#define TS_FRAME_MAX_META (1u << 20)

typedef enum {
  TS_MSG_HELLO = 1,
  TS_MSG_HANDSHAKE = 2,
  TS_MSG_HANDSHAKE_REPLY = 3,
  TS_MSG_DECLARE = 4,
  TS_MSG_DECLARE_REPLY = 5,
  TS_MSG_PULL = 6,
  TS_MSG_PULL_REPLY = 7,
  TS_MSG_PUSH = 8,
  TS_MSG_PUSH_REPLY = 9,
  TS_MSG_HEARTBEAT = 10,
  TS_MSG_HEARTBEAT_REPLY = 11,
  TS_MSG_STATUS = 12,
  TS_MSG_STATUS_REPLY = 13,
  TS_MSG_ERROR = 14,
  TS_MSG_CHECKPOINT = 15,
  TS_MSG_CHECKPOINT_REPLY = 16,
  TS_MSG_SHUTDOWN = 17,
  TS_MSG_SHUTDOWN_REPLY = 18,
  TS_MSG__COUNT
} ts_msg_type_t;

typedef struct {
  uint16_t version;
  uint16_t type;
  uint32_t meta_len;
  uint64_t data_len;
} ts_frame_header_t;

/* Decode the header at src[0..len). max_data is the largest payload this reader accepts.
 * Returns TS_FRAME_HEADER_SIZE and fills *out; TS_EINCOMPLETE when len is short; or
 * TS_EPROTO (bad magic, unknown type, payload on a type that carries none, payload not a
 * multiple of 4), TS_EVERSION, TS_ETOOBIG (meta or payload over its limit). On error,
 * *err_desc (if not NULL) points to a static description. */
int ts_frame_decode_header(const uint8_t *src, size_t len, uint64_t max_data,
                           ts_frame_header_t *out, const char **err_desc);

/* Write a header for (type, meta_len, data_len) into dst[0..TS_FRAME_HEADER_SIZE). */
void ts_frame_encode_header(uint8_t *dst, uint16_t type, uint32_t meta_len, uint64_t data_len);

/* True for the types whose frames carry a float32 payload (Push, PullReply). */
int ts_frame_type_has_data(uint16_t type);

/* "PUSH", "PULL_REPLY", ...; "UNKNOWN" otherwise. */
const char *ts_frame_type_name(uint16_t type);

#endif
