#include "ts_events.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tensorboard.pb-c.h"
#include "ts_alloc.h"
#include "ts_crc32c.h"
#include "ts_err.h"

struct ts_events {
  FILE *f;
  char path[4200];
};

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint32_t get_le32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* mkdir -p: create each missing component of dir. */
static int make_dirs(const char *dir) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return -ENAMETOOLONG;
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) < 0 && errno != EEXIST) return -errno;
    *s = '/';
  }
  if (mkdir(p, 0755) < 0 && errno != EEXIST) return -errno;
  return 0;
}

static int write_event(ts_events_t *e, const Tensorboard__Event *ev) {
  size_t len = protobuf_c_message_get_packed_size(&ev->base);
  uint8_t *rec = ts_malloc(len + 16);
  if (!rec) return -ENOMEM;
  put_le64(rec, len);
  put_le32(rec + 8, ts_crc32c_mask(ts_crc32c(0, rec, 8)));
  protobuf_c_message_pack(&ev->base, rec + 12);
  put_le32(rec + 12 + len, ts_crc32c_mask(ts_crc32c(0, rec + 12, len)));
  int rc = 0;
  if (fwrite(rec, 1, len + 16, e->f) != len + 16 || fflush(e->f) != 0) rc = -(errno ? errno : EIO);
  ts_free(rec);
  return rc;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ts_events_check_dir(const char *dir, char *errmsg, size_t errlen) {
  int rc = make_dirs(dir);
  if (rc == 0 && access(dir, W_OK | X_OK) < 0) rc = -errno;
  if (rc < 0)
    snprintf(errmsg, errlen, "cannot use the event directory %s: %s", dir, strerror(-rc));
  return rc;
}

int ts_events_open(ts_events_t **out, const char *dir, char *errmsg, size_t errlen) {
  *out = NULL;
  int rc = make_dirs(dir);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot create the event directory %s: %s", dir, strerror(-rc));
    return rc;
  }
  ts_events_t *e = ts_calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  char host[256] = "localhost";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = 0;
  double now = wall_now();
  /* The pid keeps two workers started in the same second on one host apart. */
  snprintf(e->path, sizeof e->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)now, host,
           (int)getpid());
  e->f = fopen(e->path, "wbx");
  if (!e->f) {
    rc = -errno;
    snprintf(errmsg, errlen, "cannot create the event file %s: %s", e->path, strerror(errno));
    ts_free(e);
    return rc;
  }
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = now;
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = (char *)"brain.Event:2";
  rc = write_event(e, &ev);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot write the event file %s: %s", e->path, strerror(-rc));
    ts_events_close(e);
    return rc;
  }
  *out = e;
  return 0;
}

int ts_events_write_scalars(ts_events_t *e, int64_t step, double wall_time,
                            const char *const *tags, const float *values, size_t n) {
  Tensorboard__SummaryValue *v = ts_calloc(n ? n : 1, sizeof *v);
  Tensorboard__SummaryValue **vp = ts_calloc(n ? n : 1, sizeof *vp);
  if (!v || !vp) {
    ts_free(v);
    ts_free(vp);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    tensorboard__summary_value__init(&v[i]);
    v[i].tag = (char *)tags[i];
    v[i].value_case = TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
    v[i].simple_value = values[i];
    vp[i] = &v[i];
  }
  Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
  sum.n_value = n;
  sum.value = vp;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall_time;
  ev.step = step;
  ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  int rc = write_event(e, &ev);
  ts_free(v);
  ts_free(vp);
  return rc;
}

const char *ts_events_path(const ts_events_t *e) { return e->path; }

void ts_events_close(ts_events_t *e) {
  if (!e) return;
  if (e->f) fclose(e->f);
  ts_free(e);
}

/* --- reader --------------------------------------------------------------------------- */

static int push_record(ts_events_record_t **out, size_t *n, size_t *cap,
                       const ts_events_record_t *r) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 64;
    ts_events_record_t *p = ts_realloc(*out, nc * sizeof *p);
    if (!p) return TS_ENOMEM;
    *out = p;
    *cap = nc;
  }
  (*out)[(*n)++] = *r;
  return 0;
}

int ts_events_read(const char *path, ts_events_record_t **out, size_t *n, char *errmsg,
                   size_t errlen) {
  *out = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(errmsg, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  size_t cap = 0;
  long off = 0;
  int rc = 0;
  uint8_t *data = NULL;
  for (;;) {
    uint8_t hdr[12], tail[4];
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got == 0) break;
    rc = TS_EDATA;
    if (got != sizeof hdr) {
      snprintf(errmsg, errlen, "%s: truncated record header at offset %ld", path, off);
      goto out;
    }
    uint64_t len = get_le64(hdr);
    if (get_le32(hdr + 8) != ts_crc32c_mask(ts_crc32c(0, hdr, 8))) {
      snprintf(errmsg, errlen, "%s: bad length CRC at offset %ld", path, off);
      goto out;
    }
    if (len > (64u << 20)) {
      snprintf(errmsg, errlen, "%s: record of %llu bytes at offset %ld", path,
               (unsigned long long)len, off);
      goto out;
    }
    ts_free(data);
    data = ts_malloc(len ? len : 1);
    if (!data) {
      rc = TS_ENOMEM;
      goto out;
    }
    if (fread(data, 1, len, f) != len || fread(tail, 1, 4, f) != 4) {
      snprintf(errmsg, errlen, "%s: truncated record at offset %ld", path, off);
      goto out;
    }
    if (get_le32(tail) != ts_crc32c_mask(ts_crc32c(0, data, len))) {
      snprintf(errmsg, errlen, "%s: bad data CRC at offset %ld", path, off);
      goto out;
    }
    Tensorboard__Event *ev = tensorboard__event__unpack(&ts_protobuf_allocator, len, data);
    if (!ev) {
      snprintf(errmsg, errlen, "%s: record at offset %ld is not an Event", path, off);
      goto out;
    }
    rc = 0;
    ts_events_record_t r;
    memset(&r, 0, sizeof r);
    r.wall_time = ev->wall_time;
    r.step = ev->step;
    if (ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION) {
      snprintf(r.version, sizeof r.version, "%s", ev->file_version);
      rc = push_record(out, n, &cap, &r);
    } else if (ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY) {
      for (size_t i = 0; i < ev->summary->n_value && rc == 0; i++) {
        const Tensorboard__SummaryValue *v = ev->summary->value[i];
        snprintf(r.tag, sizeof r.tag, "%s", v->tag);
        r.value = v->value_case == TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE ? v->simple_value
                                                                                 : 0.0f;
        rc = push_record(out, n, &cap, &r);
      }
    }
    tensorboard__event__free_unpacked(ev, &ts_protobuf_allocator);
    if (rc < 0) goto out;
    off += (long)(len + 16);
  }
out:
  ts_free(data);
  fclose(f);
  if (rc < 0) {
    ts_free(*out);
    *out = NULL;
    *n = 0;
  }
  return rc;
}
