/* The hottest keys of a table (ts_hotkeys.h): Space-Saving over a sample of the pulled
 * keys. With TS_HOTKEYS_SLOTS = 128 a linear scan needs no index, and the sampling keeps
 * its cost per pulled key small. */
#include "ts_hotkeys.h"

#include <string.h>

void ts_hotkeys_init(ts_hotkeys_t *h, uint32_t every) {
  memset(h, 0, sizeof *h);
  h->every = every ? every : 1;
  h->rng = 0x9E3779B97F4A7C15ull;
}

void ts_hotkeys_see(ts_hotkeys_t *h, uint64_t key) {
  if (h->skip) {
    h->skip--;
    return;
  }
  h->rng ^= h->rng << 13;
  h->rng ^= h->rng >> 7;
  h->rng ^= h->rng << 17;
  h->skip = (uint32_t)(h->rng % (2 * (uint64_t)h->every - 1));
  h->total++;
  uint32_t min = 0;
  for (uint32_t i = 0; i < h->used; i++) {
    if (h->slot[i].key == key) {
      h->slot[i].count++;
      return;
    }
    if (h->slot[i].count < h->slot[min].count) min = i;
  }
  if (h->used < TS_HOTKEYS_SLOTS) {
    h->slot[h->used++] = (ts_hotkey_t){.key = key, .count = 1, .error = 0};
    return;
  }
  /* The least counted key gives its place: the newcomer may have been seen that often. */
  uint64_t c = h->slot[min].count;
  h->slot[min] = (ts_hotkey_t){.key = key, .count = c + 1, .error = c};
}

void ts_hotkeys_decay(ts_hotkeys_t *h) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < h->used; i++) {
    ts_hotkey_t e = h->slot[i];
    e.count /= 2;
    e.error /= 2;
    if (e.count) h->slot[kept++] = e;
  }
  h->used = kept;
  h->total /= 2;
}

size_t ts_hotkeys_top(const ts_hotkeys_t *h, ts_hotkey_t *out, size_t n) {
  if (n > h->used) n = h->used;
  /* Selection of the n largest: n is small (a status line's worth). */
  uint8_t taken[TS_HOTKEYS_SLOTS] = {0};
  for (size_t k = 0; k < n; k++) {
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < h->used; i++) {
      const ts_hotkey_t *e = &h->slot[i], *b = &h->slot[best == UINT32_MAX ? 0 : best];
      if (!taken[i] && (best == UINT32_MAX || e->count - e->error > b->count - b->error)) best = i;
    }
    taken[best] = 1;
    out[k] = h->slot[best];
  }
  return n;
}

double ts_hotkeys_share(const ts_hotkeys_t *h, size_t n) {
  if (h->total == 0) return 0;
  ts_hotkey_t top[TS_HOTKEYS_SLOTS];
  n = ts_hotkeys_top(h, top, n < TS_HOTKEYS_SLOTS ? n : TS_HOTKEYS_SLOTS);
  uint64_t sure = 0;
  for (size_t i = 0; i < n; i++) sure += top[i].count - top[i].error;
  return (double)sure / (double)h->total;
}
