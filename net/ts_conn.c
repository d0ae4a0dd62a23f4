/*
 * The framed connection (ts_conn.h): reading is the state machine of header, meta, payload
 * and discard, fed by libuv's alloc_cb with exactly the buffer expected next (or an 8 KiB
 * read-ahead at a frame boundary, handed on piece by piece as if read into each buffer);
 * writing queues header + meta in one allocation and the payload from the caller's memory
 * in one uv_write, with corking while read-ahead frames are still being handed on, budgets
 * on what is queued, and one way out, ts_conn_close. ts_require marks each state change.
 */
#include "ts_conn.h"
#include "ts_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

#define SCRATCH_SIZE (64 * 1024)
/* The read-ahead at frame boundaries: a 4 KiB push with the pull behind it, or a pull reply
 * of 4 KiB with the push reply before it, with room to spare. */
#define TS_CONN_READ_AHEAD (8 * 1024)
/* The most bytes of small replies held back to go out with the next write (ts_conn.h). */
#define CORK_MAX 4096
/* The receive buffer asked for (the kernel doubles it, up to net.core.rmem_max). The send
 * buffer is left to the kernel's autotuning (net.ipv4.tcp_wmem), which keeps it as small as
 * the path needs: a fixed 4 MiB SO_SNDBUF (8 MiB in flight per connection) cost 10-15 % of
 * the push+pull throughput at 40 and 400 MiB with 2 shards + 2 workers on loopback, the
 * socket buffers' pages no longer recycled while still in the caches (bench/RESULTS.md
 * section 12.2). */
#define RECV_BUFFER (4 * 1024 * 1024)


static void on_close(uv_handle_t *h);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void feed(ts_conn_t *c);
static void flush_cork(ts_conn_t *c);

int ts_conn_init(uv_loop_t *loop, ts_conn_t *c, const ts_conn_cbs_t *cbs, uint64_t max_data,
                 void *data) {
  memset(c, 0, sizeof *c);
  c->cbs = cbs;
  c->data = data;
  c->max_data = max_data;
  c->max_write_queue = 256u << 20;
  c->max_meta = TS_FRAME_MAX_META;
  c->state = TS_CONN_READ_HEADER;
  snprintf(c->peer, sizeof c->peer, "?");
  int rc = uv_tcp_init(loop, &c->handle);
  if (rc < 0) return rc;
  c->handle.data = c;
  return 0;
}

int ts_conn_start(ts_conn_t *c) {
  uv_tcp_nodelay(&c->handle, 1);
  int size = RECV_BUFFER;
  uv_recv_buffer_size((uv_handle_t *)&c->handle, &size);

  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&c->handle, (struct sockaddr *)&ss, &len) == 0) {
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      uv_ip4_name(a, ip, sizeof ip);
      port = ntohs(a->sin_port);
      snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      uv_ip6_name(a, ip, sizeof ip);
      port = ntohs(a->sin6_port);
      snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, port);
    }
  }
  int rc = uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
  if (rc == 0) c->reading = true;
  c->read_progress_ms = uv_now(c->handle.loop);
  if (rc == 0 && c->tls) ts_conn_tls_start(c);
  return rc;
}

void ts_conn_charge(ts_conn_t *c, int64_t delta) {
  c->write_mem += (uint64_t)delta;
  if (c->write_mem_total) *c->write_mem_total += (uint64_t)delta;
}

/* Reads pause while either the bytes or the memory of the write queue is over its limit. */
static bool write_queue_full(const ts_conn_t *c) {
  return ts_conn_write_queue(c) > c->max_write_queue ||
         (c->max_write_mem && c->write_mem > c->max_write_mem);
}

static bool write_queue_drained(const ts_conn_t *c) {
  return ts_conn_write_queue(c) <= c->max_write_queue / 2 &&
         (!c->max_write_mem || c->write_mem <= c->max_write_mem / 2);
}

