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

/* Read a token file: its content without trailing whitespace, at least TS_AUTH_MIN_TOKEN
 * bytes. Returns a string to free with ts_auth_free_token, or NULL with errmsg set. */
char *ts_auth_read_token(const char *path, char *errmsg, size_t errlen);

/* Wipe and free a token (NULL is fine). */
void ts_auth_free_token(char *token);

/* out = HMAC-SHA256(token, nonce[0..len)). */
void ts_auth_mac(const char *token, const uint8_t *nonce, size_t len, uint8_t out[TS_AUTH_MAC_LEN]);

/* 0 when mac is HMAC-SHA256(token, nonce), compared in constant time; TS_EAUTH otherwise. */
int ts_auth_verify(const char *token, const uint8_t *nonce, size_t len, const uint8_t *mac,
                   size_t mac_len);

#endif
