/*
 * criteo_gen: Criteo-shaped click data a user can reproduce (docs/embeddings.md, "Data").
 *
 * Rows in the Criteo TSV format of the Kaggle Display Advertising Challenge: a 0/1 label,
 * 13 integer features and 26 categorical features as 8 hex digits, tab-separated, a missing
 * value empty. The 26 fields have the published Kaggle cardinalities (33.76 M ids in all,
 * the five largest 98.3 % of them; --max-cardinality caps each for small tests), each
 * field's ids drawn from a Zipf law of exponent --zipf by rejection-inversion (Hörmann and
 * Derflinger), so a few ids are very common and most are rare, as in the real data.
 *
 * Labels come from a hidden logistic model: logit = bias + sum_j a_j log(1 + I_j) + sum_f
 * w_f(id), the weights a pure function of (seed, field, id). The best AUC any model can
 * reach on these rows is that of the true probabilities; it is computed while the rows are
 * written (ps-worker's binned AUC, worker/ts_ctr.h: 2^16 bins, ties within a bin half) and
 * printed on stderr with the click rate: "best_auc=0.80... ctr=0.25... rows=N".
 *
 * Streaming: one row at a time through stdio's buffer; memory does not grow with --rows.
 * The same arguments give the same bytes.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_ctr.h"  /* ts_ctr_auc */
#include "ts_init.h" /* ts_init_uniform */
#include "ts_key.h"  /* ts_key_hash */

#define NUM_INT 13
#define NUM_CAT 26

/* The Kaggle Criteo fields' distinct ids (C1..C26), as DLRM and TorchRec list them. */
static const uint64_t kaggle_card[NUM_CAT] = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

/* Fractions of missing values per field, close to the Kaggle training set's. */
static const double int_missing[NUM_INT] = {0.45,  0.0,  0.21, 0.22, 0.03, 0.22, 0.04,
                                            0.001, 0.04, 0.45, 0.04, 0.77, 0.22};
static const double cat_missing[NUM_CAT] = {0,    0,    0.03, 0.03, 0, 0.12, 0,    0,   0,
                                            0,    0,    0.03, 0,    0, 0,    0.03, 0,   0,
                                            0.44, 0.44, 0.03, 0,    0, 0.44, 0,    0.44};

/* --- randomness: counter-based, proto/ts_init.h's generator -------------------------------- */

/* The row stream: draw n of the stream key (ts_init_uniform: the same generator as the
 * shards' initialisation). */
typedef struct {
  uint64_t key, n;
} rng_t;

static double rng_uniform(rng_t *r) {
  return ts_init_uniform(r->key, r->n++);
}

static double normal_of(double u, double v) {
  return sqrt(-2.0 * log(u > 0 ? u : 0x1.0p-53)) * cos(2.0 * M_PI * v);
}

static double rng_normal(rng_t *r) {
  double u = rng_uniform(r);
  return normal_of(u, rng_uniform(r));
}

/* A standard normal that depends only on key: the hidden weights. */
static double key_normal(uint64_t key) {
  return normal_of(ts_init_uniform(key, 0), ts_init_uniform(key, 1));
}

/* --- Zipf by rejection-inversion (Hörmann and Derflinger 1996), any exponent > 0 -------- */

typedef struct {
  double s, h_x1, h_n, sconst;
  uint64_t n;
} zipf_t;

static double helper1(double x) {
  return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x * (0.5 - x / 3.0);
}
static double helper2(double x) {
  return fabs(x) > 1e-8 ? expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x / 3.0);
}
static double zh(const zipf_t *z, double x) {
  return exp(-z->s * log(x));
}
static double zH(const zipf_t *z, double x) {
  double lx = log(x);
  return helper2((1.0 - z->s) * lx) * lx;
}
static double zHinv(const zipf_t *z, double x) {
  double t = x * (1.0 - z->s);
  if (t < -1.0) t = -1.0;
  return exp(helper1(t) * x);
}

static void zipf_init(zipf_t *z, uint64_t n, double s) {
  z->n = n;
  z->s = s;
  z->h_x1 = zH(z, 1.5) - 1.0;
  z->h_n = zH(z, (double)n + 0.5);
  z->sconst = 2.0 - zHinv(z, zH(z, 2.5) - zh(z, 2.0));
}

