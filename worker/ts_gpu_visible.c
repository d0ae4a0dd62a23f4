/*
 * CUDA_VISIBLE_DEVICES as the CUDA runtime reads it (the rules are in ts_gpu_visible.h). The
 * runtime's own parser is not public; what it does with the cases NVIDIA's guide leaves open
 * (blanks, trailing text, repeats, a UUID list with an index in it) follows PyTorch's
 * torch.cuda._parse_visible_devices, which was written to agree with the driver so that
 * torch.cuda.device_count() can be answered without creating a CUDA context.
 */
#include "ts_gpu_visible.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ts_device.h"
#include "ts_err.h"

#define UUID_PREFIX_LEN 4 /* "GPU-", "MIG-" */

/* Append to buf[*len..n), keeping it terminated; stops quietly when full. */
static void append(char *buf, size_t n, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= n) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + *len, n - *len, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  *len = *len + (size_t)k < n ? *len + (size_t)k : n - 1;
}

/* A copy for log lines: at most n - 1 bytes, control characters as '?', and "..." when cut. */
static void printable(const char *s, size_t len, char *out, size_t n) {
  size_t room = n - 1, i = 0;
  bool cut = len > room;
  if (cut) room -= 3;
  for (; i < len && i < room; i++) out[i] = iscntrl((unsigned char)s[i]) ? '?' : s[i];
  if (cut) {
    memcpy(out + i, "...", 3);
    i += 3;
  }
  out[i] = '\0';
}

/* An index entry read as strtoul(s, NULL, 10) reads it: blanks, then a sign, then digits;
 * whatever follows the digits is ignored. Returns the index, or -1 when there are no digits,
 * the number is negative, or it is past INT_MAX (no machine has that GPU). */
static int parse_index(const char *s, size_t len) {
  size_t i = 0;
  while (i < len && isspace((unsigned char)s[i])) i++;
  bool neg = false;
  if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i == len || !isdigit((unsigned char)s[i])) return -1;
  long long v = 0;
  for (; i < len && isdigit((unsigned char)s[i]); i++) {
    v = v * 10 + (s[i] - '0');
    if (v > INT_MAX) return -1;
  }
  if (neg && v != 0) return -1; /* "-0" is 0 to strtoul, as it is to PyTorch's reading */
  return (int)v;
}

static void hide_all(ts_gpu_visible_t *out) {
  out->n = 0;
  out->listed = 0;
  out->truncated = false;
}

int ts_gpu_visible_parse(const char *value, ts_gpu_visible_t *out) {
  if (!out) return TS_EINVAL;
  memset(out, 0, sizeof *out);
  if (!value) return 0; /* unset: every GPU, counted by ts_gpu_visible_apply */
  out->set = true;
  printable(value, strlen(value), out->value, sizeof out->value);
  /* The first entry decides the list's kind, with no blanks skipped before a UUID. */
  const char *kind = NULL;
  if (strncmp(value, "GPU-", UUID_PREFIX_LEN) == 0) kind = "GPU-";
  if (strncmp(value, "MIG-", UUID_PREFIX_LEN) == 0) kind = "MIG-";
  for (const char *p = value;; p++) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    ts_gpu_visible_entry_t e = {.index = -1};
    bool ok;
    if (kind) {
      ok = len >= UUID_PREFIX_LEN && len < sizeof e.uuid && strncmp(p, kind, UUID_PREFIX_LEN) == 0;
      if (ok) memcpy(e.uuid, p, len);
    } else {
      e.index = parse_index(p, len);
      ok = e.index >= 0;
    }
    if (!ok) {
      printable(p, len, out->stop, sizeof out->stop);
      break;
    }
    for (size_t i = 0; i < out->n; i++) {
      bool same =
          kind ? strcmp(out->entries[i].uuid, e.uuid) == 0 : out->entries[i].index == e.index;
      if (same) {
        printable(p, len, out->stop, sizeof out->stop);
        out->repeated = true;
        hide_all(out);
        return 0;
      }
    }
    if (out->n == TS_GPU_VISIBLE_MAX) {
      out->truncated = true;
      break;
    }
    out->entries[out->n++] = e;
    out->listed = out->n;
    if (!comma) break;
    p = comma;
  }
  return (int)out->n;
}

void ts_gpu_visible_apply(ts_gpu_visible_t *v, int gpu_count) {
  if (!v || gpu_count < 0) return;
  if (!v->set) {
    v->n = (size_t)gpu_count < TS_GPU_VISIBLE_MAX ? (size_t)gpu_count : TS_GPU_VISIBLE_MAX;
    v->listed = v->n;
    for (size_t i = 0; i < v->n; i++) v->entries[i] = (ts_gpu_visible_entry_t){.index = (int)i};
    return;
  }
  if ((size_t)gpu_count >= v->n) return;
  if (gpu_count == 0) { /* no driver, no device, or the first entry: the runtime says which */
    v->n = 0;
    return;
  }
  const ts_gpu_visible_entry_t *e = &v->entries[gpu_count];
  if (e->index >= 0)
    snprintf(v->stop, sizeof v->stop, "%d", e->index);
  else
    snprintf(v->stop, sizeof v->stop, "%s", e->uuid);
  v->n = (size_t)gpu_count;
}

