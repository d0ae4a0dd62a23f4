/*
 * net/ts_auth.h: the task key and the shard's proof against values computed independently
 * (Python's hmac module), so that another implementation can derive the same keys; and
 * every verification refusing a wrong key, a wrong nonce and a wrong length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "ts_auth.h"
#include "ts_err.h"

#define TOKEN "correct horse battery staple"

/* hmac.new(TOKEN, b"worker/1", hashlib.sha256).hexdigest() */
static const char key1[] = "c639021713204c38ac47ada4aa5a7ac58b2a9efd36ed968ea3d34da355d049b4";

static void nonces(uint8_t server[TS_AUTH_NONCE_LEN], uint8_t client[TS_AUTH_NONCE_LEN]) {
  for (int i = 0; i < TS_AUTH_NONCE_LEN; i++) {
    server[i] = (uint8_t)i;
    client[i] = (uint8_t)(32 + i);
  }
}

static void test_task_key_known_answer(void **state) {
  (void)state;
  char key[TS_AUTH_TASK_KEY_LEN + 1];
  ts_auth_task_key(TOKEN, 1, key);
  assert_string_equal(key, key1);
  ts_auth_task_key(TOKEN, 0, key);
  assert_string_not_equal(key, key1);
}

/* hmac.new(KEY, b"tessera shard proof" + bytes(range(32)) + bytes(range(32, 64)), sha256) */
static void test_proof_known_answer(void **state) {
  (void)state;
  uint8_t sn[TS_AUTH_NONCE_LEN], cn[TS_AUTH_NONCE_LEN], proof[TS_AUTH_MAC_LEN];
  char hex[2 * TS_AUTH_MAC_LEN + 1];
  nonces(sn, cn);
  ts_auth_proof(TOKEN, sn, cn, proof);
  sodium_bin2hex(hex, sizeof hex, proof, sizeof proof);
  assert_string_equal(hex, "04c5a329cfac0c79ec8e63e85aa54d24d50246f959a15eb5d1eaa2e8d8083577");
  ts_auth_proof(key1, sn, cn, proof);
  sodium_bin2hex(hex, sizeof hex, proof, sizeof proof);
  assert_string_equal(hex, "600869841e7d83dd9bc924908f46adbae975483c5c72a9b219872410e9a31f2a");
}

static void test_verify_refuses(void **state) {
  (void)state;
  uint8_t sn[TS_AUTH_NONCE_LEN], cn[TS_AUTH_NONCE_LEN], mac[TS_AUTH_MAC_LEN];
  nonces(sn, cn);
  /* A worker's MAC with task 1's key proves task 1, not task 0, and is not the token's. */
  ts_auth_mac(key1, sn, sizeof sn, mac);
  assert_int_equal(ts_auth_verify_task(TOKEN, 1, sn, sizeof sn, mac, sizeof mac), 0);
  assert_int_equal(ts_auth_verify_task(TOKEN, 0, sn, sizeof sn, mac, sizeof mac), TS_EAUTH);
  assert_int_equal(ts_auth_verify(TOKEN, sn, sizeof sn, mac, sizeof mac), TS_EAUTH);
  assert_int_equal(ts_auth_verify_task(TOKEN, 1, cn, sizeof cn, mac, sizeof mac), TS_EAUTH);
  assert_int_equal(ts_auth_verify_task(TOKEN, 1, sn, sizeof sn, mac, sizeof mac - 1), TS_EAUTH);
  /* The proof: the right key and nonces only, its full length only. */
  uint8_t proof[TS_AUTH_MAC_LEN];
  ts_auth_proof(TOKEN, sn, cn, proof);
  assert_int_equal(ts_auth_verify_proof(TOKEN, sn, cn, proof, sizeof proof), 0);
  assert_int_equal(ts_auth_verify_proof(key1, sn, cn, proof, sizeof proof), TS_EAUTH);
  assert_int_equal(ts_auth_verify_proof(TOKEN, cn, sn, proof, sizeof proof), TS_EAUTH);
  assert_int_equal(ts_auth_verify_proof(TOKEN, sn, cn, proof, 0), TS_EAUTH);
  assert_int_equal(ts_auth_verify_proof(TOKEN, sn, cn, NULL, 0), TS_EAUTH);
  /* A client MAC is never a proof: the label keeps them apart. */
  ts_auth_mac(TOKEN, sn, sizeof sn, mac);
  assert_int_equal(ts_auth_verify_proof(TOKEN, sn, cn, mac, sizeof mac), TS_EAUTH);
}

int main(void) {
  if (sodium_init() < 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_task_key_known_answer),
      cmocka_unit_test(test_proof_known_answer),
      cmocka_unit_test(test_verify_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
