#!/usr/bin/env python3
"""The layer table of docs/dev/ARCHITECTURE.md, checked against the build.

A layer sees another layer's headers only when that folder is on its include path, and
meson puts it there only through a dependency. So the include path of every file the build
compiles says what it can include, transitively (a dependency's dependencies included). For
each C file of a layer, from meson's compile_commands.json:

 - the compiler is asked for its include search list (`-E -v`, with the file's own
   arguments): every folder of the source or build tree on it must be the layer's own, one
   its table row's "may include" column names, include/ (the public header) or the tree's
   folder in the build tree (ts_build_config.h). Anything else is a failure naming the file, the folder and the
   row;
 - the same run preprocesses a probe that asks `__has_include` for one header of every layer
   the row does not name (and the file's own layer's, which must be found): a forbidden
   include really fails to build, and the search list was read right;
 - a module's private header (NAME_int.h) is included only from its own folder, and the
   store's partition (server/ts_store_int.h) only by the store's files (ts_store*.c): the
   shard's other modules call ts_store.h. Unit tests may look inside;
 - every unit test (tests/unit) must fit one layer: its include path reaches a layer and
   nothing that layer's row does not name, so it names its layer's dependency only.

Why over compile_commands.json rather than cc.compiles() at configure time: these are the
arguments each file is really compiled with, whatever dependency, include_directories or
transitive dependency put them there, and the compiler's own search rules apply; nothing is
built, so a change to a meson.build is checked as soon as meson reconfigures.

A folder that builds C code and has no row (other than tests/ and bench/) fails too, and so
does a quoted include that names a layer's folder ("net/ts_conn.h", "../net/ts_conn.h"),
since a path steps around the include path. Runs in about a second: one preprocessor run per
distinct set of compile arguments. Exits 0 when all holds, 1 with one line per failure.

usage: check_layers.py SOURCE_ROOT BUILD_ROOT
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# obs/ holds two libraries (obs_format and obs); the table names both, the folder is one.
ALIASES = {"obs_format": "obs"}
# Folders that compile C code but are no layer: tests reach into several layers on purpose,
# bench/ is a set of programs over the client and the shard's optimizer.
NOT_LAYERS = {"tests", "bench"}
# Reachable from every layer: the public header (plain C, no dependency of its own), and the
# tree's root, where ts_build_config.h is generated.
EVERYWHERE = {"include", ""}


def read_table(path):
    """{layer: set of layers it may include} from the rows | `name/` | holds | may | ext |."""
    table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\|\s*`([a-z_]+)/`\s*\|", line)
            if not m:
                continue
            cells = line.strip().split("|")
            if len(cells) != 6:
                sys.exit(f"check_layers: {path}: cannot read the row of {m.group(1)}/ "
                         f"(a | inside a cell?)")
            allowed = set()
            for item in cells[3].split(","):
                word = item.strip().strip("`").split(" ")[0].rstrip("/")
                if word and word != "libc":
                    allowed.add(ALIASES.get(word, word))
            table[m.group(1)] = allowed
    if not table:
        sys.exit(f"check_layers: no layer table in {path}")
    for layer, allowed in table.items():
        unknown = allowed - set(table)
        if unknown:
            sys.exit(f"check_layers: {path}: {layer}/ may include {sorted(unknown)}, "
                     f"which have no row")
    return table


def folder_of(path, src, build):
    """The top folder of path in the build or source tree ("" for a root), or None outside."""
    path = os.path.realpath(path)
    for root in (build, src):  # the build tree may lie inside the source tree
        rel = os.path.relpath(path, root)
        if rel == ".":
            return ""
        if not rel.startswith(".."):
            return rel.split(os.sep)[0]
    return None


def preprocess_args(entry):
    """The entry's compiler and arguments, less its source, output and dependency files."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MQ", "-MF", "-MT"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD", entry["file"]):
            out.append(a)
    return out


def headers(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".h"))


