/*
 * pslite_sparse: embedding-table push+pull on ps-lite (dmlc/ps-lite), the peer of Tessera's
 * bench/sparsebench (issue 27; bench/sparse_compare.sh runs both).
 *
 * One binary for ps-lite's three roles (DMLC_ROLE = scheduler, server, worker, with
 * DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, as ps-lite's
 * docs/env.md says).
 *
 * Worker (rank r): the very batches of sparsebench's worker r (bench/sparse_common.h: --batch
 * ids drawn Zipf(--zipf) over [0, --vocab), --batches of them precomputed, used in turn).
 * Each request does what a ps-lite user must and Tessera's client does for its caller,
 * inside the timed loop: maps the ids onto ps-lite's key space (sb_mix64, a bijection, so the
 * keys spread over the servers' key ranges), sorts them and drops duplicates (ps-lite
 * requires sorted unique keys), sums the gradients of a key listed several times, sends one
 * ZPushPull (the gradients pushed and the rows pulled in one message per server: one round
 * trip, as Tessera's TS_CLIENT_SPARSE_PUSH_PULL), waits, and copies each pulled row to every
 * position of the caller's batch that named its key. --op push-pull sends ZPush, waits, then
 * ZPull, waits, instead. After --warmup-seconds (and at least --warmup-requests) of requests
 * and a barrier of every worker it iterates for --seconds and prints one JSON object:
 *
 *   {"role": "worker", "rank": R, "requests": N, "t0": T0, "t1": T1, "p50_us": ..,
 *    "p99_us": .., "unique_per_request": .., "cpu_user_s": .., "cpu_sys_s": .. (getrusage of
 *    the worker process, ZeroMQ's threads included, over [T0, T1]),
 *    "memcpy_gbps": .. (rank 0 only), ...}
 *
 * with CLOCK_MONOTONIC seconds, so the caller computes rows/s = workers' requests x batch /
 * (max t1 - min t0). Around the timed run each worker sends a mark (a push with cmd 1, then
 * cmd 2, of one key per server) so the servers know the timed window.
 *
 * Server: a request handle over std::unordered_map<uint64_t, std::vector<float>>: a key not
 * there gets a row of zeros (Tessera's table is declared with zero rows too); a push applies
 * SGD (row -= lr x gradient); a pull copies the rows into a freshly allocated reply, in the
 * request's key order. At exit it prints {"role": "server", "rows": .., "cpu_user_s": ..,
 * "cpu_sys_s": .. (getrusage of the process between the first start mark and the last end
 * mark), "rss_kib": .., "rss0_kib": .. (before any row)}.
 *
 * Scheduler: only ps::Start and ps::Finalize.
 */
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../sparse_common.h"
#include "ps/ps.h"

namespace {

struct Options {
  uint32_t dim = 64;
  size_t batch = 65536, nbatches = 8, warmup_requests = 1;
  double zipf = 1.0;
  uint64_t vocab = 1000000;
  double seconds = 1.5, warmup_seconds = 0.5, lr = 0.01;
  long memcpy_mib = 256;
  bool pushpull = true;
};

enum { kCmdData = 0, kCmdStart = 1, kCmdEnd = 2 };

long RssKib() {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

void CpuNow(double *user, double *sys) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  *user = static_cast<double>(ru.ru_utime.tv_sec) + static_cast<double>(ru.ru_utime.tv_usec) * 1e-6;
  *sys = static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) * 1e-6;
}

int ParseArgs(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--help" || a == "-h") {
      printf("usage: pslite_sparse [--dim D] [--batch B] [--zipf S] [--vocab V] [--batches N]\n"
             "         [--seconds T] [--warmup-seconds T] [--warmup-requests N] [--lr X]\n"
             "         [--memcpy-mib N]\n"
             "         [--op pushpull|push-pull]   (sparsebench's meanings; see the header)\n");
      exit(0);
    }
    if (!v) {
      fprintf(stderr, "pslite_sparse: %s needs a value\n", a.c_str());
      return -1;
    }
    i++;
    if (a == "--dim") o->dim = static_cast<uint32_t>(strtoul(v, nullptr, 10));
    else if (a == "--batch") o->batch = strtoull(v, nullptr, 10);
    else if (a == "--zipf") o->zipf = atof(v);
    else if (a == "--vocab") o->vocab = strtoull(v, nullptr, 10);
    else if (a == "--batches") o->nbatches = strtoull(v, nullptr, 10);
    else if (a == "--seconds") o->seconds = atof(v);
    else if (a == "--warmup-seconds") o->warmup_seconds = atof(v);
    else if (a == "--warmup-requests") o->warmup_requests = strtoull(v, nullptr, 10);
    else if (a == "--lr") o->lr = atof(v);
    else if (a == "--memcpy-mib") o->memcpy_mib = atol(v);
    else if (a == "--op") {
      if (!strcmp(v, "pushpull")) o->pushpull = true;
      else if (!strcmp(v, "push-pull")) o->pushpull = false;
      else {
        fprintf(stderr, "pslite_sparse: --op is pushpull or push-pull\n");
        return -1;
      }
    } else {
      fprintf(stderr, "pslite_sparse: unknown option %s\n", a.c_str());
      return -1;
    }
  }
  if (o->dim < 1 || o->dim > 4096 || o->batch < 1 || o->nbatches < 1 || o->vocab < 1 ||
      !(o->zipf > 0) || !(o->seconds > 0) || !(o->warmup_seconds >= 0) || !(o->lr > 0) ||
      o->memcpy_mib < 0 || o->warmup_requests > 65536) {
    fprintf(stderr, "pslite_sparse: an option is out of range\n");
    return -1;
  }
  return 0;
}