size_t ts_conn_write_queue(const ts_conn_t *c) {
  /* With TLS: ciphertext handed to libuv, and plaintext still to be encrypted once the
   * handshake is done (frames waiting for a handshake that never ends never go: they hold
   * no close back). */
  return uv_stream_get_write_queue_size((const uv_stream_t *)&c->handle) +
         (c->tls && c->tls->ready ? c->tls->pending : 0);
}

uint64_t ts_conn_released(const ts_conn_t *c) {
  uint64_t held = c->cork_len + (c->tls ? c->tls->pending
                                        : uv_stream_get_write_queue_size(
                                              (const uv_stream_t *)&c->handle));
  return c->bytes_out - held;
}

void ts_conn_close(ts_conn_t *c, int err) {
  if (c->closing) return;
  c->closing = true;
  c->close_err = err;
  if (c->reading) uv_read_stop((uv_stream_t *)&c->handle);
  c->reading = false;
  uv_close((uv_handle_t *)&c->handle, on_close);
}

static void on_close(uv_handle_t *h) {
  ts_conn_t *c = h->data;
  if (c->tls) ts_conn_tls_closed(c); /* libuv cancelled what it held; now what we hold */
  ts_free(c->meta);
  c->meta = NULL;
  ts_free(c->scratch);
  c->scratch = NULL;
  ts_free(c->ra);
  c->ra = NULL;
  c->ra_off = c->ra_len = 0;
  ts_free(c->cork);
  c->cork = NULL;
  c->cork_len = c->cork_cap = 0;
  c->cork_frames = 0;
  ts_msg_free(c->msg);
  c->msg = NULL;
  if (c->cbs->on_close) c->cbs->on_close(c, c->close_err);
}

/* --- reading ----------------------------------------------------------------------- */

/* Read unless something holds reading back: a close, the owner (held), or our own write
 * queue (paused). */
static bool mid_frame(const ts_conn_t *c) {
  return c->state != TS_CONN_READ_HEADER || c->got > 0;
}

static bool may_read(const ts_conn_t *c) {
  return !c->closing && !c->close_after_write && !c->held && !c->paused;
}

static void update_reading(ts_conn_t *c) {
  /* Bytes read ahead go first: the socket is read once they are all handed on. So do
   * bytes TLS has decrypted, or can. */
  if (may_read(c) && c->ra_off < c->ra_len && !c->feeding) feed(c);
  if (c->tls && may_read(c) && !c->tls->starved && !c->tls->pumping) ts_conn_tls_pump(c);
  if (c->closing) return;
  /* While the read-ahead is being handed on (feed), reading follows may_read alone: the
   * socket is read no earlier than feed returns with nothing left, and when it returns with
   * bytes left, reading was stopped by what stopped it (held, paused, closing). */
  bool want = may_read(c) && (c->feeding || c->ra_off == c->ra_len) &&
              (!c->tls || c->tls->starved);
  uint64_t now = uv_now(c->handle.loop);
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read) == 0) c->reading = true;
    c->read_progress_ms = now; /* the time held back is not the peer's */
    c->frame_mark_ms = now;
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->handle);
    c->reading = false;
    if (mid_frame(c) && now > c->frame_mark_ms) c->frame_active_ms += now - c->frame_mark_ms;
  }
}

uint64_t ts_conn_frame_age_ms(const ts_conn_t *c, uint64_t now_ms) {
  if (!mid_frame(c)) return 0;
  uint64_t age = c->frame_active_ms;
  if (c->reading && now_ms > c->frame_mark_ms) age += now_ms - c->frame_mark_ms;
  return age;
}

