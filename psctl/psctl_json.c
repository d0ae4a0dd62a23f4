/* psctl's JSON (psctl_json.h). cJSON's own formatter indents with tabs and keeps an
 * array's objects on the line of its '[', so the layout is ours (that of jq and Python's
 * json.dumps(indent=2)); every scalar and key is still written by cJSON, so numbers and
 * string escapes stay cJSON's. */
#include "psctl_json.h"

#include <stdbool.h>

/* An item's value alone, as cJSON writes it unformatted. */
static int scalar(FILE *f, const cJSON *item) {
  char *s = cJSON_PrintUnformatted(item);
  if (!s) return -1;
  fputs(s, f);
  cJSON_free(s);
  return 0;
}

static int key(FILE *f, const char *name) {
  cJSON *k = cJSON_CreateString(name);
  int rc = k ? scalar(f, k) : -1;
  cJSON_Delete(k);
  return rc;
}

static int value(FILE *f, const cJSON *item, int depth) {
  bool object = cJSON_IsObject(item);
  if (!object && !cJSON_IsArray(item)) return scalar(f, item);
  if (!item->child) {
    fputs(object ? "{}" : "[]", f);
    return 0;
  }
  fputc(object ? '{' : '[', f);
  for (const cJSON *c = item->child; c; c = c->next) {
    fprintf(f, "\n%*s", 2 * (depth + 1), "");
    if (object) {
      if (key(f, c->string ? c->string : "") < 0) return -1;
      fputs(": ", f);
    }
    if (value(f, c, depth + 1) < 0) return -1;
    if (c->next) fputc(',', f);
  }
  fprintf(f, "\n%*s%c", 2 * depth, "", object ? '}' : ']');
  return 0;
}

int psctl_json_print(FILE *f, cJSON *root) {
  int rc = root ? value(f, root, 0) : -1;
  if (rc == 0) fputc('\n', f);
  cJSON_Delete(root);
  return rc;
}
