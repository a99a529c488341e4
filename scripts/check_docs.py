#!/usr/bin/env python3
"""Checks that what README.md and docs/*.md name exists in the repository.

Names checked (in prose and code blocks alike):
  - repository paths: `dir/file.ext` (any such path with a source or
    document extension), `dir/sub/` whose first folder is a tracked top-level
    folder, globs (`tests/python/test_*.py`) and brace lists
    (`cuda/{kernels,codec}/`): a tracked or new (not ignored) file, or a
    folder holding one; build outputs (`build/...`) are not checked; relative
    links `[x](tiers.md)` from the document's folder;
  - command-line flags `--name`: defined by ABSL_FLAG in server/ (kvharbord),
    listed by BUILD_DIR's `kvharbord --help` when it is built, or named
    (`--name` or the string "name") in the source of the CLI, the tools, the
    benchmarks, the scripts and the Python package and tests;
  - config keys `store.x`, `limits.x.y`, `metrics.x`, `log.x`, `security.x`,
    `cluster.x`, `fetch.x`: every part is a string in the config parser
    (server/ sources that read YAML);
  - RPCs `KvHarbor/Name` and `kvharbor.v1.KvHarbor.Name`: an `rpc Name(` in
    proto/.
Names that are legitimately not in this repository (other projects' files and
flags) are listed with a reason in scripts/docs_exceptions.txt.
Exit status: 0, or 1 with one line per name that does not exist.
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys

CONFIG_SECTIONS = ("store", "limits", "metrics", "log", "security", "cluster",
                   "fetch")
FILE_EXTENSIONS = {"cc", "h", "cu", "cuh", "md", "py", "sh", "yaml", "yml",
                   "json", "txt", "proto", "cmake", "so", "bin", "log", "csv",
                   "png", "svg", "toml", "pt", "gguf", "safetensors"}
FLAG_SOURCES = ("client/cli", "cli/", "tools/", "bench/", "scripts/",
                "python/", "tests/", "server/", "examples/", "deploy/",
                "Dockerfile", ".ci/", "fuzz/")
EXCEPTIONS = "scripts/docs_exceptions.txt"

PATH_TOKEN = re.compile(r"(?<![\w/~${-])((?:[\w.*{},-]+/)+[\w.*{},-]*)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)(?![A-Za-z])")
CONFIG = re.compile(r"(?<![\w./-])((?:%s)(?:\.[a-z_][a-z0-9_]*)+)(?![\w/(])"
                    % "|".join(CONFIG_SECTIONS))
RPC = re.compile(r"(?:kvharbor\.v1\.KvHarbor\.|(?<![\w.])KvHarbor/)([A-Z]\w*)")
STRING = re.compile(r'"([^"\\\n]*)"')


def git_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others",
                          "--exclude-standard"], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return [f for f in out if f and os.path.exists(f)]


def expand_braces(token):
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for part in m.group(1).split(","):
        out += expand_braces(token[:m.start()] + part + token[m.end():])
    return out


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


class Repo:
    def __init__(self, build_dir):
        self.files = git_files()
        self.file_set = set(self.files)
        self.dirs = set()
        for f in self.files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))
        self.top = {f.split("/")[0] for f in self.files if "/" in f}
        self.flags = self._flags(build_dir)
        self.config_words = self._config_words()
        self.rpcs = set()
        for f in self.files:
            if f.startswith("proto/") and f.endswith(".proto"):
                self.rpcs |= set(re.findall(r"^\s*rpc\s+(\w+)\s*\(", read(f), re.M))

    def _flags(self, build_dir):
        flags = set()
        for f in self.files:
            if not f.endswith((".cc", ".h", ".py", ".sh", ".cmake", ".yaml")) \
                    and f != "Dockerfile":
                continue
            text = read(f)
            if "ABSL_FLAG(" in text:  # kvharbord's, the tools', the benchmarks'
                flags |= set(re.findall(r"ABSL_FLAG\([^,]+,\s*(\w+)\s*,", text))
            if f.startswith(FLAG_SOURCES) or f.endswith("CMakeLists.txt"):
                flags |= set(FLAG.findall(text))
                if f.startswith(("client/cli", "cli/", "tools/", "bench/")):
                    flags |= {s for s in STRING.findall(text)
                              if re.fullmatch(r"[a-z][a-z0-9_]*", s)}
        daemon = [p for p in glob.glob(os.path.join(build_dir, "**", "kvharbord"),
                                       recursive=True)
                  if os.path.isfile(p) and os.access(p, os.X_OK)]
        if daemon:
            proc = subprocess.run([daemon[0], "--help"], capture_output=True,
                                  text=True, check=False, timeout=60)
            flags |= set(FLAG.findall(proc.stdout + proc.stderr))
        return flags

    def _config_words(self):
        words = set()
        for f in self.files:
            if f.startswith("server/") and f.endswith((".cc", ".h")):
                text = read(f)
                if "YAML::" not in text:
                    continue
                for s in STRING.findall(text):
                    words |= set(s.split("."))
        return words

    def path_exists(self, token, doc_dir=""):
        """token as it is, from the document's folder, or the tail of a
        tracked path (`kvharbor/engine.py` in a paragraph about python/)."""
        return (self._exists(token) or
                (doc_dir and self._exists(os.path.join(doc_dir, token))) or
                any(f.endswith("/" + token) for f in self.files))

    def _exists(self, token):
        for t in expand_braces(token):
            t = t.rstrip("/")
            if any(c in t for c in "*?["):
                if not any(fnmatch.fnmatch(f, t) or fnmatch.fnmatch(d, t)
                           for f in self.files for d in [f]) and \
                        not any(fnmatch.fnmatch(d, t) for d in self.dirs):
                    return False
            elif t not in self.file_set and t not in self.dirs:
                return False
        return True


def read_exceptions():
    entries = {}
    with open(EXCEPTIONS, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, reason = line.partition("#")
            if not sep or not reason.strip():
                sys.exit(f"{EXCEPTIONS}:{n}: an entry needs a reason after '#'")
            entries[name.strip()] = reason.strip()
    return entries


def check_doc(doc, repo, exceptions, used):
    problems = []
    in_code = False
    for n, line in enumerate(read(doc).split("\n"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        where = f"{doc}:{n}"

        def bad(kind, name):
            if name in exceptions:
                used.add(name)
                return
            problems.append(f"{where}: {kind} {name} does not exist")

        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue
            rel = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if not repo.path_exists(rel):
                bad("link", target)
        for m in PATH_TOKEN.finditer(line):
            token = m.group(1).rstrip(".,:;")
            token = token[2:] if token.startswith("./") else token
            if "://" in line[max(0, m.start() - 12):m.start() + 3]:
                continue  # inside a URL
            first = token.split("/")[0]
            ext = token.rsplit(".", 1)[-1] if "." in token.split("/")[-1] else ""
            if first not in repo.top and ext not in FILE_EXTENSIONS:
                continue
            if "<" in token or re.fullmatch(r"build[\w-]*|\.gpu\w*", first):
                continue  # a placeholder, or a build output
            if not repo.path_exists(token, os.path.dirname(doc)):
                bad("path", token)
        for name in FLAG.findall(line):
            if name not in repo.flags:
                bad("flag", "--" + name)
        for m in CONFIG.finditer(line):
            key = m.group(1)
            parts = key.split(".")
            if parts[-1] in FILE_EXTENSIONS:
                continue
            if not all(p in repo.config_words for p in parts):
                bad("config key", key)
        for name in RPC.findall(line):
            if name not in repo.rpcs:
                bad("RPC", name)
    return problems


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    repo = Repo(os.environ.get("BUILD_DIR", "build"))
    exceptions = read_exceptions()
    docs = ["README.md"] + sorted(glob.glob("docs/*.md"))
    used = set()
    problems = []
    for doc in docs:
        problems += check_doc(doc, repo, exceptions, used)
    for name in sorted(set(exceptions) - used):
        print(f"note: {EXCEPTIONS}: {name} is not named in the docs any more: "
              "remove its entry")
    for p in problems:
        print("error: " + p, file=sys.stderr)
    print(f"docs: {len(docs)} documents, {len(problems)} names that do not exist")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