/* Where the next bytes of the frame go: at most what the current piece still needs. */
static void next_buf(ts_conn_t *c, uv_buf_t *buf) {
  switch (c->state) {
    case TS_CONN_READ_HEADER:
      *buf = uv_buf_init((char *)c->header + c->got, (unsigned)(TS_FRAME_HEADER_SIZE - c->got));
      return;
    case TS_CONN_READ_META:
      *buf = uv_buf_init((char *)c->meta + c->got, (unsigned)(c->hdr.meta_len - c->got));
      return;
    case TS_CONN_READ_DATA: {
      const uv_buf_t *d = &c->dst[c->dst_i];
      size_t left = d->len - c->dst_off;
      if (left > (1u << 30)) left = 1u << 30;
      *buf = uv_buf_init(d->base + c->dst_off, (unsigned)left);
      return;
    }
    case TS_CONN_READ_DISCARD: {
      uint64_t left = c->hdr.data_len - c->got;
      if (!c->scratch) c->scratch = ts_malloc(SCRATCH_SIZE);
      if (!c->scratch) {
        *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS to on_read */
        return;
      }
      *buf = uv_buf_init((char *)c->scratch, (unsigned)(left < SCRATCH_SIZE ? left : SCRATCH_SIZE));
      return;
    }
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  ts_conn_t *c = h->data;
  if (c->tls) {
    ts_conn_tls_alloc(c, buf);
    return;
  }
  /* Reading is started only once the read-ahead is used up (update_reading). */
  ts_require(c->ra_off == c->ra_len);
  if (c->state == TS_CONN_READ_HEADER && c->got == 0) {
    if (!c->ra) c->ra = ts_malloc(TS_CONN_READ_AHEAD); /* without it: the header alone */
    if (c->ra) {
      *buf = uv_buf_init((char *)c->ra, TS_CONN_READ_AHEAD);
      return;
    }
  }
  next_buf(c, buf);
}

static void reset_frame(ts_conn_t *c) {
  c->state = TS_CONN_READ_HEADER;
  c->got = 0;
  c->msg = NULL;
  c->dst = NULL;
  c->dst_n = c->dst_i = 0;
  c->dst_off = 0;
}

static void deliver(ts_conn_t *c, bool discarded) {
  /* A frame is handed on once, whole: every payload byte is in (or thrown away). */
  ts_require(c->got == c->hdr.data_len || c->hdr.data_len == 0);
  ProtobufCMessage *msg = c->msg;
  ts_frame_header_t h = c->hdr;
  reset_frame(c);
  c->frames_in++;
  c->cbs->on_frame(c, &h, msg, discarded);
  if (!c->closing && !c->paused && write_queue_full(c)) {
    /* The peer sends faster than it reads our replies: stop reading until it catches up,
     * so a flood cannot grow our write queue (its bytes or its memory) without bound. */
    c->paused = true;
    update_reading(c);
  }
}

static void meta_done(ts_conn_t *c) {
  /* From the header (no meta) or the meta state, and a frame's meta is decoded once. */
  ts_require((c->state == TS_CONN_READ_META || c->state == TS_CONN_READ_HEADER) && !c->msg);
  char err[256];
  int rc = ts_msg_decode(c->hdr.type, c->meta, c->hdr.meta_len, c->hdr.data_len, &c->msg, err,
                         sizeof err);
  if (rc < 0) {
    ts_log_warn("%s: closing connection: %s", c->peer, err);
    ts_conn_fail(c, 0, rc, err);
    return;
  }
  const uv_buf_t *dst = NULL;
  unsigned ndst = 0;
  rc = c->cbs->on_meta(c, &c->hdr, c->msg, &dst, &ndst);
  if (rc < 0) {
    ts_conn_close(c, rc);
    return;
  }
  if (c->closing) return;
  if (rc == TS_CONN_HOLD && (c->hdr.data_len == 0 || !dst)) rc = 0; /* nothing to wait for */
  if (c->hdr.data_len == 0) {
    deliver(c, false);
    return;
  }
  c->got = 0;
  uint64_t total = 0;
  for (unsigned i = 0; dst && i < ndst; i++) total += dst[i].len;
  if (dst && ts_fails_assert(total == c->hdr.data_len)) dst = NULL;
  if (dst) {
    c->dst = dst;
    c->dst_n = ndst;
    c->dst_i = 0;
    c->dst_off = 0;
    while (c->dst_i < c->dst_n && c->dst[c->dst_i].len == 0) c->dst_i++;
    c->state = TS_CONN_READ_DATA;
    if (rc == TS_CONN_HOLD) {
      c->held = true;
      update_reading(c);
    }
  } else {
    c->state = TS_CONN_READ_DISCARD;
  }
}

static void header_done(ts_conn_t *c) {
  ts_require(c->state == TS_CONN_READ_HEADER);
  if (c->hdr.meta_len > c->meta_cap) {
    size_t cap = c->meta_cap ? c->meta_cap : 256;
    while (cap < c->hdr.meta_len) cap *= 2;
    uint8_t *m = ts_realloc(c->meta, cap);
    if (!m) {
      ts_conn_fail(c, 0, TS_ENOMEM, "out of memory for frame meta");
      return;
    }
    c->meta = m;
    c->meta_cap = cap;
  }
  c->got = 0;
  if (c->hdr.meta_len == 0) {
    meta_done(c);
  } else {
    c->state = TS_CONN_READ_META;
  }
}

/* Move past the filled buffer dst[dst_i] (and any empty ones); the frame is complete after
 * the last. */
static void next_piece(ts_conn_t *c) {
  c->dst_i++;
  c->dst_off = 0;
  while (c->dst_i < c->dst_n && c->dst[c->dst_i].len == 0) c->dst_i++;
  if (c->got == c->hdr.data_len) deliver(c, false);
}

static void piece_done(ts_conn_t *c) {
  ts_require(c->state == TS_CONN_READ_DATA && c->dst_off == c->dst[c->dst_i].len);
  if (c->cbs->on_piece) {
    int rc = c->cbs->on_piece(c, c->dst_i);
    if (rc < 0) {
      ts_conn_close(c, rc);
      return;
    }
    if (c->closing) return;
    if (rc == TS_CONN_HOLD) {
      c->held = true;
      update_reading(c);
      return;
    }
  }
  next_piece(c);
}

void ts_conn_resume(ts_conn_t *c) {
  if (!c->held || c->closing) return;
  c->held = false;
  /* Held after a full buffer: move on from it (this may complete the frame). Held at the
   * meta: the first buffer is still empty, reading simply starts. */
  if (c->state == TS_CONN_READ_DATA && c->dst_i < c->dst_n && c->dst_off == c->dst[c->dst_i].len)
    next_piece(c);
  if (!c->closing) update_reading(c);
}

static void advance(ts_conn_t *c, size_t n);

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  ts_conn_t *c = s->data;
  if (c->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      if (c->state != TS_CONN_READ_HEADER || c->got != 0)
        ts_log_warn("%s: connection closed in the middle of a frame", c->peer);
      ts_conn_close(c, TS_ECLOSED);
    } else {
      ts_conn_close(c, (int)nread);
    }
    return;
  }
  if (nread == 0) return;
  c->read_progress_ms = uv_now(c->handle.loop);
  c->bytes_in += (uint64_t)nread;
  if (c->tls) {
    ts_conn_tls_read(c, buf->base, (size_t)nread);
    return;
  }
  if (c->ra && buf->base == (char *)c->ra) {
    c->ra_off = 0;
    c->ra_len = (size_t)nread;
    feed(c);
    return;
  }
  advance(c, (size_t)nread);
}

