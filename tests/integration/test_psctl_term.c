/* psctl's kubectl habits against real shards: --watch redrawn in place on a terminal
 * (a pty made by util-linux's script(1), its byte stream checked) and as separate blocks
 * elsewhere, both ended by SIGINT with exit 0; JSON indented by two spaces; "did you
 * mean" for commands and options; -w as --watch; the bash and zsh completion scripts
 * run in the real shells and compared with psctl's own --help. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char out[1 << 17], err[1 << 16];

/* psctl with exactly these arguments (NULL-terminated). */
static int psctl_args(const char *const *args) {
  return ts_run_psctl(args, out, sizeof out, err, sizeof err);
}

/* Runs argv with stdout into out_path (stderr into err_path); returns its pid. */
static pid_t spawn(const char *const *argv, const char *out_path, const char *err_path) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fi = open("/dev/null", O_RDONLY);
    if (fo < 0 || fe < 0 || fi < 0) _exit(127);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* Its exit status within timeout_s (killed and failed after that). */
static int wait_exit(pid_t pid, double timeout_s) {
  double end = ts_now_s() + timeout_s;
  int st;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ts_now_s() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      fail_msg("pid %d did not exit within %.0f s", (int)pid, timeout_s);
    }
    ts_sleep_ms(50);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* Waits (up to 60 s: the machine may be busy) until path holds `want` copies of needle;
 * returns the file's text (free it). */
static char *wait_for_copies(const char *path, const char *needle, size_t want) {
  double end = ts_now_s() + 60;
  for (;;) {
    char *text = ts_read_file(path);
    if (text && count(text, needle) >= want) return text;
    if (ts_now_s() > end) fail_msg("%s: fewer than %zu '%s' in 60 s:\n%s", path, want, needle, text ? text : "");
    free(text);
    ts_sleep_ms(100);
  }
}

#define HOME_CLEAR "\033[H\033[J"

/* On a terminal: every refresh starts with cursor home + clear to the end of the screen
 * and is the same number of lines, fewer than a screen's 24, so nothing ever scrolls; the
 * cursor is hidden meanwhile and shown again after SIGINT, which ends psctl with 0. */
static void test_watch_terminal(void **state) {
  (void)state;
  if (access("/usr/bin/script", X_OK) != 0) TS_SKIP("no script(1) (apt-get install bsdutils)");
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, NULL), 0);
  char ts_path[400], pid_path[400], so[400], se[400], inner[1200];
  snprintf(ts_path, sizeof ts_path, "%s/typescript", c.dir);
  snprintf(pid_path, sizeof pid_path, "%s/psctl.pid", c.dir);
  snprintf(so, sizeof so, "%s/script.out", c.dir);
  snprintf(se, sizeof se, "%s/script.err", c.dir);
  snprintf(inner, sizeof inner, "echo $$ > '%s'; exec '%s' -c '%s' status --watch --interval 0.3",
           pid_path, ts_psctl_path, c.config);
  setenv("TERM", "xterm", 1);
  unsetenv("NO_COLOR");
  /* -f: each write of psctl reaches the typescript at once; -e: script exits with psctl's
   * status; -q: no "Script started" line on stdout. */
  const char *argv[] = {"script", "-q", "-e", "-f", "-c", inner, ts_path, NULL};
  pid_t pid = spawn(argv, so, se);
  char *text = wait_for_copies(ts_path, HOME_CLEAR, 3);
  free(text);
  char *pid_text = ts_read_file(pid_path);
  assert_non_null(pid_text);
  pid_t inner_pid = (pid_t)atoi(pid_text);
  free(pid_text);
  assert_true(inner_pid > 0);
  assert_int_equal(kill(inner_pid, SIGINT), 0);
  int rc = wait_exit(pid, 30);
  text = ts_read_file(ts_path);
  assert_non_null(text);
  if (rc != 0) fail_msg("script/psctl exit %d:\n%s", rc, text);

  /* The typescript opens with script's own header line: the stream starts after it. */
  const char *stream = strstr(text, "\033[?25l");
  assert_non_null(stream);
  const char *first = strstr(stream, HOME_CLEAR);
  assert_ptr_equal(first, stream + strlen("\033[?25l")); /* nothing before the first frame */
  size_t frames = count(stream, HOME_CLEAR);
  assert_true(frames >= 3);
  const char *tail = strstr(stream, "\033[?25h"); /* the cursor back after the last frame */
  assert_non_null(tail);
  int lines = -1;
  size_t seen = 0;
  for (const char *f = first; f && f < tail; seen++) {
    f += strlen(HOME_CLEAR);
    const char *next = strstr(f, HOME_CLEAR);
    const char *end = next && next < tail ? next : tail;
    char frame[8192];
    size_t len = (size_t)(end - f) < sizeof frame - 1 ? (size_t)(end - f) : sizeof frame - 1;
    memcpy(frame, f, len);
    frame[len] = 0;
    static const char header[] = "Every 0.3s: psctl status  (Ctrl-C to stop)  ";
    if (strncmp(frame, header, strlen(header)) != 0)
      fail_msg("frame %zu does not start with the header:\n%s", seen, frame);
    assert_non_null(strstr(frame, c.addr[0]));
    assert_non_null(strstr(frame, c.addr[1]));
    assert_null(strstr(frame, "\033[?25")); /* the cursor is shown only at the end */
    int n = (int)count(frame, "\n");
    if (lines < 0) lines = n;
    if (n != lines) fail_msg("frame %zu has %d lines, the first %d:\n%s", seen, n, lines, frame);
    f = next && next < tail ? next : NULL;
  }
  assert_int_equal(seen, frames);
  assert_true(lines > 5 && lines < 24);
  free(text);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Not a terminal: blocks one after another, an empty line between them, no escape codes;
 * the watch goes on while a shard goes down (and says so in the block) and SIGINT ends
 * it with exit 0. With -o json each refresh is one JSON value. */
