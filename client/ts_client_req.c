/* Requests (include/tessera/client.h): ts_client_req_init, ts_client_submit, ts_client_wait
 * and ts_client_run. A request is checked and turned into an op here, on the caller's
 * thread; the client thread (ts_client_ops.c) runs it and fills in the results. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_client_int.h"
#include "ts_err.h"

void ts_client_req_init(ts_client_req_t *req, ts_client_req_kind_t kind) {
  if (!req) return;
  memset(req, 0, sizeof *req);
  req->struct_size = (uint32_t)sizeof *req;
  req->kind = kind;
}

/* A request's size before the table fields (a caller built against that header): such a
 * caller may submit every dense kind. */
#define REQ_V1_SIZE offsetof(ts_client_req_t, table)
/* ... and before sparse_flags: such a caller may submit every kind, its flags are 0. */
#define REQ_V2_SIZE offsetof(ts_client_req_t, sparse_flags)

static bool size_known(const ts_client_req_t *req) {
  return req->struct_size == sizeof *req || req->struct_size == REQ_V1_SIZE ||
         req->struct_size == REQ_V2_SIZE;
}

static bool sparse_kind(ts_client_req_kind_t kind) {
  return kind == TS_CLIENT_SPARSE_PULL || kind == TS_CLIENT_SPARSE_PUSH ||
         kind == TS_CLIENT_SPARSE_PUSH_PULL;
}

static int req_state(const ts_client_req_t *req) {
  return __atomic_load_n(&req->priv_state, __ATOMIC_ACQUIRE);
}

/* Refuse req: nothing was sent. */
static int refuse(ts_client_req_t *req, int rc, const char *why) {
  req->rc = rc;
  bool both = req->kind == TS_CLIENT_PUSH_PULL || req->kind == TS_CLIENT_SPARSE_PUSH_PULL;
  req->push_rc = req->pull_rc = both ? rc : 0;
  req->applied = req->accumulated = req->stale = req->duplicate = req->version = 0;
  req->push_id = 0;
  snprintf(req->errmsg, sizeof req->errmsg, "%s", why);
  __atomic_store_n(&req->priv_state, TS_CL_REQ_IDLE, __ATOMIC_RELEASE);
  return rc;
}

/* The elements [first, last) byte range of tensor t's buffer. */
static void tensor_range(const ts_plan_t *plan, uint32_t t, const void *base, uintptr_t *b0,
                         uintptr_t *b1) {
  uint64_t elems = 0;
  if (plan->tensor_parts[t]) {
    const ts_part_t *last = &plan->parts[plan->tensor_first[t] + plan->tensor_parts[t] - 1];
    elems = last->offset + last->count;
  }
  *b0 = (uintptr_t)base;
  *b1 = *b0 + elems * sizeof(float);
}

/* Whether any covered tensor's grad range overlaps any covered tensor's dst range.
 * Compared as integers: the buffers are distinct objects. */
static bool buffers_overlap(const ts_plan_t *plan, const bool *covered, const float *const *grad,
                            float *const *dst) {
  for (uint32_t t = 0; t < plan->num_tensors; t++) {
    if (!covered[t]) continue;
    uintptr_t g0, g1;
    tensor_range(plan, t, grad[t], &g0, &g1);
    for (uint32_t u = 0; u < plan->num_tensors; u++) {
      if (!covered[u]) continue;
      uintptr_t d0, d1;
      tensor_range(plan, u, dst[u], &d0, &d1);
      if (g0 < d1 && d0 < g1) return true;
    }
  }
  return false;
}

/* The op's subset (plan indices) from req's tensors or parts, and which tensors it covers.
 * Returns 0, or TS_EINVAL with why (a static string) set. */