/* Hand the read-ahead on, piece by piece, as if each piece had just been read into the
 * buffer next_buf names, until it is used up or reading stops (held, paused, closing). */
static void feed(ts_conn_t *c) {
  c->feeding = true;
  while (c->ra_off < c->ra_len && may_read(c)) {
    uv_buf_t b;
    next_buf(c, &b);
    if (!b.base || b.len == 0) { /* no scratch memory for a discarded payload */
      ts_conn_close(c, UV_ENOBUFS);
      break;
    }
    size_t n = c->ra_len - c->ra_off < b.len ? c->ra_len - c->ra_off : b.len;
    memcpy(b.base, c->ra + c->ra_off, n);
    c->ra_off += n;
    advance(c, n);
  }
  c->feeding = false;
  if (c->ra_off == c->ra_len) c->ra_off = c->ra_len = 0;
  flush_cork(c);
}

/* n bytes of the frame have landed in the buffer next_buf named. */
static void advance(ts_conn_t *c, size_t n) {
  ssize_t nread = (ssize_t)n;
  uint64_t now = uv_now(c->handle.loop);
  /* next_buf never hands out more than the current piece, so n bytes belong to one frame. */
  if (!mid_frame(c)) {
    c->frame_bytes = 0;
    c->frame_active_ms = 0;
    c->frame_mark_ms = now;
  }
  c->frame_bytes += (uint64_t)nread;
  c->got += (size_t)nread;
  switch (c->state) {
    case TS_CONN_READ_HEADER: {
      const char *desc = NULL;
      int rc = ts_frame_decode_header(c->header, c->got, c->max_data, &c->hdr, &desc);
      if (rc == TS_EINCOMPLETE) return;
      if (rc < 0 && c->header[0] == 0x16 && (c->got < 2 || c->header[1] == 0x03))
        desc = "a TLS handshake on a plaintext connection: auth.tls must be the same on both "
               "sides";
      if (rc < 0) {
        ts_log_warn("%s: closing connection: %s (%s)", c->peer, desc ? desc : "bad header",
                    ts_err_name(rc));
        ts_conn_fail(c, 0, rc, desc ? desc : "bad frame header");
        return;
      }
      if (c->hdr.meta_len > c->max_meta) {
        char why[160];
        snprintf(why, sizeof why, "frame meta of %u bytes is larger than the %u accepted now%s",
                 c->hdr.meta_len, c->max_meta,
                 c->max_meta < TS_FRAME_MAX_META ? " (before the handshake)" : "");
        ts_log_warn("%s: closing connection: %s", c->peer, why);
        ts_conn_fail(c, 0, TS_ETOOBIG, why);
        return;
      }
      header_done(c);
      return;
    }
    case TS_CONN_READ_META:
      if (c->got == c->hdr.meta_len) meta_done(c);
      return;
    case TS_CONN_READ_DATA:
      c->dst_off += (size_t)nread;
      if (c->dst_off == c->dst[c->dst_i].len) piece_done(c);
      return;
    case TS_CONN_READ_DISCARD:
      if (c->got == c->hdr.data_len) deliver(c, true);
      return;
  }
}

