#include "rawconn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ts_auth.h"
#include "ts_frame.h"

/* rcvbuf > 0: set before connect, so the window the peer sees is small from the start. */
static int connect_rcvbuf(int port, int rcvbuf) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ts_raw_connect(int port) { return connect_rcvbuf(port, 0); }

int ts_raw_read_full(int fd, void *buf, size_t n, int timeout_ms) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int ts_raw_read_frame(int fd, uint8_t *meta, uint32_t *meta_len) {
  uint8_t h[TS_FRAME_HEADER_SIZE];
  if (ts_raw_read_full(fd, h, sizeof h, 5000) < 0) return -1;
  ts_frame_header_t hdr;
  if (ts_frame_decode_header(h, sizeof h, UINT64_MAX, &hdr, NULL) < 0) return -1;
  if (hdr.meta_len > 4096 || ts_raw_read_full(fd, meta, hdr.meta_len, 5000) < 0) return -1;
  *meta_len = hdr.meta_len;
  char junk[4096];
  for (uint64_t left = hdr.data_len; left > 0;) {
    size_t n = left < sizeof junk ? (size_t)left : sizeof junk;
    if (ts_raw_read_full(fd, junk, n, 5000) < 0) return -1;
    left -= n;
  }
  return hdr.type;
}

void ts_raw_send_all(int fd, const void *buf, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t w = send(fd, (const char *)buf + sent, n - sent, MSG_NOSIGNAL);
    if (w <= 0) return;
    sent += (size_t)w;
  }
}

void ts_raw_send_msg(int fd, uint16_t type, const ProtobufCMessage *m, uint64_t data_len) {
  uint8_t buf[8192];
  size_t n = ts_msg_encode(type, m, data_len, buf);
  ts_raw_send_all(fd, buf, n);
}

void ts_raw_slices(Tessera__PartSlice *s, Tessera__PartSlice **sp, const uint32_t *parts,
                   size_t n, uint64_t part_floats) {
  for (size_t i = 0; i < n; i++) {
    tessera__part_slice__init(&s[i]);
    s[i].tensor = 0;
    s[i].part = parts ? parts[i] : (uint32_t)i;
    s[i].count = part_floats;
    sp[i] = &s[i];
  }
}

void ts_raw_send_parts(int fd, uint16_t type, uint64_t request_id, size_t n, size_t part_floats) {
  Tessera__PartSlice *s = calloc(n, sizeof *s), **sp = calloc(n, sizeof *sp);
  ts_raw_slices(s, sp, NULL, n, part_floats);
  if (type == TS_MSG_PUSH) {
    Tessera__Push p = TESSERA__PUSH__INIT;
    p.request_id = request_id;
    p.parts = sp;
    p.n_parts = n;
    ts_raw_send_msg(fd, type, &p.base, n * part_floats * sizeof(float));
  } else {
    Tessera__Pull p = TESSERA__PULL__INIT;
    p.request_id = request_id;
    p.parts = sp;
    p.n_parts = n;
    ts_raw_send_msg(fd, type, &p.base, 0);
  }
  free(s);
  free(sp);
}

int ts_raw_worker(int port, int task, const char *identity) {
  return ts_raw_worker_rcvbuf(port, task, identity, 0);
}

/* The handshake on a connected fd, with the MAC of key (NULL: none): fd once the shard
 * answered with a HandshakeReply; else -1 (fd closed) with its Error's code and detail. */
static int handshake(int fd, int task, const char *key, const char *identity, int *code,
                     char *detail, size_t n) {
  *code = 0;
  if (n) detail[0] = 0;
  if (fd < 0) return -1;
  uint8_t meta[4096], mac[TS_AUTH_MAC_LEN];
  uint32_t len;
  if (ts_raw_read_frame(fd, meta, &len) != TS_MSG_HELLO) goto fail;
  Tessera__Hello *h = tessera__hello__unpack(NULL, len, meta);
  if (!h) goto fail;
  if (key) ts_auth_mac(key, h->nonce.data, h->nonce.len, mac);
  tessera__hello__free_unpacked(h, NULL);
  Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
  hs.request_id = 1;
  hs.protocol = TS_PROTOCOL_VERSION;
  hs.role = TESSERA__ROLE__ROLE_WORKER;
  hs.task = task;
  hs.identity = (char *)identity;
  if (key) {
    hs.mac.data = mac;
    hs.mac.len = sizeof mac;
  }
  ts_raw_send_msg(fd, TS_MSG_HANDSHAKE, &hs.base, 0);
  int type = ts_raw_read_frame(fd, meta, &len);
  if (type == TS_MSG_HANDSHAKE_REPLY) return fd;
  if (type == TS_MSG_ERROR) {
    Tessera__Error *e = tessera__error__unpack(NULL, len, meta);
    if (e) {
      *code = e->code;
      if (n) snprintf(detail, n, "%s", e->detail ? e->detail : "");
      tessera__error__free_unpacked(e, NULL);
    }
  }
fail:
  close(fd);
  return -1;
}

int ts_raw_worker_rcvbuf(int port, int task, const char *identity, int rcvbuf) {
  int code;
  return handshake(connect_rcvbuf(port, rcvbuf), task, NULL, identity, &code, NULL, 0);
}

int ts_raw_worker_key(int port, int task, const char *key, const char *identity, int *code,
                      char *detail, size_t n) {
  return handshake(ts_raw_connect(port), task, key, identity, code, detail, n);
}

int ts_raw_expect_error(int fd, char *detail, size_t n) {
  uint8_t meta[4096];
  uint32_t len = 0;
  int type = ts_raw_read_frame(fd, meta, &len);
  if (type != TS_MSG_ERROR) return 0;
  Tessera__Error *e = tessera__error__unpack(NULL, len, meta);
  if (!e) return 0;
  int code = e->code;
  snprintf(detail, n, "%s", e->detail);
  tessera__error__free_unpacked(e, NULL);
  return code;
}

bool ts_raw_closed_by_peer(int fd, int timeout_ms) {
  /* A deadline on the clock, not a count of polls: while replies keep arriving every poll
   * returns at once, and a count of 100 polls ran out in a few milliseconds, before a
   * loaded shard had closed the connection. What arrives meanwhile is read and dropped. */
  char buf[1 << 14];
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  double end = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 + timeout_ms / 1000.0;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) > 0 && read(fd, buf, sizeof buf) <= 0) return true;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)now.tv_sec + (double)now.tv_nsec * 1e-9 >= end) return false;
  }
}
