/*
 * psctl's JSON on stdout: indented with two spaces, as kubectl's and jq's, not with cJSON's
 * tabs.
 */
#ifndef PSCTL_JSON_H
#define PSCTL_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>

/* root on f, indented by two spaces a level, then a newline; frees root (NULL: out of
 * memory, nothing printed). Returns 0, or -1 when it could not be printed. */
int psctl_json_print(FILE *f, cJSON *root);

#endif