/* --- writing ----------------------------------------------------------------------- */

static void on_write(uv_write_t *req, int status) {
  ts_conn_int_write_done((write_req_t *)req, status);
}

bool ts_conn_int_after_write(ts_conn_t *c, int status) {
  if (c->closing) return true;
  if (status < 0 && status != UV_ECANCELED) {
    ts_conn_close(c, status);
    return true;
  }
  if (c->close_after_write && ts_conn_write_queue(c) == 0) {
    ts_conn_close(c, c->close_err);
    return true;
  }
  return false;
}

void ts_conn_int_write_done(write_req_t *w, int status) {
  ts_conn_t *c = w->conn;
  c->write_progress_ms = uv_now(c->handle.loop);
  if (status == 0) c->frames_out += w->corked + (w->last ? 1u : 0u);
  if (w->cb) w->cb(c, w->arg, status);
  if (w->pcb) w->pcb(c, w->arg, w->first, w->count, w->last, status);
  ts_conn_charge(c, -(int64_t)w->mem);
  ts_free(w);
  if (ts_conn_int_after_write(c, status)) return;
  if (c->paused && write_queue_drained(c)) {
    c->paused = false;
    update_reading(c);
  }
}

uint64_t ts_conn_write_stall_ms(ts_conn_t *c, uint64_t now_ms) {
  size_t queued = ts_conn_write_queue(c);
  if (queued == 0) return 0;
  /* Bytes handed to the kernel since the last look are progress too: one request (a large
   * partition of a pull reply) may take seconds to complete while its bytes flow steadily.
   * bytes_out counts every byte queued, the queue those not yet written. */
  uint64_t written = c->bytes_out - queued;
  if (written != c->written_seen) {
    c->written_seen = written;
    c->write_progress_ms = now_ms;
  }
  if (now_ms < c->write_progress_ms) return 0;
  return now_ms - c->write_progress_ms;
}

