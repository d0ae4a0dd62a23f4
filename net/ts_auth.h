/*
 * Shared-secret authentication of the handshake (docs/architecture.md), with libsodium.
 *
 * The server sends a random nonce in Hello; the client answers with
 * HMAC-SHA256(token, nonce); the server recomputes it and compares in constant time. The
 * token never travels. Tokens live in files (auth.token_file, auth.admin_token_file).
 */
#ifndef TS_AUTH_H
#define TS_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define TS_AUTH_NONCE_LEN 32
#define TS_AUTH_MAC_LEN 32
#define TS_AUTH_MIN_TOKEN 16

/* The value deploy/k8s/configmap.yaml's Secret ships with, to be replaced before use: a
 * token file that holds it is refused, so that a cluster never runs on a secret printed
 * in the repository (tests/deploy/check_k8s.py checks that the two agree). */
#define TS_AUTH_PLACEHOLDER_TOKEN "replace-me-with-openssl-rand-hex-32-output"

/* Read a token file: its content without trailing whitespace, at least TS_AUTH_MIN_TOKEN
 * bytes and not TS_AUTH_PLACEHOLDER_TOKEN. Returns a string to free with
 * ts_auth_free_token, or NULL with errmsg set. */
char *ts_auth_read_token(const char *path, char *errmsg, size_t errlen);

/* Wipe and free a token (NULL is fine). */
void ts_auth_free_token(char *token);

/* out = HMAC-SHA256(token, nonce[0..len)). */
void ts_auth_mac(const char *token, const uint8_t *nonce, size_t len, uint8_t out[TS_AUTH_MAC_LEN]);

/* 0 when mac is HMAC-SHA256(token, nonce), compared in constant time; TS_EAUTH otherwise. */
int ts_auth_verify(const char *token, const uint8_t *nonce, size_t len, const uint8_t *mac,
                   size_t mac_len);

#endif
