/*
 * A raw TCP client for tests that speak the wire protocol by hand (hostile or misbehaving
 * peers): connect, send frames, read frames, watch for the close. Every call returns -1 or
 * false on failure rather than asserting, so tests decide what a failure means.
 */
#ifndef TS_RAWCONN_H
#define TS_RAWCONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_msg.h"

/* A blocking socket connected to 127.0.0.1:port, or -1. */
int ts_raw_connect(int port);

/* Read exactly n bytes, waiting at most timeout_ms for each chunk. 0 or -1. */
int ts_raw_read_full(int fd, void *buf, size_t n, int timeout_ms);

/* Read one frame; returns its type, or -1 when the connection closed or timed out (5 s).
 * The meta goes to meta (up to 4096 bytes), the payload is skipped. */
int ts_raw_read_frame(int fd, uint8_t *meta, uint32_t *meta_len);

/* Send all of buf; stops quietly when the server closes first (an accepted answer). */
void ts_raw_send_all(int fd, const void *buf, size_t n);

/* Send a frame's header and meta announcing data_len payload bytes (sent separately). */
void ts_raw_send_msg(int fd, uint16_t type, const ProtobufCMessage *m, uint64_t data_len);

/* Set s[i] to partition parts[i] (i when parts is NULL) of tensor 0, part_floats values, and
 * point sp[i] at it, for i in [0, n). */
void ts_raw_slices(Tessera__PartSlice *s, Tessera__PartSlice **sp, const uint32_t *parts,
                   size_t n, uint64_t part_floats);

/* Send the meta of a request of `type` (TS_MSG_PUSH or TS_MSG_PULL) with id request_id for
 * partitions [0, n) of tensor 0, part_floats each. A push announces their n * part_floats
 * floats of payload, which the caller sends; a pull announces none. */
void ts_raw_send_parts(int fd, uint16_t type, uint64_t request_id, size_t n, size_t part_floats);

/* Connect and handshake as worker `task` (no token); the socket, or -1. */
int ts_raw_worker(int port, int task, const char *identity);

/* Connect and handshake as worker `task` with the MAC of key (NULL: none). The socket once
 * the shard answered with a HandshakeReply; -1 when it did not, with the code and detail of
 * its Error (0 and "" when it sent none) in *code and detail[0..n). */
int ts_raw_worker_key(int port, int task, const char *key, const char *identity, int *code,
                      char *detail, size_t n);

/* The same with the socket's receive buffer set to rcvbuf bytes before it connects (the
 * kernel doubles it), so the shard's replies to a peer that reads slowly wait in the
 * shard's own queue instead of megabytes of socket buffers. */
int ts_raw_worker_rcvbuf(int port, int task, const char *identity, int rcvbuf);

/* The code of the next frame when it is an Error (its detail into detail), else 0. */
int ts_raw_expect_error(int fd, char *detail, size_t n);

/* Wait until the peer closes, reading and dropping what arrives meanwhile; true when it did
 * within timeout_ms (of the clock, however much arrives). */
bool ts_raw_closed_by_peer(int fd, int timeout_ms);

#endif
