/*
 * A framed connection over TLS (ts_conn_use_tls): ciphertext is read into one buffer and
 * decrypted straight into the buffer the frame state machine expects next; writes wait in a
 * queue and are encrypted a window at a time (small buffers gathered into one record), so a
 * 400 MiB frame never has 400 MiB of ciphertext behind it. A request's callback runs when
 * the block holding its last byte is written, as for a plaintext write.
 */
#include <string.h>

#include "ts_alloc.h"
#include "ts_conn_int.h"
#include "ts_err.h"
#include "ts_log.h"

/* Ciphertext read at a time, and in flight to libuv at most before more is encrypted. */
#define TLS_READ_BUF (128 * 1024)
#define TLS_WINDOW (4u << 20)
#define TLS_CHUNK (1u << 20)   /* plaintext encrypted into one block */
#define TLS_RECORD 16384       /* TLS's largest record: smaller buffers are gathered */

typedef struct {
  uv_write_t req;
  ts_conn_t *conn;
  uint64_t seq;
  size_t len, mem;
  void *data; /* ts_tls_take_output's buffer */
} tls_block_t;

int ts_conn_use_tls(ts_conn_t *c, struct ts_tls_ctx *ctx, const char *peer_host) {
  struct ts_conn_tls *s = ts_calloc(1, sizeof *s);
  if (!s) return TS_ENOMEM;
  s->tls = ts_tls_new(ctx, peer_host);
  if (!s->tls) {
    ts_free(s);
    return TS_ENOMEM;
  }
  s->starved = true;
  c->tls = s;
  return 0;
}

/* Close after what is queued (an alert) is written, with errmsg saying why. */
static void tls_fail(ts_conn_t *c, int err, const char *what) {
  snprintf(c->errmsg, sizeof c->errmsg, "%s with %s: %s%s", what, c->peer,
           c->tls->ready && err == TS_EAUTH ? "the peer refused this side: " : "",
           ts_tls_errmsg(c->tls->tls));
  ts_log_warn("%s", c->errmsg);
  ts_conn_close_graceful(c, err);
}

static void on_block_written(uv_write_t *req, int status);

/* Hand what TLS produced (records, an alert, the handshake's messages) to libuv as one
 * block. */
static void send_output(ts_conn_t *c) {
  struct ts_conn_tls *s = c->tls;
  if (ts_tls_output(s->tls) == 0 || c->closing) return;
  tls_block_t *b = ts_malloc(sizeof *b);
  if (!b) {
    snprintf(c->errmsg, sizeof c->errmsg, "out of memory for TLS output");
    ts_conn_close(c, TS_ENOMEM);
    return;
  }
  b->data = ts_tls_take_output(s->tls, &b->len);
  b->conn = c;
  b->seq = ++s->blocks;
  b->mem = ts_alloc_cost(sizeof *b) + ts_alloc_cost(b->len);
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->handle) == 0 && s->pending == 0)
    c->write_progress_ms = uv_now(c->handle.loop);
  uv_buf_t buf = uv_buf_init(b->data, (unsigned)b->len);
  int rc = uv_write(&b->req, (uv_stream_t *)&c->handle, &buf, 1, on_block_written);
  if (rc < 0) {
    ts_free(b->data);
    ts_free(b);
    snprintf(c->errmsg, sizeof c->errmsg, "cannot write: %s", uv_strerror(rc));
    ts_conn_close(c, rc);
    return;
  }
  s->inflight += b->len;
  ts_conn_charge(c, (int64_t)b->mem);
}

static int stage_flush(struct ts_conn_tls *s) {
  if (s->stage_len == 0) return 0;
  int rc = ts_tls_write(s->tls, s->stage, s->stage_len);
  s->stage_len = 0;
  return rc;
}

