/* auth.tls: TLS 1.3 between clients and shards, through the real binaries. Exact values
 * through a TLS shard (a frame larger than the encryption window too), psctl over TLS, and
 * every refusal with its reason: a client that does not trust the shard's CA, a client
 * certificate from another CA, an expired shard certificate, one naming another host, a
 * plaintext client on a TLS port and a TLS client on a plaintext one. The shard lives
 * through all of it and keeps serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_err.h"

static char certs[256];
static char auth_cfg[1200];

static int setup(void **state) {
  (void)state;
  return ts_tls_certs(certs, sizeof certs, auth_cfg, sizeof auth_cfg);
}

static int teardown(void **state) {
  (void)state;
  ts_tls_certs_rm(certs);
  return 0;
}

/* A client of c with the given CA, certificate and key names in the certificate directory
 * (NULL ca: plaintext); its open's code, errmsg in err. */
static int open_tls(ts_cluster_t *c, const char *ca, const char *cert, ts_client_t **out,
                    char *err, size_t n) {
  char ca_p[400], cert_p[400], key_p[400];
  snprintf(ca_p, sizeof ca_p, "%s/%s.pem", certs, ca ? ca : "");
  snprintf(cert_p, sizeof cert_p, "%s/%s.pem", certs, cert ? cert : "");
  snprintf(key_p, sizeof key_p, "%s/%s.key", certs, cert ? cert : "");
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.connect_timeout_s = 3;
  o.request_timeout_s = 10;
  o.require_all = true;
  if (ca) {
    o.tls_ca_file = ca_p;
    o.tls_cert_file = cert_p;
    o.tls_key_file = key_p;
  }
  ts_client_t *cl = NULL;
  int rc = ts_client_open(&cl, &o, err, n);
  if (rc < 0) fprintf(stderr, "open (ca %s, cert %s): %s\n", ca, cert, err);
  if (out) *out = cl;
  else ts_client_close(cl);
  return rc;
}

/* Worker 0 declares a tensor of n floats, pushes ones twice and pulls: every value is
 * exactly -2 * learning rate (sgd, 0.5) from 0. */
static void exact_round_trip(ts_cluster_t *c, uint64_t n) {
  char err[512];
  ts_client_t *cl = NULL;
  assert_int_equal(open_tls(c, "ca", "client", &cl, err, sizeof err), 0);
  uint64_t shape[1] = {n};
  ts_client_tensor_t t = {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS};
  assert_int_equal(ts_client_declare(cl, &t, 1, 1, err, sizeof err), 0);
  assert_int_equal(tc_push_filled(cl, 1.0f, n, 2), 0);
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  float *dst[1] = {p};
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != -1.0f) fail_msg("value %llu is %g, not -1", (unsigned long long)i, (double)p[i]);
  free(p);
  ts_client_close(cl);
}

/* GET https://127.0.0.1:port/path, verifying the endpoint's certificate against ca_file:
 * the HTTP status, -1 when TLS or the connection fails. */
static int https_get(int port, const char *ca_file, const char *path) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  assert_non_null(ctx);
  assert_int_equal(SSL_CTX_load_verify_locations(ctx, ca_file, NULL), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  BIO *b = BIO_new_ssl_connect(ctx);
  char hostport[64], reply[4096] = "";
  snprintf(hostport, sizeof hostport, "127.0.0.1:%d", port);
  BIO_set_conn_hostname(b, hostport);
  SSL *ssl = NULL;
  BIO_get_ssl(b, &ssl);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), "127.0.0.1");
  int status = -1;
  if (BIO_do_connect(b) > 0) {
    BIO_printf(b, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    int got = 0, r;
    while (got < (int)sizeof reply - 1 && (r = BIO_read(b, reply + got, (int)sizeof reply - 1 - got)) > 0)
      got += r;
    reply[got] = 0;
    if (strncmp(reply, "HTTP/1.", 7) == 0) status = atoi(reply + 9);
  } else {
    ERR_print_errors_fp(stderr);
  }
  BIO_free_all(b);
  SSL_CTX_free(ctx);
  return status;
}

static void start_tls_cluster(ts_cluster_t *c, const char *shard_cert) {
  char cfg[2000];
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"async\"; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "server = { max_message_bytes = 268435456; handshake_timeout_s = 1.0; };\n"
           "auth = { tls = true; tls_ca_file = \"%s/ca.pem\"; tls_cert_file = \"%s/%s.pem\"; "
           "tls_key_file = \"%s/%s.key\"; };\n",
           certs, certs, shard_cert, certs, shard_cert);
  assert_int_equal(ts_cluster_start(c, 2, 1, cfg), 0);
}

