#include "ts_device.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ts_err.h"

static int bad(char *errmsg, size_t errlen, const char *s, const char *why) {
  snprintf(errmsg, errlen, "malformed device name '%s': %s", s, why);
  return TS_EINVAL;
}

/* Parse a non-negative decimal at p (up to the next '/' or end); -1 when not one, -2 when it
 * has more than 6 digits. */
static long number(const char *p, size_t len) {
  if (len == 0) return -1;
  long v = 0;
  for (size_t i = 0; i < len; i++) {
    if (!isdigit((unsigned char)p[i])) return -1;
    if (i < 6) v = v * 10 + (p[i] - '0');
  }
  return len > 6 ? -2 : v;
}

/* Why number() refused n: what ("the device index") must be a number, or is too large. */
static int bad_number(char *errmsg, size_t errlen, const char *s, const char *what, long n) {
  snprintf(errmsg, errlen, "malformed device name '%s': %s %s", s, what,
           n == -2 ? "is out of range (at most 999999)" : "must be a number");
  return TS_EINVAL;
}

static int parse_type(const char *t, size_t len, ts_device_type_t *out) {
  if (len == 3 && strncasecmp(t, "cpu", 3) == 0) {
    *out = TS_DEVICE_CPU;
    return 0;
  }
  if (len == 3 && strncasecmp(t, "gpu", 3) == 0) {
    *out = TS_DEVICE_GPU;
    return 0;
  }
  return -1;
}

int ts_device_parse(const char *s, ts_device_spec_t *out, char *errmsg, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->type = TS_DEVICE_CPU;
  if (!s || !*s) {
    out->unspecified = true;
    return 0;
  }
  if (s[0] != '/') return bad(errmsg, errlen, s, "it must start with '/' (e.g. /gpu:0)");
  bool have_device = false;
  const char *p = s;
  while (*p) {
    if (*p != '/') return bad(errmsg, errlen, s, "expected '/' between parts");
    p++;
    const char *end = strchr(p, '/');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *colon = memchr(p, ':', len);
    if (!colon) return bad(errmsg, errlen, s, "each part is KEY:VALUE (e.g. /task:0)");
    size_t klen = (size_t)(colon - p);
    const char *v = colon + 1;
    size_t vlen = len - klen - 1;
    if (have_device) return bad(errmsg, errlen, s, "nothing may follow the device part");
    if (klen == 3 && strncmp(p, "job", 3) == 0) {
      if (vlen == 0 || vlen >= sizeof out->job) return bad(errmsg, errlen, s, "bad job name");
      memcpy(out->job, v, vlen);
      out->job[vlen] = 0;
      out->has_job = true;
    } else if (klen == 7 && strncmp(p, "replica", 7) == 0) {
      long n = number(v, vlen);
      if (n < 0) return bad_number(errmsg, errlen, s, "the replica", n);
      out->replica = (int)n;
      out->has_replica = true;
    } else if (klen == 4 && strncmp(p, "task", 4) == 0) {
      long n = number(v, vlen);
      if (n < 0) return bad_number(errmsg, errlen, s, "the task", n);
      out->task = (int)n;
      out->has_task = true;
    } else if (klen == 6 && strncmp(p, "device", 6) == 0) {
      /* /device:GPU:0 */
      const char *c2 = memchr(v, ':', vlen);
      if (!c2) return bad(errmsg, errlen, s, "the device part is /device:TYPE:INDEX");
      if (parse_type(v, (size_t)(c2 - v), &out->type) < 0)
        return bad(errmsg, errlen, s, "the device type must be CPU or GPU");
      long n = number(c2 + 1, vlen - (size_t)(c2 - v) - 1);
      if (n < 0) return bad_number(errmsg, errlen, s, "the device index", n);
      out->index = (int)n;
      have_device = true;
    } else if (parse_type(p, klen, &out->type) == 0) {
      /* /gpu:0, /cpu:0 */
      long n = number(v, vlen);
      if (n < 0) return bad_number(errmsg, errlen, s, "the device index", n);
      out->index = (int)n;
      have_device = true;
    } else {
      return bad(errmsg, errlen, s, "unknown part (expected job, replica, task, device, cpu or gpu)");
    }
    p += len;
  }
  if (out->has_job && strcmp(out->job, "worker") != 0 && strcmp(out->job, "localhost") != 0)
    return bad(errmsg, errlen, s, "a worker's ops run in job 'worker'");
  if (out->type == TS_DEVICE_CPU && out->index != 0)
    return bad(errmsg, errlen, s, "there is one CPU device, /cpu:0");
  return 0;
}