/* Encrypt n bytes: gathered with their neighbours when small, else as they are. */
static int encrypt(struct ts_conn_tls *s, const char *p, size_t n) {
  if (s->stage_len + n <= TLS_RECORD) {
    memcpy(s->stage + s->stage_len, p, n);
    s->stage_len += n;
    return 0;
  }
  int rc = stage_flush(s);
  if (rc < 0) return rc;
  if (n < TLS_RECORD) {
    memcpy(s->stage, p, n);
    s->stage_len = n;
    return 0;
  }
  return ts_tls_write(s->tls, p, n);
}

/* Encrypt queued requests while less than a window of ciphertext is in flight. */
static void flush_writes(ts_conn_t *c) {
  struct ts_conn_tls *s = c->tls;
  if (!s->ready || c->closing) return;
  if (!s->stage && !(s->stage = ts_malloc(TLS_RECORD))) {
    ts_conn_close(c, TS_ENOMEM);
    return;
  }
  while (s->queue && s->inflight < TLS_WINDOW && !c->closing) {
    size_t budget = TLS_CHUNK;
    int rc = 0;
    while (s->queue && budget > 0 && rc == 0) {
      write_req_t *w = s->queue;
      while (s->buf_i < w->nbufs && budget > 0 && rc == 0) {
        const uv_buf_t *b = &w->bufs[s->buf_i];
        size_t n = b->len - s->buf_off < budget ? b->len - s->buf_off : budget;
        if (n) rc = encrypt(s, b->base + s->buf_off, n);
        s->buf_off += n;
        s->pending -= n;
        budget -= n;
        if (s->buf_off == b->len) {
          s->buf_i++;
          s->buf_off = 0;
        }
      }
      if (s->buf_i < w->nbufs) break; /* the budget ran out inside this request */
      s->queue = w->tls_next;
      if (!s->queue) s->queue_tail = NULL;
      s->buf_i = 0;
      s->buf_off = 0;
      w->tls_next = NULL;
      w->tls_block = s->blocks + 1; /* the block send_output makes next */
      if (s->sent_tail) s->sent_tail->tls_next = w;
      else s->sent = w;
      s->sent_tail = w;
    }
    if (rc == 0) rc = stage_flush(s);
    if (rc < 0) {
      snprintf(c->errmsg, sizeof c->errmsg, "TLS: %s", ts_tls_errmsg(s->tls));
      ts_conn_close(c, rc);
      return;
    }
    send_output(c);
  }
}

static void on_block_written(uv_write_t *req, int status) {
  tls_block_t *b = (tls_block_t *)req;
  ts_conn_t *c = b->conn;
  struct ts_conn_tls *s = c->tls;
  uint64_t seq = b->seq;
  s->inflight -= b->len;
  ts_conn_charge(c, -(int64_t)b->mem);
  ts_free(b->data);
  ts_free(b);
  c->write_progress_ms = uv_now(c->handle.loop);
  while (s->sent && s->sent->tls_block <= seq) {
    write_req_t *w = s->sent;
    s->sent = w->tls_next;
    if (!s->sent) s->sent_tail = NULL;
    ts_conn_int_write_done(w, status);
  }
  if (!ts_conn_int_after_write(c, status)) flush_writes(c);
}

int ts_conn_tls_queue(ts_conn_t *c, write_req_t *w) {
  struct ts_conn_tls *s = c->tls;
  w->tls_next = NULL;
  for (unsigned i = 0; i < w->nbufs; i++) s->pending += w->bufs[i].len;
  if (s->queue_tail) s->queue_tail->tls_next = w;
  else s->queue = w;
  s->queue_tail = w;
  flush_writes(c);
  return 0;
}

void ts_conn_tls_start(ts_conn_t *c) {
  /* A client's hello; a shard's handshake waits for it. */
  ts_conn_tls_pump(c);
}

void ts_conn_tls_alloc(ts_conn_t *c, uv_buf_t *buf) {
  struct ts_conn_tls *s = c->tls;
  ts_require(ts_tls_input(s->tls) == 0); /* the buffer is TLS's until then */
  if (!s->in) s->in = ts_malloc(TLS_READ_BUF);
  *buf = s->in ? uv_buf_init((char *)s->in, TLS_READ_BUF) : uv_buf_init(NULL, 0);
}

