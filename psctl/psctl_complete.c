/* psctl's shell completion (psctl_complete.h). Both scripts work alike: find the command
 * (the first word that is not an option or an option's value), then offer the values of
 * the option just typed, options (global ones and the command's), the commands, or the
 * command's fixed words (model reset, completion bash|zsh, help COMMAND). */
#include "psctl_complete.h"

#include <ctype.h>
#include <string.h>

#include "ts_build_config.h"

#define WORDS 1024 /* room for every command's options or words, with their short forms */

static const struct option *by_short(const psctl_options_t *o, int c) {
  for (const struct option *p = o->longopts; p->name; p++)
    if (p->flag == NULL && p->val == c) return p;
  return NULL;
}

static const struct option *by_long(const psctl_options_t *o, const char *name) {
  for (const struct option *p = o->longopts; p->name; p++)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

static bool is_short(int c) { return c > 0 && c < 128 && isalpha(c); }

static void add(char *buf, size_t n, const char *word) {
  size_t len = strlen(buf);
  snprintf(buf + len, n - len, "%s%s", len ? " " : "", word);
}

/* Calls fn for every word of c's synopsis after the command's name, brackets dropped
 * and alternatives (a|b) apart. */
static void synopsis_words(const psctl_command_t *c, void (*fn)(const char *w, void *arg),
                           void *arg) {
  char copy[256];
  snprintf(copy, sizeof copy, "%s", c->synopsis);
  char *save = NULL;
  bool first = true;
  for (char *t = strtok_r(copy, " []|", &save); t; t = strtok_r(NULL, " []|", &save)) {
    if (first) {
      first = false;
      continue;
    }
    fn(t, arg);
  }
}

typedef struct {
  const psctl_options_t *o;
  const char *name; /* psctl_command_takes: the option asked about */
  bool found;
  char *opts, *words; /* command_words: what it offers */
} scan_t;

/* The long option a synopsis word names (--NAME, or -X for its short form), or NULL. */
static const struct option *word_option(const psctl_options_t *o, const char *w) {
  if (strncmp(w, "--", 2) == 0) return by_long(o, w + 2);
  if (w[0] == '-' && w[1] && !w[2]) return by_short(o, (unsigned char)w[1]);
  return NULL;
}

static void takes_fn(const char *w, void *arg) {
  scan_t *s = arg;
  const struct option *p = word_option(s->o, w);
  if (p && strcmp(p->name, s->name) == 0) s->found = true;
}

bool psctl_command_takes(const psctl_command_t *c, const psctl_options_t *o,
                         const char *long_name) {
  scan_t s = {.o = o, .name = long_name};
  synopsis_words(c, takes_fn, &s);
  return s.found;
}

static void all_commands(char *buf, size_t n) {
  for (size_t i = 0; i < psctl_command_count(); i++) add(buf, n, psctl_command_at(i)->name);
}

static void words_fn(const char *w, void *arg) {
  scan_t *s = arg;
  const struct option *p = word_option(s->o, w);
  if (p) {
    if (is_short(p->val)) add(s->opts, WORDS, (char[]){'-', (char)p->val, 0});
    char lng[64];
    snprintf(lng, sizeof lng, "--%s", p->name);
    add(s->opts, WORDS, lng);
  } else if (strcmp(w, "COMMAND") == 0) {
    all_commands(s->words, WORDS);
  } else if (islower((unsigned char)w[0])) {
    add(s->words, WORDS, w);
  }
}

/* c's own options ("-w --watch --interval") and fixed words ("reset"). */
static void command_words(const psctl_command_t *c, const psctl_options_t *o, char *opts,
                          char *words) {
  opts[0] = words[0] = 0;
  scan_t s = {.o = o, .opts = opts, .words = words};
  synopsis_words(c, words_fn, &s);
}

/* Every option that no command's synopsis names, as --NAME. */
static void global_options(const psctl_options_t *o, char *buf) {
  buf[0] = 0;
  for (const struct option *p = o->longopts; p->name; p++) {
    bool own = false;
    for (size_t i = 0; i < psctl_command_count() && !own; i++)
      own = psctl_command_takes(psctl_command_at(i), o, p->name);
    if (own) continue;
    char lng[64];
    snprintf(lng, sizeof lng, "--%s", p->name);
    add(buf, WORDS, lng);
  }
}

/* "-c|--config": the case pattern of an option's spellings. */
static void pattern(const struct option *p, char *buf, size_t n) {
  if (is_short(p->val))
    snprintf(buf, n, "-%c|--%s", p->val, p->name);
  else
    snprintf(buf, n, "--%s", p->name);
}

/* The spellings of every option that takes a value, as one case pattern. */
static void valued_options(const psctl_options_t *o, char *buf) {
  buf[0] = 0;
  for (const struct option *p = o->longopts; p->name; p++) {
    if (p->has_arg != required_argument) continue;
    char pat[80];
    pattern(p, pat, sizeof pat);
    size_t len = strlen(buf);
    snprintf(buf + len, WORDS - len, "%s%s", len ? "|" : "", pat);
  }
}

static const psctl_value_hint_t *hint_of(const psctl_options_t *o, const char *name) {
  for (size_t i = 0; i < o->num_hints; i++)
    if (strcmp(o->hints[i].option, name) == 0) return &o->hints[i];
  return NULL;
}

/* 'text' for the shell: single quotes, with a quote inside as '\''. */
static void quoted(FILE *f, const char *text) {
  fputc('\'', f);
  for (const char *p = text; *p; p++)
    if (*p == '\'')
      fputs("'\\''", f);
    else
      fputc(*p, f);
  fputc('\'', f);
}

/* The part both shells share: the values of the option before the cursor (one case arm
 * per option that takes one; file names, fixed words or nothing), then the loop that
 * finds the command and counts its arguments (bash's COMP_WORDS count from 0, zsh's
 * words from 1). */
static void print_prev_and_scan(FILE *f, const psctl_options_t *o, bool zsh) {
  char valued[WORDS];
  valued_options(o, valued);
  fprintf(f, "  case $prev in\n");
  for (const struct option *p = o->longopts; p->name; p++) {
    if (p->has_arg != required_argument) continue;
    char pat[80];
    pattern(p, pat, sizeof pat);
    const psctl_value_hint_t *h = hint_of(o, p->name);
    if (h && !h->words)
      fprintf(f, "    %s) %s; return ;;\n", pat,
              zsh ? "_files" : "COMPREPLY=($(compgen -f -- \"$cur\"))");
    else if (h && zsh)
      fprintf(f, "    %s) compadd -- %s; return ;;\n", pat, h->words);
    else if (h)
      fprintf(f, "    %s) COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")); return ;;\n", pat, h->words);
    else
      fprintf(f, "    %s) %s ;;\n", pat, zsh ? "return 1" : "COMPREPLY=(); return");
  }
  fprintf(f,
          "  esac\n"
          "  local i w cmd= nargs=0 skip=\n"
          "  for ((i = %d; i < %s; i++)); do\n"
          "    w=${%s[i]}\n"
          "    if [[ -n $skip ]]; then skip=; continue; fi\n"
          "    case $w in\n"
          "      %s) skip=1 ;;\n"
          "      -*) ;;\n"
          "      *) if [[ -z $cmd ]]; then cmd=$w; else nargs=$((nargs + 1)); fi ;;\n"
          "    esac\n"
          "  done\n",
          zsh ? 2 : 1, zsh ? "CURRENT" : "COMP_CWORD", zsh ? "words" : "COMP_WORDS", valued);
}