/* The table of one server: a row of dim floats per key, made (zeros) on first touch. */
class TableServer {
 public:
  explicit TableServer(const Options &o)
      : rank_(ps::MyRank()), workers_(ps::NumWorkers()), dim_(o.dim),
        lr_(static_cast<float>(o.lr)) {
    rss0_kib_ = RssKib();
  }

  void Handle(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
              ps::KVServer<float> *server) {
    if (meta.cmd == kCmdStart || meta.cmd == kCmdEnd) {
      Mark(meta.cmd);
      server->Response(meta, ps::KVPairs<float>());
      return;
    }
    size_t n = req.keys.size();
    ps::KVPairs<float> res;
    if (meta.pull) {
      res.keys = req.keys;
      res.vals.resize(n * dim_);
    }
    if (meta.push) CHECK_EQ(req.vals.size(), n * dim_) << "a push of another width";
    const float *g = req.vals.data();
    for (size_t i = 0; i < n; i++) {
      std::vector<float> &row = store_[req.keys[i]];
      if (row.empty()) row.assign(dim_, 0.0f);
      float *r = row.data();
      if (meta.push) {
        const float *gi = g + i * dim_;
        for (uint32_t j = 0; j < dim_; j++) r[j] -= lr_ * gi[j];
      }
      if (meta.pull) memcpy(res.vals.data() + i * dim_, r, dim_ * sizeof(float));
    }
    server->Response(meta, res);
  }

  void Print() const {
    printf("{\"role\": \"server\", \"rank\": %d, \"rows\": %zu, \"cpu_user_s\": %.4f, "
           "\"cpu_sys_s\": %.4f, \"rss_kib\": %ld, \"rss0_kib\": %ld}\n",
           rank_, rows_end_, user1_ - user0_, sys1_ - sys0_, rss_end_kib_, rss0_kib_);
    fflush(stdout);
  }

 private:
  void Mark(int cmd) {
    if (cmd == kCmdStart && starts_++ == 0) CpuNow(&user0_, &sys0_);
    if (cmd == kCmdEnd && ++ends_ == workers_) {
      CpuNow(&user1_, &sys1_);
      rows_end_ = store_.size();
      rss_end_kib_ = RssKib();
    }
  }

  int rank_, workers_;
  uint32_t dim_;
  float lr_;
  std::unordered_map<uint64_t, std::vector<float>> store_;
  int starts_ = 0, ends_ = 0;
  double user0_ = 0, sys0_ = 0, user1_ = 0, sys1_ = 0;
  size_t rows_end_ = 0;
  long rss0_kib_ = 0, rss_end_kib_ = 0;
};

/* What a worker holds between requests (reused: after Wait, ps-lite no longer uses them). */
struct Batch {
  std::vector<std::pair<uint64_t, uint32_t>> order;  /* (key, position in the batch) */
  std::vector<uint32_t> inv;                         /* position -> unique index */
  ps::SArray<ps::Key> keys;
  ps::SArray<float> grad, rows;
};

