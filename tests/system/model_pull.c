#include "model_pull.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "calls.h"

float *ts_pull_model_params(ts_cluster_t *c, const ts_model_t *m, uint64_t seed,
                            const char *identity) {
  char err[512] = "";
  ts_client_tensor_t *decl = calloc(m->num_tensors, sizeof *decl);
  float **dst = calloc(m->num_tensors, sizeof *dst);
  float *p = calloc(m->param_count, sizeof *p);
  assert_non_null(decl);
  assert_non_null(dst);
  assert_non_null(p);
  for (size_t i = 0; i < m->num_tensors; i++) {
    decl[i] = (ts_client_tensor_t){m->tensors[i].name, m->tensors[i].shape, m->tensors[i].rank,
                                   (ts_client_init_t)m->tensors[i].init};
    dst[i] = p + m->tensors[i].offset;
  }
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t),
                        .addrs = c->addrs,
                        .num_shards = (size_t)c->num_shards,
                        .task = 0,
                        .identity = identity,
                        .connect_timeout_s = 5,
                        .request_timeout_s = 10,
                        .require_all = true};
  char ca[300], cert[300], key[300];
  if (c->tls_dir[0]) {
    snprintf(ca, sizeof ca, "%s/ca.pem", c->tls_dir);
    snprintf(cert, sizeof cert, "%s/shard.pem", c->tls_dir);
    snprintf(key, sizeof key, "%s/shard.key", c->tls_dir);
    o.tls_ca_file = ca;
    o.tls_cert_file = cert;
    o.tls_key_file = key;
  }
  ts_client_t *cl = NULL;
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), 0);
  assert_int_equal(ts_client_declare(cl, decl, m->num_tensors, seed, err, sizeof err), 0);
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  ts_client_close(cl);
  free(dst);
  free(decl);
  return p;
}
