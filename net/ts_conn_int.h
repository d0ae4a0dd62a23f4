/*
 * What ts_conn.c and ts_conn_tls.c share, and nobody else: a queued write, the TLS state of
 * a connection, and the steps of the read and write paths the TLS layer drives.
 */
#ifndef TS_CONN_INT_H
#define TS_CONN_INT_H

#include "ts_conn.h"
#include "ts_tls.h"

/* A queued write: one frame, part of one (ts_conn_send_parts), or replies held back (cork). */
typedef struct write_req write_req_t;
struct write_req {
  uv_write_t req;
  ts_conn_t *conn;
  ts_conn_write_cb cb;      /* a whole frame (ts_conn_send) */
  ts_conn_parts_cb pcb;     /* or a group of payload buffers (ts_conn_send_parts) */
  void *arg;
  unsigned first, count;    /* pcb: the payload buffers this request carries */
  bool last;                /* the frame's final request */
  unsigned corked;          /* whole frames held back (cork) that went out before it */
  size_t mem;               /* charged to write_mem while queued */
  write_req_t *tls_next;    /* TLS: the next request waiting to be encrypted or written */
  uint64_t tls_block;       /* TLS: the ciphertext block its last byte went out in */
  unsigned nbufs;
  uv_buf_t bufs[];
};

/* A connection's TLS (ts_conn_use_tls). Requests wait in `queue` to be encrypted, a window
 * of ciphertext at a time, then in `sent` until the block holding their last byte is
 * written: their callbacks run then, in order, as for a plaintext write. */
struct ts_conn_tls {
  ts_tls_t *tls;
  bool ready;          /* handshake done */
  bool starved;        /* the last read needs more ciphertext: the socket may be read */
  bool pumping;        /* ts_conn_tls_pump is on the stack */
  bool plain;          /* refusing a plaintext peer: its Error frame goes out in plaintext */
  uint8_t first[4];    /* the peer's first bytes (a plaintext frame starts "TSR1") */
  unsigned first_n;
  uint8_t *in;         /* ciphertext read buffer */
  uint8_t *stage;      /* small buffers gathered into one record */
  size_t stage_len;
  write_req_t *queue, *queue_tail; /* waiting to be encrypted; the head from buf_i/buf_off */
  unsigned buf_i;
  size_t buf_off;
  write_req_t *sent, *sent_tail;   /* encrypted, waiting for their block */
  uint64_t blocks;     /* ciphertext blocks handed to libuv so far */
  size_t pending;      /* plaintext bytes in `queue` not encrypted yet */
  size_t inflight;     /* ciphertext bytes handed to libuv, not written yet */
};

/* ts_conn.c's steps, for the TLS layer. */
void ts_conn_int_next_buf(ts_conn_t *c, uv_buf_t *buf);  /* where the next bytes go */
void ts_conn_int_advance(ts_conn_t *c, size_t n);        /* n bytes landed there */
bool ts_conn_int_may_read(const ts_conn_t *c);
void ts_conn_int_update_reading(ts_conn_t *c);
void ts_conn_int_flush_cork(ts_conn_t *c);
void ts_conn_int_write_done(write_req_t *w, int status); /* callbacks, budget, close */
/* After a write completed with status: close on a failure, or when a close waits for the
 * queue to drain. True when the connection is closing. */
bool ts_conn_int_after_write(ts_conn_t *c, int status);

/* ts_conn_tls.c, called by ts_conn.c where a TLS connection differs. */
void ts_conn_tls_start(ts_conn_t *c);                    /* a client says hello */
void ts_conn_tls_alloc(ts_conn_t *c, uv_buf_t *buf);     /* ciphertext read buffer */
void ts_conn_tls_read(ts_conn_t *c, const char *bytes, size_t n);
void ts_conn_tls_pump(ts_conn_t *c);                     /* decrypt into the frame */
int ts_conn_tls_queue(ts_conn_t *c, write_req_t *w);     /* encrypt and write */
void ts_conn_tls_closed(ts_conn_t *c);                   /* cancel the queue, free */

#endif
