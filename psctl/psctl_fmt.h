/* psctl's number formats, shared by its tables. */
#ifndef PSCTL_FMT_H
#define PSCTL_FMT_H

#include <stddef.h>

/* b bytes for a person: "512 B", "1.5 KiB", ... "2.0 TiB". */
void psctl_human_bytes(char *buf, size_t n, double b);

#endif
