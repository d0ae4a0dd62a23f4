/*
 * TF_CONFIG, TensorFlow's JSON description of a cluster and of one task in it, read with
 * cJSON. Its host lists go through the same table checks as the file's (so an error reads the
 * same wherever the value came from), except that each list's shape is checked here first:
 * TF_CONFIG calls the worker list "worker", and errors about the JSON name what the user
 * wrote. The task's index cannot be checked yet: the lists may still change with --set.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_config_int.h"
#include "ts_err.h"

static int tf_hosts(ts_config_loader_t *ld, const cJSON *list, const char *json_name,
                    const char *key) {
  if (!cJSON_IsArray(list))
    return ts_config_fail(ld, json_name, "must be an array of \"host:port\" strings");
  size_t n = (size_t)cJSON_GetArraySize(list);
  const ts_config_def_t *d = ts_config_def_named(key);
  int rc = ts_config_check_count(ld, d, n);
  if (rc < 0) return rc;
  const char **items = ts_calloc(n ? n : 1, sizeof *items);
  if (!items) return ts_config_oom(ld, key);
  size_t i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, list) {
    if (!cJSON_IsString(e)) {
      ts_free(items);
      return ts_config_fail(ld, json_name, "entry %zu must be a \"host:port\" string", i);
    }
    items[i++] = e->valuestring;
  }
  rc = ts_config_set_strings(ld, d, items, n);
  ts_free(items);
  if (rc == 0) ts_config_note_origin(ld, d);
  return rc;
}

static int tf_task(ts_config_loader_t *ld, const cJSON *task) {
  if (!cJSON_IsObject(task))
    return ts_config_fail(ld, "task", "must be an object {\"type\":..., \"index\":...}");
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(task, "type");
  const cJSON *index = cJSON_GetObjectItemCaseSensitive(task, "index");
  ts_task_role_t role;
  if (cJSON_IsString(type) && strcmp(type->valuestring, "ps") == 0)
    role = TS_ROLE_PS;
  else if (cJSON_IsString(type) && strcmp(type->valuestring, "worker") == 0)
    role = TS_ROLE_WORKER;
  else if (cJSON_IsString(type))
    return ts_config_fail(ld, "task.type", "must be \"ps\" or \"worker\", not \"%.64s\"",
                          type->valuestring);
  else
    return ts_config_fail(ld, "task.type", "must be \"ps\" or \"worker\"");
  if (!cJSON_IsNumber(index) || index->valuedouble != floor(index->valuedouble) ||
      index->valuedouble < 0 || index->valuedouble >= TS_CONFIG_MAX_HOSTS)
    return ts_config_fail(ld, "task.index", "must be an integer in [0, %d]",
                          TS_CONFIG_MAX_HOSTS - 1);
  ld->cfg->task_role = role;
  ld->cfg->task_index = (int)index->valuedouble;
  snprintf(ld->task_origin, sizeof ld->task_origin, "%s", ld->where);
  return 0;
}

int ts_tfconfig_apply(ts_config_loader_t *ld, const char *tf) {
  snprintf(ld->where, sizeof ld->where, "TF_CONFIG");
  const char *p = tf;
  while (isspace((unsigned char)*p)) p++;
  if (*p == '\0') return 0; /* TF_CONFIG= in a shell: as good as unset */
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(tf, &end, 1);
  if (!root)
    return ts_config_fail(ld, NULL, "not valid JSON (at byte %td)", end ? end - tf : (ptrdiff_t)0);
  int rc = 0;
  if (!cJSON_IsObject(root)) {
    rc = ts_config_fail(ld, NULL, "must be a JSON object {\"cluster\":{...},\"task\":{...}}");
    goto done;
  }
  /* Other top-level members (environment, rpc_layer) are TensorFlow's own; ignored. */
  const cJSON *cluster = cJSON_GetObjectItemCaseSensitive(root, "cluster");
  if (cluster) {
    if (!cJSON_IsObject(cluster)) {
      rc = ts_config_fail(ld, "cluster", "must be an object {\"ps\":[...],\"worker\":[...]}");
      goto done;
    }
    const cJSON *job;
    cJSON_ArrayForEach(job, cluster) {
      if (strcmp(job->string, "ps") == 0)
        rc = tf_hosts(ld, job, "cluster.ps", "cluster.ps");
      else if (strcmp(job->string, "worker") == 0)
        rc = tf_hosts(ld, job, "cluster.worker", "cluster.workers");
      else /* a chief or evaluator would silently never be started */
        rc = ts_config_fail(
            ld, NULL, "cluster.%.64s: Tessera runs only \"ps\" and \"worker\" tasks", job->string);
      if (rc < 0) goto done;
    }
  }
  const cJSON *task = cJSON_GetObjectItemCaseSensitive(root, "task");
  if (task) rc = tf_task(ld, task);
done:
  cJSON_Delete(root);
  return rc;
}