/* A rank in 1..n, rank k with probability proportional to k^-s. */
static uint64_t zipf_draw(const zipf_t *z, rng_t *r) {
  for (;;) {
    double u = z->h_n + rng_uniform(r) * (z->h_x1 - z->h_n);
    double x = zHinv(z, u);
    double kd = floor(x + 0.5);
    if (kd < 1.0) kd = 1.0;
    if (kd > (double)z->n) kd = (double)z->n;
    if (kd - x <= z->sconst || u >= zH(z, kd + 0.5) - zh(z, kd)) return (uint64_t)kd;
  }
}

/* A bijection of 32-bit values keyed by (seed, field): rank -> the id a row shows, so the
 * common ids are not the small numbers and no two ranks share an id. */
static uint32_t id_of(uint64_t key, uint32_t rank) {
  uint32_t x = rank ^ (uint32_t)key;
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  x *= 0x85ebca77u | 1u;
  x ^= x >> 13;
  x += (uint32_t)(key >> 32);
  x *= 0xc2b2ae3du;
  x ^= x >> 16;
  return x;
}

/* --- the generator ------------------------------------------------------------------------ */

typedef struct {
  uint64_t rows, seed, stream, max_card;
  double zipf, bias, cat_scale, int_scale;
  const char *out;
} opts_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: criteo_gen [--rows N] [--seed S] [--stream R] [--zipf A] [--max-cardinality C]\n"
          "                  [--bias B] [--cat-scale X] [--int-scale Y] [-o FILE]\n"
          "Writes N rows (default 100000) of Criteo-shaped click data in the Criteo TSV\n"
          "format to FILE (default stdout). The ids of each of the 26 fields follow a Zipf\n"
          "law of exponent A (default 1.05; 0.8 to 1.3 is the useful range) over the\n"
          "Kaggle Criteo cardinalities, each capped at C (default: no cap). Labels come\n"
          "from a hidden logistic model: bias B (default -1.9), per-id weights of\n"
          "standard deviation X (default 0.35), integer-feature weights of scale Y\n"
          "(default 0.25). On stderr: best_auc (the true probabilities' AUC on these\n"
          "rows), ctr, rows. The same arguments give the same bytes. --stream R (default 0)\n"
          "draws other rows of the same hidden model (seed S): a test set.\n");
}

static bool parse_u64(const char *s, uint64_t min, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-' || v < min) return false;
  *out = v;
  return true;
}

