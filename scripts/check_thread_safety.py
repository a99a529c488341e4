#!/usr/bin/env python3
"""clang's thread-safety analysis over every product translation unit.

BUILD_DIR (default build-thread-safety/) must be configured with clang++-14
and -DKVHARBOR_THREAD_SAFETY=ON (scripts/test.sh does it; the flags put
-Wthread-safety and -Werror in compile_commands.json). This script builds
only the generated protobuf/gRPC sources the product code includes, then runs
each product .cc of compile_commands.json (core/, types/, server/, client/,
cli/, cluster/, tools/, and the host C++ of cuda/ and capi/ through
kvharbor_cuda_host_check) through the compiler with -fsyntax-only, JOBS at a
time (default: the number of cores). The analysis is part of clang's semantic
checks, so -fsyntax-only reports every ABSL_GUARDED_BY and lock annotation
violation that a full compile reports, without code generation or debug
info: about a third of the time of building the same targets.

Usage: BUILD_DIR=build-thread-safety scripts/check_thread_safety.py [FILE...]
(FILEs: check only those product sources.)
Exit status: 0, or 1 when any file gives a diagnostic error.
"""
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

PRODUCT_DIRS = ("core", "types", "server", "client", "cli", "cluster",
                "capi", "tools", "cuda")


def generated_sources(build_dir):
    """The protobuf/gRPC outputs of the build's custom commands."""
    out = subprocess.run(["ninja", "-C", build_dir, "-t", "targets", "all"],
                         capture_output=True, text=True, check=True).stdout
    return sorted({line.split(":", 1)[0] for line in out.splitlines()
                   if line.split(":", 1)[0].endswith((".pb.h", ".pb.cc"))})


def syntax_command(entry):
    args = entry.get("arguments") or shlex.split(entry["command"])
    cmd = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        cmd.append(a)
    return cmd + ["-fsyntax-only"]


def check(entry):
    proc = subprocess.run(syntax_command(entry), cwd=entry["directory"],
                          capture_output=True, text=True, check=False)
    return entry["file"], proc.returncode, proc.stdout + proc.stderr


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    root = os.getcwd()
    build_dir = os.environ.get("BUILD_DIR", "build-thread-safety")
    db = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(db):
        print(f"thread safety: no {db} (configure {build_dir} first)",
              file=sys.stderr)
        return 1
    gen = generated_sources(build_dir)
    subprocess.run(["ninja", "-C", build_dir, *gen], check=True,
                   stdout=subprocess.DEVNULL)
    with open(db, encoding="utf-8") as f:
        entries = json.load(f)
    mine = []
    for e in entries:
        rel = os.path.relpath(os.path.join(e["directory"], e["file"]), root)
        if rel.split(os.sep, 1)[0] in PRODUCT_DIRS and (
                len(sys.argv) < 2 or rel in sys.argv[1:]):
            mine.append(e)
    flags = set(syntax_command(mine[0])) if mine else set()
    if "-Wthread-safety" not in flags or "-Werror" not in flags:
        print(f"thread safety: {db} lacks -Wthread-safety -Werror (configure "
              "with clang++-14 -DKVHARBOR_THREAD_SAFETY=ON)", file=sys.stderr)
        return 1
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 2))
    failed = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for path, rc, text in pool.map(check, mine):
            if rc != 0:
                failed.append(path)
                sys.stderr.write(text)
    print(f"thread safety: {len(mine)} translation units, "
          f"{len(failed)} with errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