static void test_watch_pipe(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, NULL), 0);
  char so[400], se[400];
  snprintf(so, sizeof so, "%s/watch.out", c.dir);
  snprintf(se, sizeof se, "%s/watch.err", c.dir);
  const char *argv[] = {ts_psctl_path, "-c", c.config, "shards", "-w", "--interval", "0.2", NULL};
  pid_t pid = spawn(argv, so, se);
  free(wait_for_copies(so, "Every 0.2s: psctl shards", 2));
  ts_cluster_signal(&c, 1, SIGKILL);
  free(wait_for_copies(so, " NO ", 1));
  kill(pid, SIGINT);
  assert_int_equal(wait_exit(pid, 30), 0);
  char *text = ts_read_file(so);
  assert_non_null(text);
  assert_null(strchr(text, '\033'));
  assert_int_equal(strncmp(text, "Every 0.2s: psctl shards", 24), 0);
  size_t blocks = count(text, "Every 0.2s: psctl shards");
  assert_int_equal(count(text, "\n\nEvery 0.2s: psctl shards"), blocks - 1);
  assert_null(strstr(text, "\n\n\n"));
  free(text);

  /* JSON: one array per refresh, each parsing whole. */
  const char *jargv[] = {ts_psctl_path, "-c", c.config, "-o", "json", "shards", "--watch",
                         "--interval", "0.2", NULL};
  pid = spawn(jargv, so, se);
  free(wait_for_copies(so, "\n]\n", 3));
  kill(pid, SIGINT);
  assert_int_equal(wait_exit(pid, 30), 0);
  text = ts_read_file(so);
  const char *p = text;
  int values = 0;
  while (*p) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(p, &end, false);
    if (!j) fail_msg("not a JSON value at offset %zu:\n%s", (size_t)(p - text), p);
    assert_true(cJSON_IsArray(j));
    assert_int_equal(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    values++;
    p = end;
    while (*p == '\n') p++;
  }
  assert_true(values >= 3);
  free(text);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* JSON is indented by two spaces, as jq and kubectl print it: no tab anywhere, an array's
 * objects on lines of their own. */