uint64_t ts_conn_read_stall_ms(const ts_conn_t *c, uint64_t now_ms) {
  if (!c->reading || !mid_frame(c) || now_ms < c->read_progress_ms) return 0;
  return now_ms - c->read_progress_ms;
}

/* Queue one write request; the stall clock starts when the queue goes from empty to not. */
static int queue_write(ts_conn_t *c, write_req_t *w, size_t alloc_bytes) {
  if (ts_conn_write_queue(c) == 0) c->write_progress_ms = uv_now(c->handle.loop);
  int rc = c->tls && !c->tls->plain
               ? ts_conn_tls_queue(c, w)
               : uv_write(&w->req, (uv_stream_t *)&c->handle, w->bufs, w->nbufs, on_write);
  if (rc < 0) return rc;
  /* Our allocation, and libuv's copy of a buffer list longer than the 4 a request holds. */
  w->mem = ts_alloc_cost(alloc_bytes);
  if (w->nbufs > 4) w->mem += ts_alloc_cost(w->nbufs * sizeof(uv_buf_t));
  ts_conn_charge(c, (int64_t)w->mem);
  return 0;
}

/* A write request for a frame's header and meta (of a frame whose payload is payload[0..n))
 * followed by its first `first` payload buffers; NULL when out of memory. */
static write_req_t *frame_req(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg,
                              const uv_buf_t *payload, unsigned n, unsigned first,
                              uint64_t *frame_bytes, size_t *alloc_bytes) {
  size_t frame = ts_msg_frame_size(msg);
  size_t head = sizeof(write_req_t) + (first + 1) * sizeof(uv_buf_t);
  /* Replies held back (cork) go first, in the same buffer. */
  size_t pre = c->cork_len;
  write_req_t *w = ts_malloc(head + pre + frame);
  if (!w) return NULL;
  *alloc_bytes = head + pre + frame;
  uint8_t *bytes = (uint8_t *)w + head;
  uint64_t data_len = 0;
  for (unsigned i = 0; i < n; i++) data_len += payload[i].len;
  if (pre) memcpy(bytes, c->cork, pre);
  size_t len = ts_msg_encode(type, msg, data_len, bytes + pre);
  memset(w, 0, sizeof *w);
  w->conn = c;
  w->count = first;
  w->last = first == n;
  w->corked = c->cork_frames;
  c->cork_len = 0;
  c->cork_frames = 0;
  w->nbufs = first + 1;
  w->bufs[0] = uv_buf_init((char *)bytes, (unsigned)(pre + len));
  for (unsigned i = 0; i < first; i++) w->bufs[i + 1] = payload[i];
  *frame_bytes = len + data_len;
  return w;
}

static int queue_frame(ts_conn_t *c, write_req_t *w, uint64_t frame_bytes, size_t alloc_bytes) {
  int rc = queue_write(c, w, alloc_bytes);
  if (rc < 0) {
    ts_free(w);
    return rc;
  }
  c->bytes_out += frame_bytes;
  return 0;
}

/* Hold a payload-less frame back while the read-ahead is handed on (ts_conn.h). Returns
 * true when it was (its bytes count as sent). */