/* case $cmd in status) ... ;; esac over every command with something to offer: its
 * options (which = 0) or its fixed words (which = 1), as `pre WORDS post`. */
static void print_command_case(FILE *f, const psctl_options_t *o, int which, const char *pre,
                               const char *post, const char *indent) {
  fprintf(f, "%scase $cmd in\n", indent);
  for (size_t i = 0; i < psctl_command_count(); i++) {
    const psctl_command_t *c = psctl_command_at(i);
    char opts[WORDS], words[WORDS];
    command_words(c, o, opts, words);
    const char *list = which == 0 ? opts : words;
    if (*list) fprintf(f, "%s  %s) %s%s%s ;;\n", indent, c->name, pre, list, post);
  }
  fprintf(f, "%sesac\n", indent);
}

static void print_bash(FILE *f, const psctl_options_t *o) {
  char globals[WORDS], cmds[WORDS] = "";
  global_options(o, globals);
  all_commands(cmds, sizeof cmds);
  fprintf(f,
          "# bash completion for psctl %s, made by `psctl completion bash`.\n"
          "# Load it with: source <(psctl completion bash)\n"
          "# or install it: psctl completion bash > /etc/bash_completion.d/psctl\n"
          "_psctl() {\n"
          "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words=\n",
          TS_VERSION);
  print_prev_and_scan(f, o, false);
  fprintf(f,
          "  if [[ $cur == -* ]]; then\n"
          "    words=\"%s\"\n",
          globals);
  print_command_case(f, o, 0, "words+=\" ", "\"", "    ");
  fprintf(f,
          "  elif [[ -z $cmd ]]; then\n"
          "    words=\"%s\"\n"
          "  elif ((nargs == 0)); then\n",
          cmds);
  print_command_case(f, o, 1, "words=\"", "\"", "    ");
  fprintf(f,
          "  fi\n"
          "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
          "}\n"
          "complete -F _psctl psctl\n");
}