static void test_json_two_spaces(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  const char *const st[] = {"-c", c.config, "-o", "json", "status", NULL};
  assert_int_equal(psctl_args(st), 0);
  assert_null(strchr(out, '\t'));
  assert_int_equal(strncmp(out, "{\n  \"mode\": \"", 13), 0);
  assert_non_null(strstr(out, "\n  \"shards\": [\n    {\n      \"index\": 0,\n"));
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  cJSON_Delete(j);
  const char *const sh[] = {"-c", c.config, "-o", "json", "shards", NULL};
  assert_int_equal(psctl_args(sh), 0);
  assert_int_equal(strncmp(out, "[\n  {\n    \"index\": 0,\n", 22), 0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Unknown commands and options: the nearest known one, or the list when none is near;
 * -w is --watch now, so `-w json` says where the output format went; --watch only where
 * the command takes it. No shard is needed. */
static void test_did_you_mean(void **state) {
  (void)state;
  static const struct {
    const char *args[4];
    const char *want;
  } cases[] = {
      {{"stauts", NULL}, "unknown command 'stauts'; did you mean 'status'?"},
      {{"wokers", NULL}, "did you mean 'workers'?"},
      {{"chekpoint", NULL}, "did you mean 'checkpoint'?"},
      {{"help", "shrads", NULL}, "unknown command 'shrads'; did you mean 'shards'?"},
      {{"compl", NULL}, "did you mean 'completion'?"},
      {{"status", "--ouptut=json", NULL}, "unknown option '--ouptut=json'; did you mean '--output'?"},
      {{"status", "--wacth", NULL}, "did you mean '--watch'?"},
      {{"frobnicate", NULL}, "unknown command 'frobnicate' (status, shards, workers,"},
      {{"-w", "json", "status", NULL}, "-w is --watch now; the output format is -o json"},
      {{"health", "--watch", NULL}, "health has no --watch"},
      {{"status", "--interval", "1", NULL}, "--interval goes with --watch"},
      {{"completion", "fish", NULL}, "completion takes bash or zsh, not 'fish'"},
      {{"completion", NULL}, "completion takes one shell"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = psctl_args(cases[i].args);
    if (rc != 2 || !strstr(err, cases[i].want))
      fail_msg("psctl %s %s: exit %d, stderr '%s', want '%s'", cases[i].args[0],
               cases[i].args[1] ? cases[i].args[1] : "", rc, err, cases[i].want);
  }
  const char *const far[] = {"xyzzy", NULL};
  assert_int_equal(psctl_args(far), 2);
  assert_null(strstr(err, "did you mean"));
  /* The help says what -w and -o are now. */
  const char *const help[] = {"--help", NULL};
  assert_int_equal(psctl_args(help), 0);
  assert_non_null(strstr(out, "  -o, --output FORMAT "));
  assert_null(strstr(out, "-w, --output"));
  const char *const status_help[] = {"status", "--help", NULL};
  assert_int_equal(psctl_args(status_help), 0);
  assert_non_null(strstr(out, "  -w, --watch "));
}

/* The commands psctl --help lists, space-separated, into buf. */
static void help_commands(char *buf, size_t n) {
  const char *const h[] = {"--help", NULL};
  assert_int_equal(psctl_args(h), 0);
  const char *p = strstr(out, "Commands:\n");
  assert_non_null(p);
  p += strlen("Commands:\n");
  buf[0] = 0;
  while (strncmp(p, "  ", 2) == 0) {
    size_t len = strcspn(p + 2, " \n");
    size_t used = strlen(buf);
    snprintf(buf + used, n - used, "%s%.*s", used ? " " : "", (int)len, p + 2);
    p = strchr(p, '\n');
    if (!p) break;
    p++;
  }
}

/* Completion in shell against the driver lines of `driver` (one case per line); the
 * shell's output, one line per case, into out. */
static void run_shell(const char *shell, const char *script_path, const char *driver) {
  const char *argv[] = {shell, "-f", "-c", driver, shell, script_path, NULL};
  if (strcmp(shell, "/bin/bash") == 0) argv[1] = "--norc";
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("%s: exit %d: %s", shell, rc, err);
  assert_string_equal(err, "");
}

/* The expected completions, one line per case of the drivers below. */
static void check_lines(const char *shell, const char *commands) {
  char want[4096];
  snprintf(want, sizeof want,
           "%s\n"                                                   /* psctl '' */
           "status shards shutdown\n"                               /* psctl s */
           "--config --set --output --timeout --shard --help --version --watch --interval\n"
           "--config --set --output --timeout --shard --help --version --interval\n" /* tables -- */
           "--config --set --output --timeout --shard --help --version --no-checkpoint\n"
           "table json\n"                                           /* -o '' */
           "reset\n"                                                /* model '' */
           "\n"                                                     /* model reset '' */
           "bash zsh\n"                                             /* completion '' */
           "workers\n"                                              /* help wo */
           "health help\n",                                         /* -c F --timeout 2 he */
           commands);
  if (strcmp(out, want) != 0) fail_msg("%s completion:\n%s\nwanted:\n%s", shell, out, want);
}

#define CASES(T)                                                                          \
  T " psctl ''\n" T " psctl s\n" T " psctl status --\n" T " psctl -c x.cfg tables --\n" T \
    " psctl shutdown --\n" T " psctl -o ''\n" T " psctl model ''\n" T " psctl model reset ''\n" T \
    " psctl completion ''\n" T " psctl help wo\n" T " psctl -c x.cfg --timeout 2 he\n"

/* psctl completion bash, sourced into bash and run as bash runs it (COMP_WORDS,
 * COMP_CWORD, then _psctl): every command psctl --help lists, each command's own options
 * after the global ones, the values of -o, fixed words. */
static void test_completion_bash(void **state) {
  (void)state;
  char commands[1024];
  help_commands(commands, sizeof commands);
  assert_non_null(strstr(commands, "completion"));
  char path[] = "/tmp/tessera-completion-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *const gen[] = {"completion", "bash", NULL};
  assert_int_equal(psctl_args(gen), 0);
  assert_int_equal(write(fd, out, strlen(out)), (ssize_t)strlen(out));
  close(fd);
  run_shell("/bin/bash",
            path,
            "source \"$1\" || exit 1\n"
            "t() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _psctl;"
            " echo \"${COMPREPLY[*]}\"; }\n"
            "complete -p psctl >/dev/null || exit 1\n" CASES("t"));
  unlink(path);
  check_lines("bash", commands);
}

/* psctl completion zsh: zsh -n accepts it, and its _psctl, run with zsh's completion
 * builtins stood in for by functions that print what they are given, offers what the
 * bash one does. Skips without zsh. */
static void test_completion_zsh(void **state) {
  (void)state;
  if (access("/usr/bin/zsh", X_OK) != 0 && access("/bin/zsh", X_OK) != 0)
    TS_SKIP("no zsh (apt-get install zsh): the zsh completion script is not checked");
  char commands[1024];
  help_commands(commands, sizeof commands);
  char path[] = "/tmp/tessera-completion-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *const gen[] = {"completion", "zsh", NULL};
  assert_int_equal(psctl_args(gen), 0);
  assert_int_equal(strncmp(out, "#compdef psctl\n", 15), 0);
  assert_int_equal(write(fd, out, strlen(out)), (ssize_t)strlen(out));
  close(fd);
  const char *zsh = access("/usr/bin/zsh", X_OK) == 0 ? "/usr/bin/zsh" : "/bin/zsh";
  const char *const syntax[] = {zsh, "-n", path, NULL};
  assert_int_equal(ts_run_capture(syntax, out, sizeof out, err, sizeof err), 0);
  run_shell(zsh, path,
            "registered=\n"
            "compdef() { registered=\"$*\"; }\n"
            "source \"$1\" || exit 1\n"
            "[[ $registered == '_psctl psctl' ]] || exit 1\n"
            /* zsh keeps what starts with the word being completed: so do these */
            "offer() { local x; for x in \"$@\"; do [[ $x == ${words[CURRENT]}* ]] &&"
            " print -rn -- \"$x \"; done; }\n"
            "compadd() { [[ $1 == -- ]] && shift; offer \"$@\"; }\n"
            "_describe() { local -a a; a=(\"${(@P)4}\"); offer \"${a[@]%%:*}\"; }\n"
            "_files() { print -rn -- 'FILES '; }\n"
            "t() { words=(\"$@\"); CURRENT=$#; _psctl; print; }\n" CASES("t"));
  /* Each case printed its words with a space after each: drop those before comparing. */
  char *w = out;
  for (char *r = out; *r; r++)
    if (!(*r == ' ' && (r[1] == '\n' || r[1] == ' '))) *w++ = *r;
  *w = 0;
  unlink(path);
  check_lines("zsh", commands);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watch_terminal),  cmocka_unit_test(test_watch_pipe),
      cmocka_unit_test(test_json_two_spaces), cmocka_unit_test(test_did_you_mean),
      cmocka_unit_test(test_completion_bash), cmocka_unit_test(test_completion_zsh),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