static bool cork(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg) {
  if (!c->feeding || c->close_after_write) return false;
  size_t frame = ts_msg_frame_size(msg);
  if (c->cork_len + frame > CORK_MAX) return false; /* the cork goes out with this one */
  if (!c->cork) {
    c->cork = ts_malloc(CORK_MAX);
    if (!c->cork) return false;
    c->cork_cap = CORK_MAX;
  }
  size_t len = ts_msg_encode(type, msg, 0, c->cork + c->cork_len);
  c->cork_len += len;
  c->cork_frames++;
  c->bytes_out += len;
  return true;
}

/* Send what the cork holds, alone (nothing followed it while the read-ahead was handed on). */
static void flush_cork(ts_conn_t *c) {
  if (c->cork_len == 0) return;
  if (c->closing) {
    c->cork_len = 0;
    c->cork_frames = 0;
    return;
  }
  size_t alloc = sizeof(write_req_t) + sizeof(uv_buf_t) + c->cork_len;
  write_req_t *w = ts_malloc(alloc);
  if (!w) {
    ts_conn_close(c, TS_ENOMEM);
    return;
  }
  memset(w, 0, sizeof *w);
  uint8_t *bytes = (uint8_t *)w + sizeof(write_req_t) + sizeof(uv_buf_t);
  memcpy(bytes, c->cork, c->cork_len);
  w->conn = c;
  w->corked = c->cork_frames;
  w->nbufs = 1;
  w->bufs[0] = uv_buf_init((char *)bytes, (unsigned)c->cork_len);
  c->cork_len = 0;
  c->cork_frames = 0;
  int rc = queue_write(c, w, alloc);
  if (rc < 0) {
    ts_free(w);
    ts_log_err("%s: cannot queue a write: %s; closing", c->peer, ts_strerror(rc));
    ts_conn_close(c, rc);
  }
}

int ts_conn_send(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg, const uv_buf_t *payload,
                 unsigned n, ts_conn_write_cb cb, void *arg) {
  if (c->closing) return TS_ECLOSED;
  if (n == 0 && !cb && cork(c, type, msg)) return 0;
  uint64_t bytes;
  size_t alloc;
  write_req_t *w = frame_req(c, type, msg, payload, n, n, &bytes, &alloc);
  if (!w) return TS_ENOMEM;
  w->cb = cb;
  w->arg = arg;
  return queue_frame(c, w, bytes, alloc);
}

/* Payload buffers [first, end) making up the group that starts at first. */
static unsigned group_end(const uv_buf_t *payload, unsigned n, unsigned first) {
  size_t bytes = 0;
  unsigned end = first;
  while (end < n && (end == first || bytes + payload[end].len <= TS_CONN_WRITE_GROUP)) {
    bytes += payload[end].len;
    end++;
  }
  return end;
}

int ts_conn_send_parts(ts_conn_t *c, uint16_t type, const ProtobufCMessage *msg,
                       const uv_buf_t *payload, unsigned n, ts_conn_parts_cb cb, void *arg) {
  if (c->closing) return TS_ECLOSED;
  /* The first request carries the header and meta, and the first group of buffers. */
  unsigned end = n ? group_end(payload, n, 0) : 0;
  uint64_t bytes;
  size_t alloc;
  write_req_t *w = frame_req(c, type, msg, payload, n, end, &bytes, &alloc);
  if (!w) return TS_ENOMEM;
  w->pcb = cb;
  w->arg = arg;
  int rc = queue_frame(c, w, bytes, alloc);
  if (rc < 0) return rc;
  write_req_t *prev = w; /* the last request queued */
  for (unsigned first = end; first < n; first = end) {
    end = group_end(payload, n, first);
    alloc = sizeof(write_req_t) + (end - first) * sizeof(uv_buf_t);
    w = ts_malloc(alloc);
    rc = w ? 0 : TS_ENOMEM;
    if (w) {
      memset(w, 0, sizeof *w);
      w->conn = c;
      w->pcb = cb;
      w->arg = arg;
      w->first = first;
      w->count = end - first;
      w->last = end == n;
      w->nbufs = end - first;
      for (unsigned i = first; i < end; i++) w->bufs[i - first] = payload[i];
      rc = queue_write(c, w, alloc);
      if (rc < 0) ts_free(w);
    }
    if (rc < 0) {
      /* Part of the frame is queued, so the stream is broken: close (the queued requests
       * report UV_ECANCELED). The last one queued also reports the buffers that never got
       * a request, and is the frame's final call: the owner may free its state there, so
       * no call may follow it, and none may come from inside this function (libuv never
       * calls a write callback from uv_write, so prev has not completed yet). */
      ts_log_err("%s: cannot queue a write: %s; closing", c->peer, ts_strerror(rc));
      prev->count = n - prev->first;
      prev->last = true;
      ts_conn_close(c, rc);
      return 0;
    }
    prev = w;
  }
  return 0;
}

