/*
 * Frame codec (docs/architecture.md): a pure function over bytes, no I/O, no allocation.
 *
 * A frame is a 20-byte header, meta_len bytes of protobuf meta, data_len bytes of raw
 * payload (float32 values; a table's frames also carry int64 keys, tessera.proto's
 * SparsePull, SparsePush and TableKeysReply say how):
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

/* Who sends a frame type: a client (worker, psctl) to a shard, or a shard to a client. */
typedef enum { TS_FRAME_C2S = 1, TS_FRAME_S2C = 2 } ts_frame_dir_t;

/* The one table of frame types. Each row is
 *
 *   X(NAME, value, descriptor, metrics, dir, data)
 *
 * NAME     gives TS_MSG_NAME and the name ts_frame_type_name returns ("PULL_REPLY")
 * value    the type on the wire: these numbers are the protocol and never change
 * descriptor  the protobuf-c descriptor of the meta (expanded only in proto/ts_msg.c,
 *          so this header needs no protobuf)
 * metrics  the request="..." label the shard counts it under (TS_METRICS_REQ_<metrics> in
 *          server/ts_metrics.h; OTHER for replies and admin requests)
 * dir      TS_FRAME_C2S or TS_FRAME_S2C
 * data     1 when the frame carries a float32 payload after its meta
 *
 * Values run from 1 without gaps (ts_frame_decode_header refuses 0 and TS_MSG__COUNT or
 * more); a new type takes the next value and a row here, nothing else. */
#define TS_FRAME_MAP(X)                                                                    \
  X(HELLO, 1, tessera__hello__descriptor, OTHER, TS_FRAME_S2C, 0)                          \
  X(HANDSHAKE, 2, tessera__handshake__descriptor, HANDSHAKE, TS_FRAME_C2S, 0)              \
  X(HANDSHAKE_REPLY, 3, tessera__handshake_reply__descriptor, OTHER, TS_FRAME_S2C, 0)      \
  X(DECLARE, 4, tessera__declare__descriptor, DECLARE, TS_FRAME_C2S, 0)                    \
  X(DECLARE_REPLY, 5, tessera__declare_reply__descriptor, OTHER, TS_FRAME_S2C, 0)          \
  X(PULL, 6, tessera__pull__descriptor, PULL, TS_FRAME_C2S, 0)                             \
  X(PULL_REPLY, 7, tessera__pull_reply__descriptor, OTHER, TS_FRAME_S2C, 1)                \
  X(PUSH, 8, tessera__push__descriptor, PUSH, TS_FRAME_C2S, 1)                             \
  X(PUSH_REPLY, 9, tessera__push_reply__descriptor, OTHER, TS_FRAME_S2C, 0)                \
  X(HEARTBEAT, 10, tessera__heartbeat__descriptor, HEARTBEAT, TS_FRAME_C2S, 0)             \
  X(HEARTBEAT_REPLY, 11, tessera__heartbeat_reply__descriptor, OTHER, TS_FRAME_S2C, 0)     \
  X(STATUS, 12, tessera__status__descriptor, STATUS, TS_FRAME_C2S, 0)                      \
  X(STATUS_REPLY, 13, tessera__shard_status__descriptor, OTHER, TS_FRAME_S2C, 0)           \
  X(ERROR, 14, tessera__error__descriptor, OTHER, TS_FRAME_S2C, 0)                         \
  X(CHECKPOINT, 15, tessera__checkpoint__descriptor, OTHER, TS_FRAME_C2S, 0)               \
  X(CHECKPOINT_REPLY, 16, tessera__checkpoint_reply__descriptor, OTHER, TS_FRAME_S2C, 0)   \
  X(SHUTDOWN, 17, tessera__shutdown__descriptor, OTHER, TS_FRAME_C2S, 0)                   \
  X(SHUTDOWN_REPLY, 18, tessera__shutdown_reply__descriptor, OTHER, TS_FRAME_S2C, 0)     \
  X(MODEL_RESET, 19, tessera__model_reset__descriptor, OTHER, TS_FRAME_C2S, 0)             \
  X(MODEL_RESET_REPLY, 20, tessera__model_reset_reply__descriptor, OTHER, TS_FRAME_S2C, 0)  \
  X(SPARSE_PULL, 21, tessera__sparse_pull__descriptor, SPARSE_PULL, TS_FRAME_C2S, 1)       \
  X(SPARSE_PULL_REPLY, 22, tessera__sparse_pull_reply__descriptor, OTHER, TS_FRAME_S2C, 1) \
  X(SPARSE_PUSH, 23, tessera__sparse_push__descriptor, SPARSE_PUSH, TS_FRAME_C2S, 1)       \
  X(SPARSE_PUSH_REPLY, 24, tessera__sparse_push_reply__descriptor, OTHER, TS_FRAME_S2C, 0) \
  X(TABLE_KEYS, 25, tessera__table_keys__descriptor, OTHER, TS_FRAME_C2S, 0)               \
  X(TABLE_KEYS_REPLY, 26, tessera__table_keys_reply__descriptor, OTHER, TS_FRAME_S2C, 1)

#define TS_FRAME_ENUM_(name, value, desc, metrics, dir, data) TS_MSG_##name = value,
typedef enum {
  TS_FRAME_MAP(TS_FRAME_ENUM_)
  TS_MSG__COUNT  /* one past the largest value */
} ts_msg_type_t;
#undef TS_FRAME_ENUM_

/* Number of rows of TS_FRAME_MAP; equal to TS_MSG__COUNT - 1 while values have no gaps
 * (ts_frame.c checks). */
#define TS_FRAME_COUNT_(name, value, desc, metrics, dir, data) +1
enum { TS_FRAME_NUM_TYPES = 0 TS_FRAME_MAP(TS_FRAME_COUNT_) };
#undef TS_FRAME_COUNT_

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

/* Who sends frames of this type (TS_FRAME_C2S or TS_FRAME_S2C); 0 for an unknown type. */
int ts_frame_type_dir(uint16_t type);

#endif