static int make_subset(const ts_plan_t *plan, const ts_client_req_t *req, ts_cl_op_t *op,
                       bool *covered, const char **why) {
  bool whole = !req->tensors && !req->parts;
  if (whole) {
    for (uint32_t t = 0; t < plan->num_tensors; t++) covered[t] = true;
    return 0;
  }
  if (req->tensors && req->parts) {
    *why = "give tensors or parts, not both";
    return TS_EINVAL;
  }
  size_t n = 0;
  if (req->tensors) {
    if (req->num_tensors == 0) {
      *why = "an empty tensor list";
      return TS_EINVAL;
    }
    for (size_t i = 0; i < req->num_tensors; i++) {
      if (req->tensors[i] >= plan->num_tensors) {
        *why = "a tensor index out of range";
        return TS_EINVAL;
      }
      if (covered[req->tensors[i]]) {
        *why = "a tensor listed twice";
        return TS_EINVAL;
      }
      covered[req->tensors[i]] = true;
      n += plan->tensor_parts[req->tensors[i]];
    }
  } else {
    if (req->num_parts == 0) {
      *why = "an empty partition list";
      return TS_EINVAL;
    }
    n = req->num_parts;
  }
  op->parts = ts_malloc((n ? n : 1) * sizeof *op->parts);
  bool *seen = ts_calloc(plan->num_parts ? plan->num_parts : 1, sizeof *seen);
  if (!op->parts || !seen) {
    ts_free(seen);
    *why = "out of memory";
    return TS_ENOMEM;
  }
  op->nparts = 0;
  if (req->tensors) {
    for (size_t i = 0; i < req->num_tensors; i++) {
      uint32_t t = req->tensors[i];
      for (uint32_t k = 0; k < plan->tensor_parts[t]; k++)
        op->parts[op->nparts++] = plan->tensor_first[t] + k;
    }
  } else {
    for (size_t i = 0; i < req->num_parts; i++) {
      size_t k = req->parts[i];
      if (k >= plan->num_parts || seen[k]) {
        ts_free(seen);
        *why = k >= plan->num_parts ? "a partition index out of range" : "a partition listed twice";
        return TS_EINVAL;
      }
      seen[k] = true;
      covered[plan->parts[k].tensor] = true;
      op->parts[op->nparts++] = k;
    }
  }
  ts_free(seen);
  return 0;
}

static int check_buffers(const ts_plan_t *plan, const ts_client_req_t *req, const bool *covered,
                         const char **why) {
  bool pull = req->kind == TS_CLIENT_PULL || req->kind == TS_CLIENT_PUSH_PULL;
  bool push = req->kind != TS_CLIENT_PULL;
  if ((pull && !req->dst) || (push && !req->grad)) {
    *why = pull && !req->dst ? "no dst for the pull" : "no grad for the push";
    return TS_EINVAL;
  }
  for (uint32_t t = 0; t < plan->num_tensors; t++) {
    if (!covered[t]) continue;
    if ((pull && !req->dst[t]) || (push && !req->grad[t])) {
      *why = "a covered tensor has no buffer";
      return TS_EINVAL;
    }
  }
  if (req->kind == TS_CLIENT_PUSH_PULL && buffers_overlap(plan, covered, req->grad, req->dst)) {
    *why = "the gradients and the pull's destination overlap";
    return TS_EINVAL;
  }
  return 0;
}

static int hand_over(ts_client_t *c, ts_client_req_t *req, ts_cl_op_t *op, ts_client_done_fn cb,
                     void *arg);

/* A dense request's subset and buffers into op. Returns 0, or an error with why set. */
static int prepare_dense(ts_client_t *c, const ts_client_req_t *req, ts_cl_op_t *op,
                         const char **why) {
  const ts_plan_t *plan = &c->plan;
  bool *covered = ts_calloc(plan->num_tensors, sizeof *covered);
  if (!covered) return TS_ENOMEM;
  int rc = make_subset(plan, req, op, covered, why);
  if (rc == 0) rc = check_buffers(plan, req, covered, why);
  ts_free(covered);
  op->dst = req->dst;
  op->grad = req->grad;
  return rc;
}

