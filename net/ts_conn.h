/*
 * A framed connection over a libuv TCP handle, shared by ps-server and the client library.
 *
 * Reading follows a state machine (header, meta, payload, discard): the libuv alloc_cb hands
 * out exactly the buffer expected next, so a payload is read straight into its final home
 * (parameter memory on a client pull, the shard's gradient buffer on a push) and never
 * copied. Writing sends header + meta from one allocation and the payload from the caller's
 * memory with one uv_write of several buffers.
 *
 * Glossary:
 *   frame    header + meta + payload (proto/ts_frame.h)
 *   on_meta  called when a frame's meta is decoded; it picks where the payload goes
 *   on_frame called when the whole frame, payload included, is in place
 *
 * Lifetime: the owner allocates the ts_conn_t (usually embedded in its own struct), calls
 * ts_conn_init, and ts_conn_close is the only way out; on_close runs from libuv's close
 * callback, after which the owner may free the memory. All calls happen on the loop thread.
 */
#ifndef TS_CONN_H
#define TS_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ts_frame.h"
#include "ts_msg.h"

typedef struct ts_conn ts_conn_t;
struct ts_tls_ctx;

/* The meta of a frame is decoded. For a frame with a payload (h->data_len > 0) set *iov to
 * *niov buffers whose lengths add up to h->data_len (the payload is read into them in order,
 * so it can land straight in several tensors); the array and the memory it points to stay
 * valid until on_frame. Leave *iov NULL to have the payload read and thrown away (after
 * replying with an error, for example). Return 0, or a negative code to close the
 * connection. The callback does not own msg. */
typedef int (*ts_conn_meta_cb)(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                               const uv_buf_t **iov, unsigned *niov);

/* Returned by on_meta or on_piece (instead of 0): read nothing more from this connection
 * until the owner calls ts_conn_resume. From on_meta it means the payload's buffers are not
 * ready yet (the owner may point the entries of *iov at memory until it resumes); from
 * on_piece, that the owner is not done with the buffer just filled. */
#define TS_CONN_HOLD 1

/* Optional: payload buffer i of on_meta's *iov is full. Lets the owner work on a large
 * payload as it lands and reuse one buffer for several entries: entries after i may be
 * re-pointed (never resized) until they start filling. Return 0 to go on, TS_CONN_HOLD, or
 * a negative code to close. Entries of length 0 are skipped without a call. on_frame follows
 * the last buffer's call as usual. */
typedef int (*ts_conn_piece_cb)(ts_conn_t *c, unsigned i);

/* The whole frame has arrived (payload in *dst of on_meta, or discarded). The callback owns
 * msg and frees it with ts_msg_free. `discarded` tells whether the payload was dropped. */
typedef void (*ts_conn_frame_cb)(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                                 bool discarded);

/* The connection is closed (err: why; 0 for a local close, TS_ECLOSED for the peer's EOF).
 * After this returns, the memory of c may be freed. */
typedef void (*ts_conn_close_cb)(ts_conn_t *c, int err);

/* A write is done (err < 0 when it failed or was cancelled by a close). */
typedef void (*ts_conn_write_cb)(ts_conn_t *c, void *arg, int err);

/* Payload buffers [first, first + n) of a frame sent with ts_conn_send_parts are written
 * (err < 0: failed or cancelled); `last` on the frame's final call. */
typedef void (*ts_conn_parts_cb)(ts_conn_t *c, void *arg, unsigned first, unsigned n, bool last,
                                 int err);

typedef struct {
  ts_conn_meta_cb on_meta;
  ts_conn_frame_cb on_frame;
  ts_conn_close_cb on_close;
  ts_conn_piece_cb on_piece; /* may be NULL */
} ts_conn_cbs_t;

typedef enum {
  TS_CONN_READ_HEADER,
  TS_CONN_READ_META,
  TS_CONN_READ_DATA,
  TS_CONN_READ_DISCARD,
} ts_conn_read_state_t;

struct ts_conn {
  uv_tcp_t handle; /* handle.data == this */
  const ts_conn_cbs_t *cbs;
  void *data;      /* owner's pointer */