static bool parse_double(const char *s, double min, double max, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= min && v <= max)) return false;
  *out = v;
  return true;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.rows = 100000,
                .seed = 1,
                .zipf = 1.05,
                .bias = -1.9,
                .cat_scale = 0.35,
                .int_scale = 0.25,
                .out = NULL};
  static const struct option longs[] = {{"rows", required_argument, 0, 'n'},
                                        {"seed", required_argument, 0, 's'},
                                        {"zipf", required_argument, 0, 'z'},
                                        {"max-cardinality", required_argument, 0, 'm'},
                                        {"bias", required_argument, 0, 'b'},
                                        {"cat-scale", required_argument, 0, 'x'},
                                        {"int-scale", required_argument, 0, 'y'},
                                        {"output", required_argument, 0, 'o'},
                                        {"stream", required_argument, 0, 'r'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "o:h", longs, NULL)) != -1) {
    bool ok = true;
    switch (c) {
      case 'n':
        ok = parse_u64(optarg, 1, &o->rows);
        break;
      case 's':
        ok = parse_u64(optarg, 0, &o->seed);
        break;
      case 'r':
        ok = parse_u64(optarg, 0, &o->stream);
        break;
      case 'z':
        ok = parse_double(optarg, 0.01, 10.0, &o->zipf);
        break;
      case 'm':
        ok = parse_u64(optarg, 1, &o->max_card);
        break;
      case 'b':
        ok = parse_double(optarg, -20.0, 20.0, &o->bias);
        break;
      case 'x':
        ok = parse_double(optarg, 0.0, 10.0, &o->cat_scale);
        break;
      case 'y':
        ok = parse_double(optarg, 0.0, 10.0, &o->int_scale);
        break;
      case 'o':
        o->out = optarg;
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
    if (!ok) {
      const char *name = "?";
      for (const struct option *l = longs; l->name; l++)
        if (l->val == c) name = l->name;
      fprintf(stderr, "criteo_gen: bad value '%s' for --%s (see --help)\n", optarg, name);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "criteo_gen: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  return -1;
}

int main(int argc, char **argv) {
  opts_t o;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) return rc;
  FILE *f = o.out ? fopen(o.out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "criteo_gen: %s: %s\n", o.out, strerror(errno));
    return 1;
  }
  static uint64_t pos[TS_CTR_AUC_BINS], neg[TS_CTR_AUC_BINS];
  zipf_t z[NUM_CAT];
  uint64_t fkey[NUM_CAT];
  double a[NUM_INT], mu[NUM_INT];
  const uint64_t base = ts_key_hash(o.seed + 0x9e3779b97f4a7c15ull); /* seed 0 included */
  for (int j = 0; j < NUM_INT; j++) {
    a[j] = o.int_scale * key_normal(base ^ (0x1000u + (uint64_t)j));
    mu[j] = 0.5 + 3.0 * (double)(ts_key_hash(base + 77u + (uint64_t)j) >> 11) * 0x1.0p-53;
  }
  for (int f2 = 0; f2 < NUM_CAT; f2++) {
    uint64_t card = kaggle_card[f2];
    if (o.max_card && card > o.max_card) card = o.max_card;
    zipf_init(&z[f2], card, o.zipf);
    fkey[f2] = ts_key_hash(base ^ (0x2000u + (uint64_t)f2));
  }
  /* The rows' stream: --stream picks other rows of the same hidden model (a test set). */
  uint64_t rs = base ^ ts_key_hash(0x5eed0000u + o.stream);
  rng_t r = {.key = rs, .n = 0};
  uint64_t clicks = 0;
  for (uint64_t row = 0; row < o.rows; row++) {
    char line[512];
    size_t len = 0;
    double logit = o.bias;
    char ints[NUM_INT][24];
    for (int j = 0; j < NUM_INT; j++) {
      ints[j][0] = '\0';
      if (rng_uniform(&r) < int_missing[j]) continue;
      double v = floor(exp(mu[j] + 1.2 * rng_normal(&r))) - 1.0;
      if (v < 0) v = 0;
      if (v > 1e9) v = 1e9;
      snprintf(ints[j], sizeof ints[j], "%.0f", v);
      logit += a[j] * (log1p(v) - mu[j]);
    }
    char cats[NUM_CAT][12];
    for (int f2 = 0; f2 < NUM_CAT; f2++) {
      cats[f2][0] = '\0';
      if (rng_uniform(&r) < cat_missing[f2]) continue;
      uint64_t rank = zipf_draw(&z[f2], &r);
      snprintf(cats[f2], sizeof cats[f2], "%08x", id_of(fkey[f2], (uint32_t)rank));
      logit += o.cat_scale * key_normal(fkey[f2] ^ ts_key_hash(rank));
    }
    double p = 1.0 / (1.0 + exp(-logit));
    int label = rng_uniform(&r) < p;
    clicks += (uint64_t)label;
    const float pf = (float)p;
    const int32_t lab = label;
    ts_ctr_auc_add(pos, neg, &pf, &lab, 1);
    len += (size_t)snprintf(line + len, sizeof line - len, "%d", label);
    for (int j = 0; j < NUM_INT; j++)
      len += (size_t)snprintf(line + len, sizeof line - len, "\t%s", ints[j]);
    for (int f2 = 0; f2 < NUM_CAT; f2++)
      len += (size_t)snprintf(line + len, sizeof line - len, "\t%s", cats[f2]);
    line[len++] = '\n';
    if (fwrite(line, 1, len, f) != len) {
      fprintf(stderr, "criteo_gen: writing %s: %s\n", o.out ? o.out : "stdout", strerror(errno));
      return 1;
    }
  }
  if (fflush(f) != 0 || (o.out && fclose(f) != 0)) {
    fprintf(stderr, "criteo_gen: writing %s: %s\n", o.out ? o.out : "stdout", strerror(errno));
    return 1;
  }
  fprintf(stderr, "best_auc=%.6f ctr=%.6f rows=%" PRIu64 "\n", ts_ctr_auc(pos, neg),
          (double)clicks / (double)o.rows, o.rows);
  return 0;
}