int ts_client_submit(ts_client_t *c, ts_client_req_t *req, ts_client_done_fn cb, void *arg) {
  if (!req) return TS_EINVAL;
  if (!size_known(req)) {
    /* Not ours to write into: its layout is unknown. */
    return TS_EINVAL;
  }
  /* Claim the request first: of two threads submitting it at once, one gets EBUSY. */
  int state = req_state(req);
  if ((state != TS_CL_REQ_IDLE && state != TS_CL_REQ_DONE) ||
      !__atomic_compare_exchange_n(&req->priv_state, &state, TS_CL_REQ_SUBMITTING, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return TS_EBUSY;
  if (!c) return refuse(req, TS_EINVAL, "no client");
  ts_client_req_kind_t k = req->kind;
  /* A table's request (TS_CLIENT_SPARSE_*): its keys sorted and split here, on the
   * caller's thread (ts_client_sparse.c). */
  bool sparse = sparse_kind(k);
  if (sparse && req->struct_size < REQ_V2_SIZE)
    return refuse(req, TS_EINVAL, "a table's request from a caller built without tables");
  if (!sparse && k != TS_CLIENT_PULL && k != TS_CLIENT_PUSH && k != TS_CLIENT_PUSH_PULL &&
      k != TS_CLIENT_ASSIGN && k != TS_CLIENT_ASSIGN_INITIAL)
    return refuse(req, TS_EINVAL, "unknown request kind");
  if (!sparse && !c->plan.parts) return refuse(req, TS_ENOTDECLARED, "declare the model first");
  bool push = k != TS_CLIENT_PULL && k != TS_CLIENT_SPARSE_PULL;
  bool pull = k == TS_CLIENT_PULL || k == TS_CLIENT_PUSH_PULL || k == TS_CLIENT_SPARSE_PULL ||
              k == TS_CLIENT_SPARSE_PUSH_PULL;
  if (push && req->retry_of > atomic_load(&c->last_push_id))
    return refuse(req, TS_EINVAL, "retry_of is not the push_id of a push of this client");
  ts_cl_op_t *op = ts_calloc(1, sizeof *op);
  const char *why = "out of memory";
  int rc = !op     ? TS_ENOMEM
           : sparse ? ts_cl_sparse_prepare(c, req, op, &why)
                    : prepare_dense(c, req, op, &why);
  /* What a pull takes becomes each shard's last pulled version only when the whole request
   * succeeds, so a retry after a failure asks for the same versions (client.h). */
  if (rc == 0 && pull && !(op->stage = ts_calloc(c->n, sizeof *op->stage))) {
    rc = TS_ENOMEM;
    why = "out of memory";
  }
  if (rc < 0) {
    ts_cl_free_op(op);
    return refuse(req, rc, why);
  }
  op->kind = !push ? OP_PULL : pull ? OP_PUSH_PULL : OP_PUSH;
  op->push_kind = k == TS_CLIENT_ASSIGN           ? TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN
                  : k == TS_CLIENT_ASSIGN_INITIAL ? TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN_INITIAL
                                                  : TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT;
  return hand_over(c, req, op, cb, arg);
}

/* Fill in op's common fields from req and hand it to the client thread. */
static int hand_over(ts_client_t *c, ts_client_req_t *req, ts_cl_op_t *op, ts_client_done_fn cb,
                     void *arg) {
  bool push = op->kind != OP_PULL;
  op->wait_ready = true;
  op->timeout_s = req->timeout_s > 0 ? req->timeout_s : c->timeout_s;
  /* a deadline in ms fits the wire's u32 (SparsePull.timeout_ms) and the clock's u64 */
  if (!(op->timeout_s <= TS_CL_MAX_TIMEOUT_S)) op->timeout_s = TS_CL_MAX_TIMEOUT_S;
  op->req = req;
  op->cb = cb;
  op->cb_arg = arg;
  op->step = req->step;
  op->min_version = req->min_version;
  op->clock = req->clock;
  op->push_id = push ? req->retry_of : 0;
  req->rc = 0;
  req->push_rc = req->pull_rc = 0;
  req->applied = req->accumulated = req->stale = req->duplicate = req->version = 0;
  req->push_id = 0;
  req->errmsg[0] = 0;
  if (op->sp) req->rows_filtered = 0;
  __atomic_store_n(&req->priv_state, cb ? TS_CL_REQ_INFLIGHT_CB : TS_CL_REQ_INFLIGHT,
                   __ATOMIC_RELEASE);
  if (ts_cl_enqueue(c, op) < 0) {
    ts_cl_free_op(op);
    /* A thread may already wait for it (it saw INFLIGHT): wake it, under the mutex its
     * wait sleeps on, to find the refusal. */
    uv_mutex_lock(&c->mu);
    int rc = refuse(req, TS_ESHUTDOWN, c->interrupted ? "interrupted" : "client closed");
    uv_cond_broadcast(&c->cv);
    uv_mutex_unlock(&c->mu);
    return rc;
  }
  return 0;
}

/* Done, or refused after a waiter saw it in flight (its submit found the client closing). */
static bool req_done(void *arg) {
  int state = req_state(arg);
  return state == TS_CL_REQ_DONE || state == TS_CL_REQ_IDLE;
}

int ts_client_wait(ts_client_t *c, ts_client_req_t *req) {
  if (!c || !req || !size_known(req)) return TS_EINVAL;
  int state = req_state(req);
  if (state == TS_CL_REQ_DONE) return req->rc;
  if (state != TS_CL_REQ_INFLIGHT) return TS_EINVAL; /* never submitted, or has a callback */
  if (ts_cl_on_client_thread(c)) return TS_EINVAL;
  ts_cl_wait_flag(c, req_done, req);
  return req->rc;
}

int ts_client_run(ts_client_t *c, ts_client_req_t *req) {
  if (c && req && size_known(req) && ts_cl_on_client_thread(c)) {
    int state = req_state(req);
    if (state != TS_CL_REQ_IDLE && state != TS_CL_REQ_DONE) return TS_EBUSY;
    return refuse(req, TS_EINVAL, "a blocking call cannot be made on the client thread");
  }
  int rc = ts_client_submit(c, req, NULL, NULL);
  if (rc < 0) return rc;
  return ts_client_wait(c, req);
}
