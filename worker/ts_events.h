/*
 * TensorBoard event files: the scalars a worker writes into train.logdir, and a reader that
 * checks them (for tests and tools).
 *
 * A file is a sequence of TFRecords: u64 length (little-endian), u32 masked CRC-32C of
 * those 8 bytes, the data, u32 masked CRC-32C of the data (ts_crc32c.h). The data is a
 * tensorboard.Event (proto/tensorboard.proto); the first one carries only wall_time and
 * file_version "brain.Event:2", the others a step and a summary of scalar values. Files are
 * named events.out.tfevents.<unix seconds>.<hostname>[.<pid>] as TensorFlow names them,
 * so `tensorboard --logdir` finds them.
 *
 * Every record is written with one write and flushed at once, so TensorBoard shows the
 * curves while training runs and a killed worker leaves at most a truncated last record
 * (which TensorBoard, and the reader below, stop at).
 */
#ifndef TS_EVENTS_H
#define TS_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ts_events ts_events_t;

/* Create dir (and its parents) when missing, open a new event file in it and write the
 * file_version record. Returns 0, or a negative errno with errmsg naming the path. */
int ts_events_open(ts_events_t **out, const char *dir, char *errmsg, size_t errlen);

/* Create dir (and its parents) when missing and check that files can be made in it, without
 * making any: a worker checks train.logdir at its start and opens its event files only once
 * it trains. Returns 0, or a negative errno with errmsg naming the path. */
int ts_events_check_dir(const char *dir, char *errmsg, size_t errlen);

/* Write one event at step with n scalar values (tags[i], values[i]) and the given wall
 * time (seconds since the epoch). Returns 0 or a negative errno. */
int ts_events_write_scalars(ts_events_t *e, int64_t step, double wall_time,
                            const char *const *tags, const float *values, size_t n);

/* The file's path (valid until ts_events_close). */
const char *ts_events_path(const ts_events_t *e);

/* Close the file and free. NULL is ignored. */
void ts_events_close(ts_events_t *e);

/* One scalar read back; the file_version record reads as tag "" with version set. */
typedef struct {
  double wall_time;
  int64_t step;
  char tag[128];
  float value;
  char version[32];  /* non-empty only for the file_version record */
} ts_events_record_t;

/* Read every record of an event file into *out (ts_malloc'd array of *n, caller frees with
 * ts_free), one entry per scalar value. Checks both CRCs of every record and that each
 * parses. Returns 0, or TS_EDATA (a bad CRC, a record that does not parse, a truncated
 * record) / negative errno with errmsg naming the record's offset. */
int ts_events_read(const char *path, ts_events_record_t **out, size_t *n, char *errmsg,
                   size_t errlen);

#endif
