/*
 * pslite_bench: dense push+pull throughput of ps-lite (dmlc/ps-lite), the peer of Tessera's
 * bench/psbench.
 *
 * One binary for the three roles ps-lite starts (DMLC_ROLE = scheduler, server, worker, with
 * DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT as ps-lite's
 * docs/env.md says). The tensor of --size bytes is split over the servers by ps-lite's own
 * key ranges: one key per server, the first key of that server's range
 * (Postoffice::GetServerKeyRanges), each with a value of size / 4 / servers floats -- one
 * slice per server, as MXNet's kvstore slices a big array over ps-lite's servers.
 *
 * Worker: ZPush of the gradient, wait for its reply, then ZPull of the tensor (ps-lite does
 * not keep the order of two requests queued at a server: see iteration() below), or with
 * --op pushpull one ZPushPull request (push and pull in one message, answered once); after
 * --warmup iterations and a barrier of every worker, it iterates for --seconds and prints
 *
 *   pslite_run rank=R iterations=N t0=T0 t1=T1 size=BYTES check=ok
 *
 * with CLOCK_MONOTONIC seconds (one clock for every process of the machine), so the caller
 * computes workers x iterations x 2 x size / (max t1 - min t0) over all workers: pushed
 * plus pulled bytes over the wall time, psbench's accounting. check=ok when the pulled
 * tensor holds the sum of the pushes (it exits 1 with check=wrong-sum otherwise).
 *
 * Server: a request handle that keeps one float array per key, adds each pushed value into
 * it, and answers pulls. --reply copy (the stock variant, as ps-lite's
 * KVServerDefaultHandle does) builds every pull reply in a freshly allocated array copied
 * from the store; --reply zerocopy (the tuned variant) answers with an SArray sharing the
 * stored memory, which ZMQ then sends from the store itself (zmq_msg_init_data). With more
 * than one worker a zero-copy reply can be sent while another worker's push is being added
 * into the same memory: the reply may mix two versions. That is the price of the tuning
 * (BytePS's server makes the same choice); it changes no byte count.
 *
 * Scheduler: only ps::Start and ps::Finalize.
 */
#include <time.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

struct Options {
  uint64_t size = 40ull << 20;
  double seconds = 1.0;
  int warmup = 1;
  bool zerocopy = false;
  bool pushpull = false;
};

double NowS() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/* "40MiB", "4KiB", "1GiB", "4096" -> bytes; 0 on error. */
uint64_t ParseSize(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !(v > 0)) return 0;
  uint64_t mul;
  if (*end == 0 || strcmp(end, "B") == 0) mul = 1;
  else if (strcmp(end, "KiB") == 0) mul = 1ull << 10;
  else if (strcmp(end, "MiB") == 0) mul = 1ull << 20;
  else if (strcmp(end, "GiB") == 0) mul = 1ull << 30;
  else return 0;
  return static_cast<uint64_t>(v * static_cast<double>(mul));
}

void Usage(FILE *f) {
  fprintf(f,
          "usage: pslite_bench [--size N] [--seconds S] [--warmup N] [--reply copy|zerocopy]\n"
          "                    [--op push-pull|pushpull]\n"
          "  role and cluster from DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER,\n"
          "  DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT (ps-lite's environment)\n"
          "  --size N        tensor bytes: 4MiB, 40MiB, 400MiB, 4096 ... (default 40MiB)\n"
          "  --seconds S     length of the timed run (default 1)\n"
          "  --warmup N      untimed iterations before it (default 1)\n"
          "  --reply copy    server answers pulls from a fresh copy of the store (default)\n"
          "  --reply zerocopy  server answers pulls with the stored memory itself\n"
          "  --op push-pull  worker: ZPush, wait, ZPull, wait (default)\n"
          "  --op pushpull   worker: one ZPushPull request, wait\n");
}

int ParseArgs(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      exit(0);
    }
    if (!v) {
      fprintf(stderr, "pslite_bench: %s needs a value (see --help)\n", a.c_str());
      return -1;
    }
    i++;
    if (a == "--size") {
      o->size = ParseSize(v);
      if (o->size == 0 || o->size % 4) {
        fprintf(stderr, "pslite_bench: --size %s is not a positive multiple of 4 bytes\n", v);
        return -1;
      }
    } else if (a == "--seconds") {
      o->seconds = atof(v);
      if (!(o->seconds > 0 && o->seconds <= 600)) {
        fprintf(stderr, "pslite_bench: --seconds is in (0, 600]\n");
        return -1;
      }
    } else if (a == "--warmup") {
      o->warmup = atoi(v);
      if (o->warmup < 0 || o->warmup > 1000) {
        fprintf(stderr, "pslite_bench: --warmup is 0..1000\n");
        return -1;
      }
    } else if (a == "--op") {
      std::string r = v;
      if (r == "push-pull") o->pushpull = false;
      else if (r == "pushpull") o->pushpull = true;
      else {
        fprintf(stderr, "pslite_bench: --op is push-pull or pushpull\n");
        return -1;
      }
    } else if (a == "--reply") {
      std::string r = v;
      if (r == "copy") o->zerocopy = false;
      else if (r == "zerocopy") o->zerocopy = true;
      else {
        fprintf(stderr, "pslite_bench: --reply is copy or zerocopy\n");
        return -1;
      }
    } else {
      fprintf(stderr, "pslite_bench: unknown option %s\n", a.c_str());
      Usage(stderr);
      return -1;
    }
  }
  return 0;
}