static void test_exact_values_over_tls(void **state) {
  (void)state;
  ts_cluster_t c;
  start_tls_cluster(&c, "shard");
  /* 48 MiB: partitions of 4 MiB, frames over the 4 MiB window in flight, in 1 MiB blocks. */
  exact_round_trip(&c, 12u << 20);
  /* The admin endpoint speaks HTTPS with the shard's certificate, and nothing else. */
  char ca[400], body[256];
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  assert_int_equal(https_get(c.http_port[0], ca, "/livez"), 200);
  assert_int_not_equal(ts_http_get(c.http_port[0], "/livez", body, sizeof body, NULL, 0), 200);
  assert_int_equal(https_get(c.http_port[1], ca, "/livez"), 200);
  /* psctl reads the same job file: its status over TLS. */
  char out[16384], err[4096];
  const char *args[] = {"-c", c.config, "status", "-o", "json", NULL};
  int rc = ts_run_psctl(args, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "psctl: %s\n", err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\"shards\""));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_refusals(void **state) {
  (void)state;
  ts_cluster_t c;
  start_tls_cluster(&c, "shard");
  char err[1024];
  /* A client that trusts another CA refuses the shard. */
  assert_true(open_tls(&c, "other-ca", "client", NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "(no CA of auth.tls_ca_file signed it)"));
  /* A client whose certificate another CA signed: the shard refuses it, and says so. */
  assert_true(open_tls(&c, "ca", "other-client", NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "the peer refused this side: "));
  assert_non_null(strstr(err, "alert unknown ca"));
  /* (The client gives up at the first refusal: one shard or both said so.) */
  assert_true(ts_cluster_log_has(&c, 0, "(no CA of auth.tls_ca_file signed it)") ||
              ts_cluster_log_has(&c, 1, "(no CA of auth.tls_ca_file signed it)"));
  /* A plaintext client on a TLS port: the shard's Error frame, readable, says why. */
  assert_true(open_tls(&c, NULL, NULL, NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "this shard requires TLS"));
  /* The shard that said so logged it first; the client gave up then, and may have closed
   * the other's connection before its timeout (seen in the sanitizer build). */
  assert_true(ts_cluster_log_has(&c, 0, "no handshake within 1.00 s") ||
              ts_cluster_log_has(&c, 1, "no handshake within 1.00 s"));
  /* The shard is fine: a good client still gets exact values. */
  exact_round_trip(&c, 1000);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* A TLS client on a plaintext shard. */
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  assert_true(open_tls(&c, "ca", "client", NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "does not use TLS"));
  assert_true(ts_cluster_log_has(&c, 0, "a TLS handshake on a plaintext connection"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_bad_shard_certificates(void **state) {
  (void)state;
  char err[1024];
  ts_cluster_t c;
  /* Expired: the shard starts (and warns), every client refuses it. */
  start_tls_cluster(&c, "expired");
  assert_true(ts_cluster_log_has(&c, 0, "expired on"));
  assert_true(open_tls(&c, "ca", "client", NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "certificate has expired"));
  assert_int_equal(ts_cluster_stop(&c), 0);
  /* Signed by the CA, but for another host than the address dialled. */
  start_tls_cluster(&c, "elsewhere");
  assert_true(open_tls(&c, "ca", "client", NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "IP address mismatch"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* An attack on the handshake: 300 sockets each send the start of a TLS record announcing
 * 16 KiB and stall, beside a good TLS client. They take only the pre-authentication quota
 * (128) and its deadline; the good client gets in and is served exact values, each round
 * trip under 2 s; the shard's RSS grows by less than 64 MiB. */
#define FLOOD 300
static void test_handshake_flood(void **state) {
  (void)state;
  ts_cluster_t c;
  start_tls_cluster(&c, "shard");
  long before = ts_proc_rss_kib(c.pid[0]);
  static int fds[FLOOD];
  static const unsigned char partial[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc};
  for (int i = 0; i < FLOOD; i++) {
    fds[i] = ts_raw_connect(c.port[0]);
    assert_true(fds[i] >= 0);
    ts_raw_send_all(fds[i], partial, sizeof partial);
  }
  double t0 = ts_now_s();
  exact_round_trip(&c, 1000);
  double took = ts_now_s() - t0;
  if (took > 2.0) fail_msg("the good client took %.2f s beside the flood", took);
  long after = ts_proc_rss_kib(c.pid[0]);
  fprintf(stderr, "handshake flood: shard RSS %ld -> %ld KiB\n", before, after);
  assert_true(after - before < 64 * 1024);
  for (int i = 0; i < FLOOD; i++) close(fds[i]);
  assert_true(ts_cluster_log_has(&c, 0, "(server.max_preauth_connections); the oldest is closed"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_missing_files_refused_at_start(void **state) {
  (void)state;
  /* A key that is not there stops the start, naming the file. */
  char cfg[1200];
  snprintf(cfg, sizeof cfg,
           "auth = { tls = true; tls_ca_file = \"%s/ca.pem\"; tls_cert_file = \"%s/shard.pem\"; "
           "tls_key_file = \"%s/nope.key\"; };\n",
           certs, certs, certs);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, cfg), -1);
  /* A client's likewise: ts_client_open fails at once with the file's name. */
  assert_int_equal(ts_cluster_start(&c, 1, 1, auth_cfg), 0);
  ts_client_opts_t o;
  tc_opts(&o, c.addrs, 1);
  char ca[400], nope[400], err[1024];
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  snprintf(nope, sizeof nope, "%s/nope.pem", certs);
  o.tls_ca_file = ca;
  o.tls_cert_file = nope;
  o.tls_key_file = nope;
  ts_client_t *cl = NULL;
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "nope.pem"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_values_over_tls),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_bad_shard_certificates),
      cmocka_unit_test(test_handshake_flood),
      cmocka_unit_test(test_missing_files_refused_at_start),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