void ts_device_short_name(ts_device_type_t type, int index, char *buf, size_t n) {
  snprintf(buf, n, "/device:%s:%d", type == TS_DEVICE_GPU ? "GPU" : "CPU", index);
}

void ts_device_long_name(ts_device_type_t type, int index, int task, char *buf, size_t n) {
  snprintf(buf, n, "/job:worker/replica:0/task:%d/device:%s:%d", task,
           type == TS_DEVICE_GPU ? "GPU" : "CPU", index);
}

void ts_device_available(int gpu_count, int task, char *buf, size_t n) {
  size_t used = 0;
  if (n) buf[0] = '\0';
  for (int i = -1; i < gpu_count && used + 1 < n; i++) {
    char dev[96];
    ts_device_long_name(i < 0 ? TS_DEVICE_CPU : TS_DEVICE_GPU, i < 0 ? 0 : i, task, dev,
                        sizeof dev);
    int w = snprintf(buf + used, n - used, "%s%s", i < 0 ? "" : ", ", dev);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* Where TensorFlow's placer puts an op nobody placed: the first GPU when one is visible and
 * has the op's kernel, else the CPU. */
static void place_unspecified(const ts_placement_op_t *op, int gpu_count, ts_placement_t *pl) {
  pl->type = gpu_count > 0 && op->gpu_kernel ? TS_DEVICE_GPU : TS_DEVICE_CPU;
  pl->index = 0;
}

int ts_device_place(const ts_device_spec_t *want, int gpu_count, const char *gpu_why, int task,
                    const ts_placement_op_t *ops, size_t n, bool allow_soft, ts_placement_t *out,
                    char *errmsg, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    ts_placement_t *pl = &out[i];
    memset(pl, 0, sizeof *pl);
    const ts_device_spec_t *w = ops[i].want ? ops[i].want : ops[i].outside_scope ? NULL : want;
    if (!w || w->unspecified) {
      place_unspecified(&ops[i], gpu_count, pl);
      continue;
    }
    ts_device_short_name(w->type, w->index, pl->asked, sizeof pl->asked);
    if (w->type == TS_DEVICE_CPU) {
      pl->type = TS_DEVICE_CPU;
      continue;
    }
    const char *tf_why = NULL;
    bool missing = gpu_count == 0 || w->index >= gpu_count;
    if (missing) {
      tf_why = "no devices matching that specification are registered in this process";
      if (gpu_count == 0)
        snprintf(pl->reason, sizeof pl->reason, "no GPU is visible (%s)",
                 gpu_why ? gpu_why : "no CUDA device");
      else
        snprintf(pl->reason, sizeof pl->reason, "only %d GPU(s) are visible", gpu_count);
    } else if (!ops[i].gpu_kernel) {
      tf_why = "no supported kernel for GPU devices is available";
      snprintf(pl->reason, sizeof pl->reason, "op %s has no GPU kernel", ops[i].type);
    }
    if (!tf_why) {
      pl->type = TS_DEVICE_GPU;
      pl->index = w->index;
      continue;
    }
    if (!allow_soft) {
      char avail[512] = "";
      if (missing) ts_device_available(gpu_count, task, avail, sizeof avail);
      snprintf(errmsg, errlen,
               "Cannot assign a device for operation %s: Could not satisfy explicit device "
               "specification '%s' because %s%s%s",
               ops[i].name, pl->asked, tf_why, missing ? "; available devices: " : "",
               missing ? avail : "");
      return TS_EDEVICE;
    }
    pl->soft = true;
    place_unspecified(&ops[i], gpu_count, pl);
  }
  return 0;
}
