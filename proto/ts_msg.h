/*
 * Message codec: the protobuf-c meta of a frame, checked against its header.
 *
 * ts_msg_decode is a pure function (no I/O): it unpacks the meta that the frame type selects
 * and checks what the protobuf schema cannot, above all that data_len equals the payload the
 * meta describes, before anyone allocates for that payload. protobuf-c gives no reason when
 * unpack fails; this wrapper turns a NULL unpack into TS_EPROTO with a description.
 */
#ifndef TS_MSG_H
#define TS_MSG_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera.pb-c.h"
#include "ts_frame.h"

/* Largest number of partition slices in one Push, Pull or PullReply. */
#define TS_MSG_MAX_PARTS 65536
/* Largest tensor rank and tensor count in a Declare. */
#define TS_MSG_MAX_RANK 8
#define TS_MSG_MAX_TENSORS 4096
#define TS_MSG_MAX_NAME 256
/* Embedding tables (tessera.proto's TableDecl, SparsePull, SparsePush): tables in a
 * Declare, a row's width, keys in one request, and the rows one reply may carry. */
#define TS_MSG_MAX_TABLES 256
#define TS_MSG_MAX_DIM 4096
#define TS_MSG_MAX_KEYS (UINT64_C(1) << 20)
#define TS_MSG_MAX_SPARSE_REPLY (UINT64_C(64) << 20)
/* The rows libtessera-client asks one reply for (a larger pull goes in several requests):
 * a quarter of server.max_reply_bytes' default, so four of them queued at once fit what a
 * shard lets replies hold. */
#define TS_MSG_SPARSE_PULL_CUT (UINT64_C(16) << 20)
/* Hello.features: what a server does beyond protocol 1's messages. */
#define TS_FEATURE_SPARSE_PUSH_PULL 1u   /* SparsePush.pull_request_id */
#define TS_FEATURE_SPARSE_PUSH_PIECES 2u /* SparsePush.piece */
/* The frames one push's keys on a shard may go in (SparsePush.piece < it). */
#define TS_MSG_MAX_PUSH_PIECES 4u
/* The rows one push+pull in one frame may ask for (a shard holds them while the push is
 * read: at most 4 such pushes' worth on a shard together). */
#define TS_MSG_MAX_FUSED_ROWS (UINT64_C(32) << 20)

/* The protobuf descriptor of a frame type, or NULL for an unknown type. */
const ProtobufCMessageDescriptor *ts_msg_descriptor(uint16_t type);

/* Unpack meta[0..meta_len) as the message of `type` and validate it against data_len.
 * On success returns 0 and *out owns a message to free with ts_msg_free. On failure returns
 * TS_EPROTO (malformed meta, a field out of range) or TS_ESIZE (data_len differs from the
 * payload the meta describes), writes the reason to errbuf and leaves *out NULL. */
int ts_msg_decode(uint16_t type, const uint8_t *meta, size_t meta_len, uint64_t data_len,
                  ProtobufCMessage **out, char *errbuf, size_t errlen);

void ts_msg_free(ProtobufCMessage *msg);

/* The name of a training mode on the wire ("async", "sync", "ssp"; "unknown" otherwise). */
const char *ts_msg_mode_name(Tessera__Mode m);

/* Bytes of one SparsePush record of a table of width dim: the key, then dim float32. */
static inline uint64_t ts_msg_sparse_record_bytes(uint32_t dim) { return 8 + 4 * (uint64_t)dim; }

/* Total payload bytes described by a list of slices; UINT64_MAX on overflow. */
uint64_t ts_msg_parts_bytes(Tessera__PartSlice *const *parts, size_t n);

/* Size of header + packed meta for msg. */
size_t ts_msg_frame_size(const ProtobufCMessage *msg);

/* Write header + packed meta of msg (frame type `type`, followed by data_len payload bytes
 * that the caller sends next) into dst, which has ts_msg_frame_size(msg) bytes. Returns the
 * bytes written. */
size_t ts_msg_encode(uint16_t type, const ProtobufCMessage *msg, uint64_t data_len, uint8_t *dst);

#endif
