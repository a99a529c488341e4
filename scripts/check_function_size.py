#!/usr/bin/env python3
"""Fails when a function in the product folders is over 80 lines.

The house rule (docs/house_rules.md: functions under about 80 lines). Function
definitions are found by universal-ctags (Debian's universal-ctags; kinds `f`
of C++, .cu and .cuh read as C++), which gives each definition's first and last
line without compiling anything, so the whole tree is checked in about a
second. (Until 2026-12 this ran clang-tidy's readability-function-size over
every translation unit: over half an hour on CI's two cores, which pushed the
test run past its time limit.) Lines count as clang-tidy's check counted them:
the line of its closing brace less the line of its opening brace (clang's
line numbers subtracted), blank lines and comments included. Lambdas count toward the function that
holds them.

It reads every tracked (or new, not ignored) .h/.cc/.cu/.cuh file under
PRODUCT_DIRS. A function named in scripts/function_size_allowlist.txt
(`path:Qualified::Name`) is printed as a warning instead of failing; an
allowlist entry no longer over the limit is printed too, so the list can be
emptied.

Usage: scripts/check_function_size.py [FILE...]
Exit status: 0, or 1 when a function not allowlisted is over the limit (or
ctags is missing or fails).
"""
import json
import os
import re
import shutil
import subprocess
import sys

LIMIT = 80
PRODUCT_DIRS = ("core", "types", "server", "client", "cli", "cluster", "capi",
                "tools", "cuda")
SUFFIXES = (".h", ".cc", ".cu", ".cuh")
ALLOWLIST = "scripts/function_size_allowlist.txt"


def read_allowlist():
    entries = set()
    with open(ALLOWLIST, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if line:
                entries.add(line)
    return entries


def product_files():
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--",
         *PRODUCT_DIRS],
        capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in tracked
                  if f.endswith(SUFFIXES) and os.path.exists(f))


def definitions(files):
    """(path, qualified name, first line, last line) of each function
    definition ctags finds in files."""
    proc = subprocess.run(
        ["ctags", "--output-format=json", "--fields=+neKZ", "--kinds-C++=f",
         "--language-force=C++", "-f", "-", *files],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError("ctags failed: " + proc.stderr.strip()[:500])
    for raw in proc.stdout.splitlines():
        tag = json.loads(raw)
        if tag.get("_type") != "tag" or "end" not in tag:
            continue
        scope = tag.get("scope", "")
        # Namespaces (and anonymous ones) are not part of the name as written.
        parts = [p for p in scope.split("::")
                 if p and not p.startswith("__anon") and p != "kvharbor"
                 and tag.get("scopeKind") != "namespace"]
        name = "::".join(parts + [tag["name"]]) if tag.get(
            "scopeKind") in ("class", "struct") else tag["name"]
        yield tag["path"], name, int(tag["line"]), int(tag["end"])


def body_lines(lines, first, last):
    """The closing brace's line less the opening brace's line."""
    for i in range(first - 1, min(last, len(lines))):
        if "{" in re.sub(r"//.*", "", lines[i]):
            return last - (i + 1)
    return last - first


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if shutil.which("ctags") is None:
        print("function size: ctags missing (scripts/install_deps.sh installs "
              "universal-ctags)", file=sys.stderr)
        return 1
    files = sys.argv[1:] or product_files()
    texts = {}
    found = {}
    for path, name, first, last in definitions(files):
        if path not in texts:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts[path] = f.readlines()
        n = body_lines(texts[path], first, last)
        if n > LIMIT:
            found[(path, name)] = (n, first)
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
    for o in over:
        print("error: " + o, file=sys.stderr)
    print(f"function size: {len(files)} files, {len(found)} functions over "
          f"{LIMIT} lines, {len(over)} not allowlisted")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