int RunWorker(const Options &o) {
  ps::KVWorker<float> kv(0, 0);
  const int rank = ps::MyRank();
  const size_t B = o.batch, D = o.dim;
  int64_t *ids = sb_zipf_batches(27, rank, o.nbatches, B, o.vocab, o.zipf);
  std::vector<float> grad(B * D, 1e-3f), dst(B * D, 0.0f);
  if (!ids) return 1;
  Batch b;
  b.order.resize(B);
  b.inv.resize(B);
  b.keys.reserve(B);
  b.grad.reserve(B * D);
  b.rows.reserve(B * D);
  size_t unique_sum = 0;

  auto request = [&](uint64_t n) {
    const int64_t *k = ids + (n % o.nbatches) * B;
    for (size_t i = 0; i < B; i++)
      b.order[i] = {sb_mix64(static_cast<uint64_t>(k[i])), static_cast<uint32_t>(i)};
    std::sort(b.order.begin(), b.order.end());
    size_t u = 0;
    for (size_t i = 0; i < B; i++) {
      if (i == 0 || b.order[i].first != b.order[i - 1].first) u++;
      b.inv[b.order[i].second] = static_cast<uint32_t>(u - 1);
    }
    b.keys.resize(u);
    b.grad.resize(u * D);
    b.rows.resize(u * D);
    memset(b.grad.data(), 0, u * D * sizeof(float));
    u = 0;
    for (size_t i = 0; i < B; i++) {
      if (i == 0 || b.order[i].first != b.order[i - 1].first) b.keys[u++] = b.order[i].first;
    }
    for (size_t i = 0; i < B; i++) {   /* the gradients of a key listed twice, summed */
      float *gs = b.grad.data() + static_cast<size_t>(b.inv[i]) * D;
      const float *gi = grad.data() + i * D;
      for (size_t j = 0; j < D; j++) gs[j] += gi[j];
    }
    if (o.pushpull) {
      kv.Wait(kv.ZPushPull(b.keys, b.grad, &b.rows));
    } else {
      kv.Wait(kv.ZPush(b.keys, b.grad));
      kv.Wait(kv.ZPull(b.keys, &b.rows));
    }
    for (size_t i = 0; i < B; i++)   /* each row to every position that named its key */
      memcpy(dst.data() + i * D, b.rows.data() + static_cast<size_t>(b.inv[i]) * D,
             D * sizeof(float));
    unique_sum += u;
  };
  /* A mark of the timed window: one key per server (the first of its range). */
  const std::vector<ps::Range> &ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  ps::SArray<ps::Key> mkeys(ranges.size());
  for (size_t i = 0; i < ranges.size(); i++) mkeys[i] = ranges[i].begin();
  ps::SArray<float> mvals(ranges.size() * D, 0.0f);
  auto mark = [&](int cmd) { kv.Wait(kv.ZPush(mkeys, mvals, {}, cmd)); };

  uint64_t n = 0;
  double warm_end = sb_now_s() + o.warmup_seconds;
  do request(n++); while (n < o.warmup_requests || sb_now_s() < warm_end);
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  mark(kCmdStart);
  unique_sum = 0;
  std::vector<double> lat;
  lat.reserve(1 << 16);
  double user0, sys0, user1, sys1;
  CpuNow(&user0, &sys0);
  double t0 = sb_now_s(), deadline = t0 + o.seconds, t1;
  long requests = 0;
  while ((t1 = sb_now_s()) < deadline) {
    request(n++);
    lat.push_back((sb_now_s() - t1) * 1e6);
    requests++;
  }
  t1 = sb_now_s();
  CpuNow(&user1, &sys1);
  mark(kCmdEnd);
  /* The pulled rows: SGD from zeros with positive gradients leaves every touched row <= 0,
   * the hottest id's strictly below. */
  bool ok = true;
  for (size_t i = 0; i < B * D; i++) ok = ok && dst[i] <= 0.0f;
  std::sort(lat.begin(), lat.end());
  auto q = [&](double p) -> double {
    if (lat.empty()) return NAN;
    size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(lat.size())));
    return lat[std::min(std::max(k, static_cast<size_t>(1)), lat.size()) - 1];
  };
  printf("{\"role\": \"worker\", \"rank\": %d, \"requests\": %ld, \"t0\": %.6f, \"t1\": %.6f, "
         "\"batch\": %zu, \"dim\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, "
         "\"unique_per_request\": %.1f, \"cpu_user_s\": %.4f, \"cpu_sys_s\": %.4f, "
         "\"check\": \"%s\"",
         rank, requests, t0, t1, B, D, q(0.5), q(0.99),
         requests ? static_cast<double>(unique_sum) / static_cast<double>(requests) : 0.0,
         user1 - user0, sys1 - sys0, ok ? "ok" : "wrong-sign");
  free(ids);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (ParseArgs(argc, argv, &o) < 0) return 2;
  for (const char *e : {"DMLC_ROLE", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI",
                        "DMLC_PS_ROOT_PORT"}) {
    if (!getenv(e)) {
      fprintf(stderr, "pslite_sparse: %s is not set (ps-lite's environment)\n", e);
      return 2;
    }
  }
  ps::Start(0);
  int rc = 0;
  TableServer *handler = nullptr;
  ps::KVServer<float> *server = nullptr;
  if (ps::IsServer()) {
    handler = new TableServer(o);
    server = new ps::KVServer<float>(0);
    server->set_request_handle(
        [handler](const ps::KVMeta &m, const ps::KVPairs<float> &d, ps::KVServer<float> *s) {
          handler->Handle(m, d, s);
        });
  }
  bool worker = ps::IsWorker();
  int rank = worker ? ps::MyRank() : -1;
  if (worker) rc = RunWorker(o);
  ps::Finalize(0, true);
  if (handler) handler->Print();
  if (worker) {   /* the worker's JSON object ends here: rank 0 adds memcpy, measured last */
    double m = rank == 0 && o.memcpy_mib ? sb_memcpy_gbps(static_cast<size_t>(o.memcpy_mib) << 20, 0.5)
                                         : NAN;
    if (std::isnan(m)) printf("}\n");
    else printf(", \"memcpy_gbps\": %.3f}\n", m);
    fflush(stdout);
  }
  delete server;
  delete handler;
  return rc;
}