def main():
    src, build = (os.path.realpath(p) for p in sys.argv[1:3])
    table = read_table(os.path.join(src, "docs", "dev", "ARCHITECTURE.md"))
    own_headers = {layer: headers(os.path.join(src, layer)) for layer in table}
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    failures, seen, checked = [], set(), 0
    for e in entries:
        if not e["file"].endswith(".c"):
            continue
        file = os.path.join(e["directory"], e["file"])
        name = os.path.relpath(os.path.realpath(file), src)
        # The layer is the folder of the target that compiles the file (its object's place
        # in the build tree): the libFuzzer targets of tests/fuzz compile base/ and proto/
        # files with their own include path.
        output = os.path.join(e["directory"], e.get("output", e["file"]))
        folder = folder_of(output if "output" in e else file, src, build)
        unit = folder == "tests" and name.startswith("tests/unit/")
        if folder in NOT_LAYERS and not unit:
            continue
        if folder not in table and not unit:
            failures.append(f"{name}: {folder}/ builds C code but has no row in the layer "
                            "table of docs/dev/ARCHITECTURE.md")
            continue
        args = preprocess_args(e)
        key = (folder, unit, tuple(args))
        if key in seen:
            continue
        seen.add(key)
        checked += 1
        # The probe: each forbidden layer's first header whose name no allowed folder also
        # has (two layers may share a basename, ts_status.h), and the layer's own first one.
        allowed = set() if unit else table[folder] | {folder}
        probe = []
        if not unit:
            names_ok = {h for lay in allowed for h in own_headers.get(lay, [])}
            for lay in sorted(set(table) - allowed):
                mine = [h for h in own_headers[lay] if h not in names_ok]
                if mine:
                    probe += [f'#if __has_include("{mine[0]}")',
                              f"#error would build: include {mine[0]} of {lay}/", "#endif"]
            if own_headers[folder]:
                probe += [f'#if !__has_include("{own_headers[folder][0]}")',
                          f"#error its own {own_headers[folder][0]} is not found",
                          "#endif"]
        with tempfile.TemporaryDirectory() as tmp:  # a folder of its own: nothing beside it
            path = os.path.join(tmp, "probe.c")
            with open(path, "w", encoding="utf-8") as p:
                p.write("\n".join(probe) + "\n")
            r = subprocess.run(args + ["-E", "-v", "-x", "c", path, "-o", os.devnull],
                               cwd=e["directory"], capture_output=True, text=True)
        dirs, inside = [], False
        for line in r.stderr.splitlines():
            if "search starts here" in line:
                inside = True
            elif line.startswith("End of search list"):
                inside = False
            elif inside and line.startswith(" "):
                dirs.append(os.path.join(e["directory"], line.strip()))
        if not dirs:
            failures.append(f"{name}: no include search list from the compiler: {r.stderr[-300:]}")
            continue
        reached = {folder_of(d, src, build) for d in dirs} - {None} - EVERYWHERE
        if unit:
            reached -= {"tests"}
            if reached and not any(reached <= table[lay] | {lay} for lay in reached):
                failures.append(f"{name}: a unit test reaches {sorted(reached)}, more than "
                                "one layer: name only its layer's dependency")
            continue
        for lay in sorted(reached - allowed):
            failures.append(f"{name}: {lay}/ is on its include path, but {folder}/ may "
                            f"include only {', '.join(sorted(table[folder])) or 'libc'}")
        for line in r.stderr.splitlines():
            if "#error" in line:
                failures.append(f"{name}: {line.split('#error', 1)[1].strip()}")
        if r.returncode != 0 and "#error" not in r.stderr:
            failures.append(f"{name}: the probe did not preprocess: {r.stderr[-300:]}")
    # A path names what the include path would hide.
    pat = re.compile(r'^\s*#\s*include\s*"(?:\.\.?/)*(%s)/' % "|".join(table))
    for layer in list(table) + ["python"]:
        for dirpath, _, files in os.walk(os.path.join(src, layer)):
            for fn in files:
                if not fn.endswith((".c", ".h", ".cu")):
                    continue
                with open(os.path.join(dirpath, fn), encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        if pat.match(line):
                            rel = os.path.relpath(os.path.join(dirpath, fn), src)
                            failures.append(f"{rel}:{n}: an include by path steps around "
                                            f"the layers: {line.strip()}")
    # A module's private header (NAME_int.h) is its folder's, and the store's partition
    # (server/ts_store_int.h) is the store's alone: the shard's other modules use
    # ts_store.h's functions, never a partition's fields. The unit tests may look inside.
    priv = re.compile(r'^\s*#\s*include\s*"([\w.]+_int\.h)"')
    owner = {h: lay for lay in table for h in own_headers[lay] if h.endswith("_int.h")}
    only = {"ts_store_int.h": "server/ts_store"}
    for layer in list(table) + ["python", "tests", "bench"]:
        for dirpath, _, files in os.walk(os.path.join(src, layer)):
            for fn in files:
                if not fn.endswith((".c", ".h", ".cu")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, fn), src)
                with open(os.path.join(dirpath, fn), encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = priv.match(line)
                        if not m or m.group(1) not in owner or rel.startswith("tests/unit/"):
                            continue
                        h = m.group(1)
                        if not rel.startswith(owner[h] + "/") or \
                                (h in only and not rel.startswith(only[h])):
                            failures.append(f"{rel}:{n}: {h} is private to "
                                            f"{only.get(h, owner[h] + '/')}")
    for f in failures:
        print(f)
    if checked == 0:
        print("check_layers: no C file of a layer in compile_commands.json")
        return 1
    print(f"check_layers: {checked} sets of compile arguments, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