/* The summing server: one array per key, created (zeros) by the key's first push. */
class SumServer {
 public:
  explicit SumServer(bool zerocopy) : zerocopy_(zerocopy) {}

  void Handle(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
              ps::KVServer<float> *server) {
    size_t nkeys = req.keys.size();
    ps::KVPairs<float> res;
    CHECK_EQ(nkeys, 1u) << "the benchmark's worker sends one key per server";
    if (meta.push) {
      ps::SArray<float> &st = Stored(req.keys[0], req.vals.size());
      CHECK_EQ(st.size(), req.vals.size()) << "key " << req.keys[0] << " pushed with another length";
      const float *src = req.vals.data();
      float *dst = st.data();
      for (size_t j = 0, k = st.size(); j < k; j++) dst[j] += src[j];
    }
    if (meta.pull) {
      ps::SArray<float> &st = Stored(req.keys[0], 0);
      res.keys = req.keys;
      if (zerocopy_) {
        res.vals = st;                             /* shares the store: no copy */
      } else {
        res.vals.resize(st.size());                /* the stock handle: a fresh array... */
        memcpy(res.vals.data(), st.data(), st.size() * sizeof(float));   /* ...and a copy */
      }
    }
    server->Response(meta, res);
  }

 private:
  /* The array of key; created (zeros) with k values when it does not exist and k > 0. */
  ps::SArray<float> &Stored(ps::Key key, size_t k) {
    auto it = store_.find(key);
    if (it != store_.end()) return it->second;
    CHECK(k > 0) << "pull of key " << key << " before any push";
    return store_.emplace(key, ps::SArray<float>(k, 0.0f)).first->second;
  }

  bool zerocopy_;
  std::unordered_map<ps::Key, ps::SArray<float>> store_;
};

int RunWorker(const Options &o) {
  ps::KVWorker<float> kv(0, 0);
  const std::vector<ps::Range> &ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  size_t nserv = ranges.size();
  size_t elems = o.size / 4;
  if (elems < nserv) {
    fprintf(stderr, "pslite_bench: --size too small for %zu servers\n", nserv);
    return 1;
  }
  if (elems % nserv) {
    fprintf(stderr, "pslite_bench: --size is not %zu equal float slices\n", nserv);
    return 1;
  }
  /* One key per server, the first of its range, each with an equal slice. */
  std::vector<ps::Key> keys(nserv);
  for (size_t i = 0; i < nserv; i++) keys[i] = ranges[i].begin();
  ps::SArray<ps::Key> skeys(keys);
  ps::SArray<float> grad(elems, 0.0f), param(elems, 0.0f);
  for (size_t j = 0; j < elems; j++) grad[j] = 1e-3f;

  /* The pull waits for the push's reply: a server's customer thread takes requests from a
   * std::priority_queue, which does not keep the order of requests of equal priority, so a
   * pull sent right behind a push can be served before it (seen here with 2 servers + 2
   * workers). --op pushpull sends both in one request (ZPushPull) instead. */
  auto iteration = [&]() {
    if (o.pushpull) {
      kv.Wait(kv.ZPushPull(skeys, grad, &param));
    } else {
      kv.Wait(kv.ZPush(skeys, grad));
      kv.Wait(kv.ZPull(skeys, &param));
    }
  };
  for (int i = 0; i < o.warmup; i++) iteration();
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  double t0 = NowS(), deadline = t0 + o.seconds;
  long n = 0;
  while (NowS() < deadline) {
    iteration();
    n++;
  }
  double t1 = NowS();
  /* The pulled tensor holds the sum of every push (1e-3 each): with one worker exactly this
   * worker's count, with more at least as much. A wrong sum means a broken transfer. */
  double done = static_cast<double>(o.warmup + n) * 1e-3;
  bool ok = true;
  for (size_t j : {static_cast<size_t>(0), elems / 2, elems - 1}) {
    double v = param[j];
    if (ps::NumWorkers() == 1 ? std::fabs(v - done) > 1e-2 * done : v < 0.99 * done) ok = false;
  }
  printf("pslite_run rank=%d iterations=%ld t0=%.6f t1=%.6f size=%" PRIu64 " check=%s\n",
         ps::MyRank(), n, t0, t1, o.size, ok ? "ok" : "wrong-sum");
  if (!ok) fprintf(stderr, "pslite_bench: pulled values %g, %g, %g; pushed %g by this worker\n",
                   param[0], param[elems / 2], param[elems - 1], done);
  fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (ParseArgs(argc, argv, &o) < 0) return 2;
  const char *need[] = {"DMLC_ROLE", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI",
                        "DMLC_PS_ROOT_PORT"};
  for (const char *e : need) {
    if (!getenv(e)) {
      fprintf(stderr, "pslite_bench: %s is not set (ps-lite's environment, see --help)\n", e);
      return 2;
    }
  }
  ps::Start(0);
  int rc = 0;
  SumServer *handler = nullptr;
  ps::KVServer<float> *server = nullptr;
  if (ps::IsServer()) {
    handler = new SumServer(o.zerocopy);
    server = new ps::KVServer<float>(0);
    server->set_request_handle(
        [handler](const ps::KVMeta &m, const ps::KVPairs<float> &d, ps::KVServer<float> *s) {
          handler->Handle(m, d, s);
        });
  }
  if (ps::IsWorker()) rc = RunWorker(o);
  ps::Finalize(0, true);
  delete server;
  delete handler;
  return rc;
}
