/*
 * psctl COMMAND --watch: the command's view again every interval until SIGINT (Ctrl-C) or
 * SIGTERM. On a terminal each refresh is drawn in place, as watch(1) and `kubectl get -w`
 * do on a screen: the cursor goes home, the screen below it is cleared and the frame is
 * written, all in one write, so nothing scrolls and nothing flickers; the cursor is
 * hidden meanwhile. Elsewhere (a file, a pipe) the frames follow one another, separated
 * by an empty line.
 */
#ifndef PSCTL_WATCH_H
#define PSCTL_WATCH_H

#include <stdbool.h>
#include <stdio.h>

/* Start watching on f (stdout): catch SIGINT and SIGTERM (they end the watch, and the
 * command exits 0), buffer f fully so that a frame is written at once, hide the cursor
 * when tty. */
void psctl_watch_begin(FILE *f, bool tty);

/* Before frame n (0, 1, ...): on a terminal, cursor home and clear to the end of the
 * screen; elsewhere an empty line before
 * every frame but the first. Then, when title is not NULL (the table forms), the header
 * "Every 2.0s: psctl status  (Ctrl-C to stop)  2026-12-02 11:20:01 UTC". */
void psctl_watch_frame_begin(FILE *f, bool tty, unsigned n, const char *title, double interval);

/* After a frame: writes it out. Returns false once f cannot be written (a closed pipe):
 * the watch ends. */
bool psctl_watch_frame_end(FILE *f);

/* Waits seconds; returns false at once when a signal ended the watch (then too). */
bool psctl_watch_sleep(double seconds);

/* Whether SIGINT or SIGTERM ended the watch. */
bool psctl_watch_stopped(void);

/* After the last frame: the cursor shown again. */
void psctl_watch_end(FILE *f, bool tty);

#endif