int ts_gpu_visible_physical(const ts_gpu_visible_t *v, int ordinal, const ts_gpu_info_t *info,
                            char *buf, size_t n) {
  char scratch[8];
  if (!buf) {
    buf = scratch;
    n = sizeof scratch;
  }
  if (!v || !v->set) {
    snprintf(buf, n, "%d", ordinal);
    return ordinal;
  }
  if (ordinal < 0 || (size_t)ordinal >= v->n) {
    /* The runtime shows a GPU the text does not account for: say what the runtime says. */
    if (info && info->uuid[0])
      snprintf(buf, n, "GPU-%s", info->uuid);
    else
      snprintf(buf, n, "?");
    return -1;
  }
  const ts_gpu_visible_entry_t *e = &v->entries[ordinal];
  if (e->index >= 0) {
    snprintf(buf, n, "%d", e->index);
    return e->index;
  }
  const char *digits = e->uuid + UUID_PREFIX_LEN;
  if (info && info->uuid[0] && strncasecmp(info->uuid, digits, strlen(digits)) == 0)
    snprintf(buf, n, "%.*s%s", UUID_PREFIX_LEN, e->uuid, info->uuid);
  else
    snprintf(buf, n, "%s", e->uuid);
  return -1;
}

const char *ts_gpu_visible_describe(const ts_gpu_visible_t *v, char *buf, size_t n) {
  size_t len = 0;
  if (!buf || n == 0) return buf;
  buf[0] = '\0';
  if (!v || !v->set) {
    append(buf, n, &len, "%s is not set: every GPU is visible, /gpu:N is physical GPU N",
           TS_GPU_VISIBLE_ENV);
    return buf;
  }
  append(buf, n, &len, "%s=\"%s\": ", TS_GPU_VISIBLE_ENV, v->value);
  if (v->repeated) {
    append(buf, n, &len, "no GPU is visible (\"%s\" is listed twice, and CUDA then shows none)",
           v->stop);
    return buf;
  }
  if (v->listed == 0) {
    if (strspn(v->value, " \t\n") == strlen(v->value))
      append(buf, n, &len, "no GPU is visible (the list is empty)");
    else
      append(buf, n, &len, "no GPU is visible (\"%s\" is not a GPU)", v->stop);
    return buf;
  }
  /* When the runtime sees none, what the text says still tells the reader what was meant. */
  size_t shown = v->n ? v->n : v->listed;
  for (size_t i = 0; i < shown; i++) {
    const ts_gpu_visible_entry_t *e = &v->entries[i];
    if (e->index >= 0)
      append(buf, n, &len, "%s/gpu:%zu is physical GPU %d", i ? ", " : "", i, e->index);
    else
      append(buf, n, &len, "%s/gpu:%zu is %s", i ? ", " : "", i, e->uuid);
  }
  if (v->n == 0)
    append(buf, n, &len, "; the CUDA runtime reports no GPU");
  else if (v->n < v->listed)
    append(buf, n, &len,
           "; CUDA sees %zu of the %zu listed: \"%s\" is not a GPU of this machine, so CUDA "
           "ignores it and everything after it",
           v->n, v->listed, v->stop);
  else if (v->stop[0])
    append(buf, n, &len, "; \"%s\" is not a GPU, so CUDA ignores it and everything after it",
           v->stop);
  if (v->truncated)
    append(buf, n, &len, "; only the first %d entries are read", TS_GPU_VISIBLE_MAX);
  return buf;
}

bool ts_gpu_visible_hides_all(const ts_gpu_visible_t *v, char *buf, size_t n) {
  if (!v || !v->set || v->listed > 0) return false;
  if (buf && n) {
    size_t len = 0;
    buf[0] = '\0';
    append(buf, n, &len, "%s=\"%s\" hides every GPU", TS_GPU_VISIBLE_ENV, v->value);
    if (v->repeated) append(buf, n, &len, ", as it lists \"%s\" twice", v->stop);
  }
  return true;
}

const char *ts_gpu_visible_created_line(const ts_gpu_visible_t *v, const ts_gpu_info_t *info,
                                        int task, size_t memory_bytes, char *buf, size_t n) {
  if (!buf || n == 0) return buf;
  if (!info) {
    buf[0] = '\0';
    return buf;
  }
  char dev[96], phys[96], bus[sizeof info->pci_bus_id];
  ts_device_long_name(TS_DEVICE_GPU, info->index, task, dev, sizeof dev);
  ts_gpu_visible_physical(v, info->index, info, phys, sizeof phys);
  size_t i = 0;
  for (; i + 1 < sizeof bus && info->pci_bus_id[i]; i++)
    bus[i] = (char)tolower((unsigned char)info->pci_bus_id[i]);
  bus[i] = '\0';
  /* TensorFlow: "Created device " << name << " with " << (bytes >> 20) << " MB memory: "
   * << " -> " << description, hence the two blanks before the arrow. */
  snprintf(buf, n,
           "Created device %s with %zu MB memory:  -> device: %s, name: %s, pci bus id: %s, "
           "compute capability: %d.%d",
           dev, memory_bytes >> 20, phys, info->name, bus, info->major, info->minor);
  return buf;
}