int ts_conn_send_error(ts_conn_t *c, uint64_t request_id, int code, const char *detail) {
  Tessera__Error e = TESSERA__ERROR__INIT;
  e.request_id = request_id;
  e.code = code;
  e.name = (char *)ts_err_name(code);
  e.detail = (char *)(detail ? detail : ts_strerror(code));
  return ts_conn_send(c, TS_MSG_ERROR, &e.base, NULL, 0, NULL, NULL);
}

void ts_conn_fail(ts_conn_t *c, uint64_t request_id, int code, const char *detail) {
  if (c->closing || c->close_after_write) return;
  char tls_why[256];
  if (c->tls && !c->tls->ready && !c->tls->plain) {
    if (c->tls->first_n > 0 || !ts_tls_server(c->tls->tls)) {
      /* In the middle of a TLS handshake: there is no channel to say it on. */
      snprintf(c->errmsg, sizeof c->errmsg, "%s", detail ? detail : ts_strerror(code));
      ts_conn_close(c, code);
      return;
    }
    /* A TLS client speaks first; one that sent nothing may be a plaintext client waiting
     * for our hello: it can read this in plaintext, as a refusal (EAUTH: it would not get
     * in by trying again). */
    code = TS_EAUTH;
    snprintf(tls_why, sizeof tls_why,
             "this shard requires TLS (auth.tls = true in its job file), and this client sent "
             "no TLS hello: %s",
             detail ? detail : ts_strerror(code));
    detail = tls_why;
    c->tls->plain = true;
  }
  c->close_after_write = true;
  update_reading(c);
  c->close_err = code;
  snprintf(c->errmsg, sizeof c->errmsg, "%s", detail ? detail : ts_strerror(code));
  /* libuv runs write callbacks from the loop, never from uv_write itself, so on_write
   * closes the connection once this error (and anything queued before it) is written. */
  if (ts_conn_send_error(c, request_id, code, detail) < 0) ts_conn_close(c, code);
}

void ts_conn_close_graceful(ts_conn_t *c, int err) {
  if (c->closing) return;
  flush_cork(c); /* what was held back goes before the close */
  if (c->closing) return;
  if (ts_conn_write_queue(c) == 0) {
    ts_conn_close(c, err);
    return;
  }
  c->close_after_write = true;
  update_reading(c);
  c->close_err = err;
}

/* --- for the TLS layer (ts_conn_int.h) ---------------------------------------------- */

void ts_conn_int_next_buf(ts_conn_t *c, uv_buf_t *buf) { next_buf(c, buf); }
void ts_conn_int_advance(ts_conn_t *c, size_t n) { advance(c, n); }
bool ts_conn_int_may_read(const ts_conn_t *c) { return may_read(c); }
void ts_conn_int_update_reading(ts_conn_t *c) { update_reading(c); }
void ts_conn_int_flush_cork(ts_conn_t *c) { flush_cork(c); }
