#!/usr/bin/env python3
"""Fails when a function in the product folders is over 80 lines.

The house rule (docs/house_rules.md: functions under about 80 lines), checked
by clang-tidy's readability-function-size with LineThreshold 80, so lines
count as clang-tidy counts them: the body from its opening to its closing
brace, blank lines and comments included. It runs over every tracked product
.cc file (PRODUCT_DIRS, CUDA host .cc files included) that BUILD_DIR's
compile_commands.json compiles (CMAKE_EXPORT_COMPILE_COMMANDS is on), JOBS
(default: the number of cores) clang-tidy processes at a time; functions
defined in product headers are reported once. A function named in
scripts/function_size_allowlist.txt (`path:Qualified::Name`) is printed as a
warning instead of failing; an allowlist entry no longer over the limit is
printed too, so the list can be emptied.

Usage: BUILD_DIR=build scripts/check_function_size.py [FILE...]
Exit status: 0, or 1 when a function not allowlisted is over the limit (or
clang-tidy / the compilation database is missing).
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys

LIMIT = 80
PRODUCT_DIRS = ("core", "types", "server", "client", "cli", "cluster", "capi",
                "tools", "cuda")
ALLOWLIST = "scripts/function_size_allowlist.txt"
CONFIG = ("{Checks: '-*,readability-function-size', CheckOptions: "
          "[{key: readability-function-size.LineThreshold, value: %d}]}" % LIMIT)
WARNING = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): warning: "
                     r"function '(?P<name>[^']+)' exceeds recommended size")
NOTE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: note: (?P<lines>\d+) "
                  r"lines including whitespace and comments")


def qualified_name(path, line, col, name):
    """The name as written at its definition (Llama2cModel::Run), which
    clang-tidy prints unqualified (Run)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.readlines()[line - 1]
    except (OSError, IndexError):
        return name
    head = text[:col - 1 + len(name)]
    m = re.search(r"([A-Za-z_~][\w:~<>]*)$", head)
    return m.group(1) if m and m.group(1).endswith(name) else name


def run_tidy(build_dir, path, header_filter):
    proc = subprocess.run(
        ["clang-tidy-14", "-p", build_dir, "--quiet", "--config=" + CONFIG,
         "--header-filter=" + header_filter, path],
        capture_output=True, text=True, check=False)
    found = []
    pending = None
    for line in proc.stdout.splitlines():
        m = WARNING.match(line)
        if m:
            pending = m
            continue
        n = NOTE.match(line)
        if n and pending and n.group("file") == pending.group("file"):
            rel = os.path.relpath(pending.group("file"))
            name = qualified_name(pending.group("file"), int(pending.group("line")),
                                  int(pending.group("col")), pending.group("name"))
            found.append((rel, name, int(n.group("lines")),
                          int(pending.group("line"))))
            pending = None
    # A file that does not parse gives no warning: say so rather than pass.
    errors = [l for l in proc.stdout.splitlines() + proc.stderr.splitlines()
              if " error: " in l]
    return path, found, errors


def read_allowlist():
    entries = set()
    with open(ALLOWLIST, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if line:
                entries.add(line)
    return entries


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    build_dir = os.environ.get("BUILD_DIR", "build")
    db = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(db):
        print(f"function size: no {db} (configure {build_dir} first)",
              file=sys.stderr)
        return 1
    with open(db, encoding="utf-8") as f:
        compiled = {os.path.relpath(e["file"]) for e in json.load(f)}
    files = sys.argv[1:]
    if not files:
        tracked = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard",
             "--", *[d + "/*.cc" for d in PRODUCT_DIRS]],
            capture_output=True, text=True, check=True).stdout.split()
        files = sorted(f for f in tracked if f in compiled and os.path.exists(f))
    root = os.getcwd()
    header_filter = "^%s/(%s)/" % (re.escape(root), "|".join(PRODUCT_DIRS))
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 2))
    found = {}
    failed_parse = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for path, hits, errors in pool.map(
                lambda p: run_tidy(build_dir, p, header_filter), files):
            for rel, name, lines, line in hits:
                found[(rel, name)] = (lines, line)
            if errors:
                failed_parse.append((path, errors[:3]))
    allow = read_allowlist()
    over = []
    for (rel, name), (lines, line) in sorted(found.items()):
        key = f"{rel}:{name}"
        if key in allow:
            print(f"warning: {rel}:{line}: {name} is {lines} lines (over {LIMIT}; "
                  f"allowlisted in {ALLOWLIST})")
        else:
            over.append(f"{rel}:{line}: {name} is {lines} lines (over {LIMIT})")
    seen = {f"{rel}:{name}" for rel, name in found}
    for key in sorted(allow - seen):
        print(f"note: {ALLOWLIST}: {key} is no longer over {LIMIT} lines "
              "(or gone): remove its entry")
    for path, errors in failed_parse:
        print(f"function size: clang-tidy could not parse {path}:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
    for o in over:
        print("error: " + o, file=sys.stderr)
    print(f"function size: {len(files)} files, {len(found)} functions over "
          f"{LIMIT} lines, {len(over)} not allowlisted")
    return 1 if over or failed_parse else 0


if __name__ == "__main__":
    sys.exit(main())