  ts_conn_read_state_t state;
  uint8_t header[TS_FRAME_HEADER_SIZE];
  size_t got;                 /* bytes of the current piece received */
  ts_frame_header_t hdr;
  uint8_t *meta;              /* reused buffer, grows to the largest meta seen */
  size_t meta_cap;
  ProtobufCMessage *msg;      /* decoded meta of the frame being read */
  const uv_buf_t *dst;        /* payload destination (on_meta's *iov) */
  unsigned dst_n, dst_i;      /* buffers, and the one being filled */
  size_t dst_off;             /* bytes filled in dst[dst_i] */
  uint8_t *scratch;           /* 64 KiB for discarded payload */
  /* Read-ahead (TS_CONN_READ_AHEAD bytes, allocated at the first read): at a frame boundary
   * the socket is read into it rather than into the 20-byte header, so the frames of a small
   * request (a 4 KiB push and the pull behind it) come in with one read() instead of one
   * each for every header, meta and payload. Its unprocessed bytes [ra_off, ra_len) are
   * handed on to the frame state machine as if they had just been read, and the socket is
   * not read again until they are gone. */
  uint8_t *ra;
  size_t ra_off, ra_len;
  bool feeding;               /* handing the read-ahead on (not re-entered) */
  /* Replies made while the read-ahead is handed on (a push's reply, with the pull behind it
   * still to answer), payload-less and without a callback, wait here: they go out in the
   * same write as the next frame sent, or when the read-ahead has been handed on. One
   * write() for a push reply and the pull reply behind it, and one segment for the peer. */
  uint8_t *cork;
  size_t cork_len, cork_cap;
  unsigned cork_frames;

  uint64_t max_data;          /* largest payload accepted */
  uint32_t max_meta;          /* largest meta accepted (TS_FRAME_MAX_META unless lowered) */
  size_t max_write_queue;     /* reads pause while more bytes than this wait to be written */
  /* Memory the queued writes take (write requests, encoded frames, libuv's copy of a long
   * buffer list, allocator overhead, and what the owner charges; not the caller's payload
   * memory). Reads also pause while it is over max_write_mem (0: no limit), until it is
   * back to half. write_mem_total (owner's, may be NULL) sums it over connections. */
  uint64_t write_mem;
  uint64_t max_write_mem;
  uint64_t *write_mem_total;
  bool reading;
  bool paused;                /* reading stopped: too much waits to be written */
  bool held;                  /* reading stopped: the owner returned TS_CONN_HOLD */
  bool closing;
  bool close_after_write;
  int close_err;

  uint64_t write_progress_ms; /* loop time bytes were last seen written, or the queue filled */
  uint64_t written_seen;      /* bytes written at the last look (ts_conn_write_stall_ms) */
  uint64_t read_progress_ms;  /* loop time bytes last arrived, or reading last (re)started */
  /* The frame in progress (ts_conn_frame_age_ms): its bytes so far, the reading time it
   * took before the last stop, and when that time last started counting. */
  uint64_t frame_bytes, frame_active_ms, frame_mark_ms;

  struct ts_conn_tls *tls;    /* TLS state (ts_conn_use_tls); NULL for plaintext */

  char peer[64];
  char errmsg[256];
  uint64_t frames_in, frames_out, bytes_in, bytes_out;
};

/* Initialise c on loop (uv_tcp_init); the caller then accepts or connects on &c->handle.
 * max_data bounds a frame's payload and max_meta (set to TS_FRAME_MAX_META here) its meta;
 * the owner may change either between frames (a server lowers both until a peer has
 * authenticated). A frame over either closes the connection after an Error frame, before
 * anything is allocated for it. */
int ts_conn_init(uv_loop_t *loop, ts_conn_t *c, const ts_conn_cbs_t *cbs, uint64_t max_data,
                 void *data);

/* Speak TLS on c (ts_tls.h), between ts_conn_init and ts_conn_start: the handshake runs
 * first (a client starts it in ts_conn_start), frames sent before it ends wait for it, and
 * every frame after is encrypted, in records of up to 16 KiB, a window of ciphertext at a
 * time. peer_host: for a client, the host its certificate must name (NULL: not checked).
 * A failed handshake closes c with TS_EAUTH and errmsg saying why; a plaintext peer is
 * refused with an Error frame it can read (a shard's side) or a clear errmsg (a client's).
 * ctx must outlive c. 0 or TS_ENOMEM. */