static void print_zsh(FILE *f, const psctl_options_t *o) {
  char globals[WORDS];
  global_options(o, globals);
  fprintf(f,
          "#compdef psctl\n"
          "# zsh completion for psctl %s, made by `psctl completion zsh`.\n"
          "# Load it with: source <(psctl completion zsh)\n"
          "# or install it as _psctl in a directory of $fpath.\n"
          "_psctl() {\n"
          "  local cur=${words[CURRENT]} prev=${words[CURRENT-1]}\n",
          TS_VERSION);
  print_prev_and_scan(f, o, true);
  fprintf(f,
          "  if [[ $cur == -* ]]; then\n"
          "    compadd -- %s\n",
          globals);
  print_command_case(f, o, 0, "compadd -- ", "", "    ");
  fprintf(f,
          "  elif [[ -z $cmd ]]; then\n"
          "    local -a commands\n"
          "    commands=(\n");
  for (size_t i = 0; i < psctl_command_count(); i++) {
    const psctl_command_t *c = psctl_command_at(i);
    char item[512];
    size_t len = (size_t)snprintf(item, sizeof item, "%s:", c->name);
    for (const char *p = c->summary; *p && len + 2 < sizeof item; p++) {
      if (*p == ':') item[len++] = '\\'; /* _describe splits name:description at ':' */
      item[len++] = *p;
    }
    item[len] = 0;
    fprintf(f, "      ");
    quoted(f, item);
    fprintf(f, "\n");
  }
  fprintf(f,
          "    )\n"
          "    _describe -t commands 'psctl command' commands\n"
          "  elif ((nargs == 0)); then\n");
  print_command_case(f, o, 1, "compadd -- ", "", "    ");
  fprintf(f,
          "  fi\n"
          "}\n"
          "if [[ ${funcstack[1]} == _psctl ]]; then _psctl \"$@\"; else compdef _psctl psctl; fi\n");
}

int psctl_completion_print(FILE *f, const char *shell, const psctl_options_t *o) {
  if (strcmp(shell, "bash") == 0)
    print_bash(f, o);
  else if (strcmp(shell, "zsh") == 0)
    print_zsh(f, o);
  else
    return -1;
  return 0;
}