/* The peer's first bytes are a Tessera frame: it speaks plaintext. A shard answers with an
 * Error frame the client can read; a client stops with a clear reason. */
static void plaintext_peer(ts_conn_t *c) {
  if (ts_tls_server(c->tls->tls)) {
    ts_log_warn("%s: a plaintext client on a TLS port (auth.tls = true here): refused", c->peer);
    c->tls->plain = true;
    ts_conn_fail(c, 0, TS_EAUTH,
                 "this shard requires TLS (auth.tls = true in its job file): a plaintext "
                 "client is refused");
    return;
  }
  snprintf(c->errmsg, sizeof c->errmsg,
           "%s answered in plaintext: it does not use TLS (auth.tls must be the same on both "
           "sides)",
           c->peer);
  ts_conn_close(c, TS_EAUTH);
}

void ts_conn_tls_read(ts_conn_t *c, const char *bytes, size_t n) {
  struct ts_conn_tls *s = c->tls;
  if (!s->ready && s->first_n < 4) {
    size_t k = 4 - s->first_n < n ? 4 - s->first_n : n;
    memcpy(s->first + s->first_n, bytes, k);
    s->first_n += (unsigned)k;
    if (memcmp(s->first, TS_FRAME_MAGIC, s->first_n) == 0) {
      if (s->first_n < 4) return; /* not sure yet: wait for the rest */
      plaintext_peer(c);
      return;
    }
  }
  /* The socket is read only once TLS has read all it was lent (starved). */
  ts_require(ts_tls_feed(s->tls, bytes, n) == 0);
  s->starved = false;
  ts_conn_tls_pump(c);
}

void ts_conn_tls_pump(ts_conn_t *c) {
  struct ts_conn_tls *s = c->tls;
  if (s->pumping || c->closing) return;
  s->pumping = true;
  if (!s->ready) {
    int rc = ts_tls_handshake(s->tls);
    send_output(c);
    if (rc < 0) {
      s->pumping = false;
      tls_fail(c, rc, "TLS handshake");
      return;
    }
    if (rc == 0) {
      s->starved = true;
      s->pumping = false;
      ts_conn_int_update_reading(c);
      return;
    }
    s->ready = true;
    flush_writes(c); /* frames sent during the handshake */
  }
  /* What was decrypted is handed on piece by piece; replies made meanwhile cork, as for a
   * read-ahead (ts_conn.h). */
  c->feeding = true;
  while (!c->closing && ts_conn_int_may_read(c)) {
    uv_buf_t b;
    ts_conn_int_next_buf(c, &b);
    if (!b.base || b.len == 0) {
      ts_conn_close(c, UV_ENOBUFS);
      break;
    }
    long n = ts_tls_read(s->tls, b.base, b.len);
    send_output(c); /* a key update's answer */
    if (n == 0) {
      s->starved = true;
      break;
    }
    if (n < 0) {
      c->feeding = false;
      s->pumping = false;
      if (n == TS_ECLOSED) ts_conn_close(c, TS_ECLOSED);
      else tls_fail(c, (int)n, "TLS");
      return;
    }
    ts_conn_int_advance(c, (size_t)n);
  }
  c->feeding = false;
  s->pumping = false;
  ts_conn_int_flush_cork(c);
  if (!c->closing) ts_conn_int_update_reading(c);
}

void ts_conn_tls_closed(ts_conn_t *c) {
  struct ts_conn_tls *s = c->tls;
  /* libuv has cancelled the blocks it held (their requests are done); what was never
   * encrypted or written is cancelled here, in order. */
  while (s->sent || s->queue) {
    write_req_t *w = s->sent ? s->sent : s->queue;
    if (w == s->sent) s->sent = w->tls_next;
    else s->queue = w->tls_next;
    ts_conn_int_write_done(w, UV_ECANCELED);
  }
  s->sent_tail = s->queue_tail = NULL;
  s->pending = 0;
  ts_tls_free(s->tls);
  ts_free(s->in);
  ts_free(s->stage);
  ts_free(s);
  c->tls = NULL;
}
