/* proto/ts_status.c: a ShardStatus message as the client library's plain-C status, the one
 * conversion behind ts_client_status and a shard's /status page. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_status.h"

static void test_every_field(void **state) {
  (void)state;
  Tessera__WorkerStatus w0 = TESSERA__WORKER_STATUS__INIT, w1 = TESSERA__WORKER_STATUS__INIT;
  w0.task = 0;
  w0.step = 12;
  w0.loss = 0.5;
  w0.examples_per_sec = 1000.0;
  w0.last_seen_s = 0.25;
  w0.alive = true;
  w0.identity = "ps-worker task 0";
  w0.epoch_progress = 0.75;
  w0.clock = 13;
  w0.stale_dropped = 2;
  w1.task = 1;
  w1.done = true;
  w1.identity = NULL; /* protobuf-c leaves an absent string as the default "" or NULL */
  Tessera__WorkerStatus *ws[] = {&w0, &w1};
  int32_t waiting[] = {1, 3};
  Tessera__ShardStatus pb = TESSERA__SHARD_STATUS__INIT;
  pb.shard = 1;
  pb.num_shards = 2;
  pb.mode = TESSERA__MODE__MODE_SYNC;
  pb.step = 7;
  pb.partitions = 5;
  pb.bytes = 4096;
  pb.version = 6;
  pb.tensors = 3;
  pb.n_workers = 2;
  pb.workers = ws;
  pb.pushes = 100;
  pb.pulls = 101;
  pb.stale_dropped = 4;
  pb.rejected_frames = 5;
  pb.errors = 6;
  pb.uptime_s = 9.5;
  pb.num_workers = 4;
  pb.n_barrier_waiting_for = 2;
  pb.barrier_waiting_for = waiting;
  pb.connections = 8;
  pb.auth_failures = 9;
  pb.nonfinite_refused = 10;
  pb.incarnation = 11;
  pb.last_checkpoint = "/var/lib/tessera/ckpt-7";
  pb.last_checkpoint_age_s = 3.0;
  pb.checkpoints_written = 2;
  pb.restored_step = 5;
  pb.has_final_test_accuracy = true;
  pb.final_test_accuracy = 0.8625;
  pb.final_reporter = 1;
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_status_from_pb(&pb, &st), 0);
  assert_non_null(st);
  assert_int_equal(st->shard, 1);
  assert_int_equal(st->num_shards, 2);
  assert_int_equal(st->mode, TS_CLIENT_MODE_SYNC);
  assert_int_equal(st->step, 7);
  assert_int_equal(st->partitions, 5);
  assert_int_equal(st->bytes, 4096);
  assert_int_equal(st->version, 6);
  assert_int_equal(st->tensors, 3);
  assert_int_equal(st->pushes, 100);
  assert_int_equal(st->pulls, 101);
  assert_int_equal(st->stale_dropped, 4);
  assert_int_equal(st->rejected_frames, 5);
  assert_int_equal(st->errors, 6);
  assert_true(st->uptime_s == 9.5);
  assert_int_equal(st->num_workers, 4);
  assert_int_equal(st->num_barrier_waiting_for, 2);
  assert_int_equal(st->barrier_waiting_for[0], 1);
  assert_int_equal(st->barrier_waiting_for[1], 3);
  assert_int_equal(st->connections, 8);
  assert_int_equal(st->auth_failures, 9);
  assert_int_equal(st->nonfinite_refused, 10);
  assert_int_equal(st->incarnation, 11);
  assert_string_equal(st->last_checkpoint, "/var/lib/tessera/ckpt-7");
  assert_true(st->last_checkpoint_age_s == 3.0);
  assert_int_equal(st->checkpoints_written, 2);
  assert_int_equal(st->restored_step, 5);
  assert_true(st->has_final_test_accuracy && st->final_test_accuracy == 0.8625);
  assert_int_equal(st->final_reporter, 1);
  assert_int_equal(st->num_workers_seen, 2);
  const ts_client_worker_status_t *a = &st->workers[0], *b = &st->workers[1];
  assert_int_equal(a->task, 0);
  assert_int_equal(a->step, 12);
  assert_true(a->loss == 0.5 && a->examples_per_sec == 1000.0 && a->last_seen_s == 0.25);
  assert_true(a->alive && !a->done);
  assert_true(a->epoch_progress == 0.75);
  assert_string_equal(a->identity, "ps-worker task 0");
  assert_int_equal(a->clock, 13);
  assert_int_equal(a->stale_dropped, 2);
  assert_int_equal(b->task, 1);
  assert_true(b->done && !b->alive);
  assert_string_equal(b->identity, "");
  /* One block: the source may go away. */
  pb.last_checkpoint = "";
  w0.identity = "";
  assert_string_equal(st->workers[0].identity, "ps-worker task 0");
  ts_free(st);
}

static void test_empty_and_modes(void **state) {
  (void)state;
  Tessera__ShardStatus pb = TESSERA__SHARD_STATUS__INIT;
  pb.last_checkpoint = NULL;
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_status_from_pb(&pb, &st), 0);
  assert_int_equal(st->num_workers_seen, 0);
  assert_int_equal(st->num_barrier_waiting_for, 0);
  assert_string_equal(st->last_checkpoint, "");
  assert_int_equal(st->mode, TS_CLIENT_MODE_UNSPECIFIED);
  assert_false(st->has_final_test_accuracy); /* an older shard: no final accuracy */
  ts_free(st);
  assert_int_equal(ts_status_mode(TESSERA__MODE__MODE_ASYNC), TS_CLIENT_MODE_ASYNC);
  assert_int_equal(ts_status_mode(TESSERA__MODE__MODE_SSP), TS_CLIENT_MODE_SSP);
  assert_int_equal(ts_status_mode((Tessera__Mode)42), TS_CLIENT_MODE_UNSPECIFIED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_field),
      cmocka_unit_test(test_empty_and_modes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