int ts_conn_use_tls(ts_conn_t *c, struct ts_tls_ctx *ctx, const char *peer_host);

/* Set TCP_NODELAY and a 4 MiB receive buffer (the send buffer autotuned), record the peer
 * address, and start reading. */
int ts_conn_start(ts_conn_t *c);

/* Send one frame: header + packed meta, then the payload buffers payload[0..n) whose lengths
 * must add up to what the meta describes. The payload memory must stay valid and unchanged
 * until cb is called (cb may be NULL). Returns 0 or a negative error, in which case cb is not
 * called. */
int ts_conn_send(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg, const uv_buf_t *payload,
                 unsigned n, ts_conn_write_cb cb, void *arg);

/* Like ts_conn_send, but the payload is written in groups of about TS_CONN_WRITE_GROUP bytes
 * (whole buffers) and cb reports each group as soon as it is out, so the owner can release
 * the memory of the first buffers of a large frame while the rest is still on its way.
 * Once it returns 0, cb reports every buffer exactly once, never from inside this call, and
 * the call with `last` comes after all others (also when a later group cannot be queued:
 * the connection then closes and the rest is reported as cancelled). */
#define TS_CONN_WRITE_GROUP (1u << 20)
int ts_conn_send_parts(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg,
                       const uv_buf_t *payload, unsigned n, ts_conn_parts_cb cb, void *arg);

/* Go on reading after on_meta or on_piece returned TS_CONN_HOLD (a no-op otherwise). May run
 * on_piece and on_frame callbacks of this connection before it returns. */
void ts_conn_resume(ts_conn_t *c);

/* Bytes of the frames queued so far (bytes_out counts them) whose buffers the connection no
 * longer reads: handed to the kernel, or with TLS encrypted. A request's payload sent from
 * the caller's memory is out of it once this reaches bytes_out as it was after the send. */
uint64_t ts_conn_released(const ts_conn_t *c);

/* How long bytes have been waiting to be written without any of them being written (ms; 0
 * when nothing waits): a peer that stopped reading shows a growing stall, one that reads
 * slowly does not. Bytes are seen moving when this is called, so call it regularly (a
 * timer); a write completing counts at once. */
uint64_t ts_conn_write_stall_ms(ts_conn_t *c, uint64_t now_ms);

/* How long the connection has been in the middle of a frame, reading, without a byte
 * arriving (ms; 0 between frames and while reading is held back or paused): a peer that
 * stopped sending half way through a frame shows a growing stall. */
uint64_t ts_conn_read_stall_ms(const ts_conn_t *c, uint64_t now_ms);

/* How long the frame in progress has been read (ms; 0 between frames): the time since its
 * first byte, less the time reading was held back (by the owner) or paused (our write
 * queue), which is not the peer's. With c->frame_bytes, the bytes of it that arrived, this
 * gives the frame's average rate, so a peer trickling a frame is told from one sending a
 * large frame slowly but steadily. */
uint64_t ts_conn_frame_age_ms(const ts_conn_t *c, uint64_t now_ms);

/* Send an Error frame for request_id. */
int ts_conn_send_error(ts_conn_t *c, uint64_t request_id, int code, const char *detail);

/* Send an Error frame, then close once it is written (a protocol violation). */
void ts_conn_fail(ts_conn_t *c, uint64_t request_id, int code, const char *detail);

/* Stop reading and close once everything queued is written (a reply sent just before a
 * shutdown still reaches the peer). */
void ts_conn_close_graceful(ts_conn_t *c, int err);

/* Close: stop reading, cancel pending writes (their callbacks see UV_ECANCELED), and call
 * on_close from the close callback. Safe to call more than once. */
void ts_conn_close(ts_conn_t *c, int err);

/* Add delta (negative to give back) to c->write_mem and *c->write_mem_total: memory the
 * owner keeps for a queued reply (bookkeeping freed with it), so it counts in the same
 * budget. The owner gives back what it charged, at the latest from on_close. */
void ts_conn_charge(ts_conn_t *c, int64_t delta);

/* Bytes waiting in the write queue. */
size_t ts_conn_write_queue(const ts_conn_t *c);

#endif
