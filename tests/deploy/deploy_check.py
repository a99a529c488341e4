#!/usr/bin/python3
"""Reads the Dockerfile and the deploy/ files for tests/deploy/*_test.sh.

Standard library plus PyYAML (python3-yaml, which yamllint depends on).
Subcommands print what the shell tests need, or check cross-file facts that
no single linter sees (ports, paths, users, sizes) and exit 1 on a mismatch,
with one line per problem.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

DOCKERFILE = "Dockerfile"
CONTAINER_CONFIG = "deploy/container/kvharbord.yaml"
K8S = "deploy/k8s"


def parse_size(text):
    """Byte size as kvharbord reads it (server/daemon/config.cc) or a k8s quantity."""
    m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti|B|k|m|g)?",
                     str(text).strip())
    if not m:
        raise ValueError("not a byte size: %r" % text)
    shift = {"KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40, "Ki": 10, "Mi": 20,
             "Gi": 30, "Ti": 40, "k": 10, "m": 20, "g": 30}.get(m.group(2), 0)
    return int(m.group(1)) << shift


def port_of(hostport):
    return int(str(hostport).rsplit(":", 1)[1])


# ---- Dockerfile ----

class Stage:
    def __init__(self, image, name):
        self.image, self.name, self.instructions = image, name, []


def dockerfile_stages(path=DOCKERFILE):
    """Stages in order; each instruction is (KEYWORD, text) with continuation
    lines joined and comment lines dropped, as Docker does."""
    lines, logical = [], ""
    for raw in open(path, encoding="utf-8").read().splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            logical += raw.rstrip()[:-1] + " "
            continue
        logical += raw
        if logical.strip():
            lines.append(logical.strip())
        logical = ""
    args, stages = {}, []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""),
                           words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" \
                else None
            stages.append(Stage(image, name))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return stages


def stage(name):
    for s in dockerfile_stages():
        if s.name == name:
            return s
    sys.exit("deploy_check: no stage '%s' in %s" % (name, DOCKERFILE))


def build_run(name):
    """The builder stage's RUN after `COPY . .` (the build and install)."""
    seen_copy = False
    for keyword, rest in stage(name).instructions:
        if keyword == "COPY" and rest.split() == [".", "."]:
            seen_copy = True
        elif keyword == "RUN" and seen_copy:
            return rest
    sys.exit("deploy_check: stage %s has no RUN after COPY . ." % name)


def apt_packages(name):
    """Packages the stage's RUN lines apt-get install."""
    pkgs = []
    for keyword, rest in stage(name).instructions:
        if keyword != "RUN":
            continue
        for cmd in re.split(r"&&|;", rest):
            words = shlex.split(cmd)
            if "apt-get" in words and "install" in words:
                tail = words[words.index("install") + 1:]
                pkgs += [w for w in tail if not w.startswith("-")]
    return pkgs


def dockerignore_excludes(paths, ignore=".dockerignore"):
    """Paths that .dockerignore keeps out of the build context (Docker's
    rules: patterns from the context root, `*` within one name, `**` across
    names, a matched directory takes its contents, `!` re-includes)."""
    rules = []
    for line in open(ignore, encoding="utf-8").read().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = line[1:] if negate else line
        pat = pat.strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        rules.append((negate, re.compile(rx + r"\Z")))
    out = []
    for p in paths:
        parts = p.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        excluded = False
        for negate, rx in rules:
            if any(rx.match(q) for q in prefixes):
                excluded = not negate
        if excluded:
            out.append(p)
    return out


def cmd_dockerfile_static(files):
    """Static checks of the Dockerfile against the tree; `files` is the
    build context as git lists it."""
    problems = []
    stages = dockerfile_stages()
    names = [s.name for s in stages]
    for want in ("build-cpu", "cpu", "build-cuda", "cuda"):
        if want not in names:
            problems.append("no stage named %s" % want)
    context = set(files) - set(dockerignore_excludes(files))
    for p in dockerignore_excludes(files):
        problems.append(".dockerignore excludes tracked file %s" % p)
    config = yaml.safe_load(open(CONTAINER_CONFIG, encoding="utf-8"))
    want_ports = {port_of(config["listen"]),
                  port_of(config["metrics"]["listen"])}
    for i, s in enumerate(stages):
        where = "stage %s" % s.name
        final = s.name in ("cpu", "cuda")
        keywords = [k for k, _ in s.instructions]
        for keyword, rest in s.instructions:
            if keyword == "COPY":
                words = rest.split()
                src_from = [w for w in words if w.startswith("--from=")]
                srcs = [w for w in words if not w.startswith("--")][:-1]
                if src_from:
                    ref = src_from[0][len("--from="):]
                    if ref not in names[:i]:
                        problems.append("%s: COPY --from=%s: no earlier stage"
                                        % (where, ref))
                    for src in srcs:
                        rel = src[len("/src/"):] if src.startswith("/src/") \
                            else None
                        if rel is not None and rel not in context:
                            problems.append("%s: COPY %s: %s not in the build "
                                            "context" % (where, src, rel))
                else:
                    for src in srcs:
                        if src != "." and src.rstrip("/") not in context and \
                                not any(f.startswith(src) for f in context):
                            problems.append("%s: COPY %s: not in the build "
                                            "context" % (where, src))
            if keyword == "RUN":
                for script in re.findall(r"bash\s+(\S+\.sh)", rest):
                    if script.startswith("/src/"):
                        script = script[len("/src/"):]
                    if script not in context:
                        problems.append("%s: RUN runs %s, not in the build "
                                        "context" % (where, script))
        if not final:
            continue
        user = [r for k, r in s.instructions if k == "USER"]
        if not user or user[-1].split(":")[0] in ("0", "root"):
            problems.append("%s: no non-root USER" % where)
        exposed = {int(p.split("/")[0]) for k, r in s.instructions
                   if k == "EXPOSE" for p in r.split()}
        if exposed != want_ports:
            problems.append("%s: EXPOSE %s, but %s listens on %s" % (
                where, sorted(exposed), CONTAINER_CONFIG, sorted(want_ports)))
        for k in ("HEALTHCHECK", "ENTRYPOINT"):
            if k not in keywords:
                problems.append("%s: no %s" % (where, k))
        entry = json.loads([r for k, r in s.instructions
                            if k == "ENTRYPOINT"][-1])
        copies = [r.split()[-1] for k, r in s.instructions if k == "COPY"]
        conf = [a.split("=", 1)[1] for a in entry if a.startswith("--config=")]
        if not conf or conf[0] not in copies:
            problems.append("%s: ENTRYPOINT's --config is not a file the stage "
                            "copies in" % where)
    for p in problems:
        print("dockerfile: " + p)
    return 1 if problems else 0


def healthcheck_argv(name):
    """The HEALTHCHECK's command, without an `env -u VAR` prefix."""
    for keyword, rest in stage(name).instructions:
        if keyword == "HEALTHCHECK":
            argv = json.loads(rest[rest.index("CMD") + 3:].strip())
            while argv and argv[0] == "env":
                argv = argv[3:] if argv[1] == "-u" else argv[1:]
            return argv
    sys.exit("deploy_check: stage %s has no HEALTHCHECK" % name)


def entrypoint_argv(name):
    for keyword, rest in stage(name).instructions:
        if keyword == "ENTRYPOINT":
            return json.loads(rest)
    sys.exit("deploy_check: stage %s has no ENTRYPOINT" % name)


# ---- Kubernetes, compose, systemd ----

def load_k8s(path):
    return yaml.safe_load(open(path, encoding="utf-8"))


def configmap_config():
    cm = load_k8s(K8S + "/base/configmap.yaml")
    return cm["data"]["kvharbord.yaml"]


def tls_overlay_problems(base_config, mounts):
    """deploy/k8s/tls: the base config plus security (and namespace tenants),
    its files on the Secret's mount, probes that speak TLS."""
    problems = []
    cm = load_k8s(K8S + "/tls/configmap-security.yaml")
    config = yaml.safe_load(cm["data"]["kvharbord.yaml"])
    sec = config.pop("security", {})
    for ns in config.get("namespaces", []):
        if not ns.pop("tenant", None):
            problems.append("tls overlay: namespace %s has no tenant"
                            % ns["name"])
    # The bulk data plane is plain TCP: beside TLS the overlay leaves it off
    # (the daemon refuses it without data_plane.allow_plaintext).
    if "data_plane" in config:
        problems.append("tls overlay: data_plane is set (plaintext beside "
                        "TLS)")
    base = {k: v for k, v in base_config.items() if k != "data_plane"}
    if config != base:
        problems.append("tls overlay: kvharbord.yaml differs from the base's "
                        "beyond security, tenants and data_plane")
    tls_dir = mounts.get("tls", "?")
    files = [sec.get("tokens_file")] + [
        sec.get("tls", {}).get(k) for k in ("cert_file", "key_file",
                                            "client_ca_file")]
    for f in files:
        if not f or not f.startswith(tls_dir + "/"):
            problems.append("tls overlay: %s is not on the Secret's mount %s"
                            % (f, tls_dir))
    dep = load_k8s(K8S + "/tls/deployment-tls.yaml")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = c.get(probe, {}).get("exec", {}).get("command", [])
        if cmd[:1] != ["kvharbor-healthcheck"] or \
                "--tls_ca=%s/ca.crt" % tls_dir not in cmd:
            problems.append("tls overlay: %s does not run kvharbor-healthcheck "
                            "over TLS" % probe)
    return problems


def cmd_k8s_static():
    problems = []
    base = load_k8s(K8S + "/base/kustomization.yaml")
    for r in base["resources"]:
        try:
            load_k8s(K8S + "/base/" + r)
        except OSError:
            problems.append("base/kustomization.yaml: %s missing" % r)
    config = yaml.safe_load(configmap_config())
    dep = load_k8s(K8S + "/base/deployment.yaml")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    if ports.get("grpc") != port_of(config["listen"]):
        problems.append("container port grpc %s != configmap listen %s" % (
            ports.get("grpc"), config["listen"]))
    if ports.get("metrics") != port_of(config["metrics"]["listen"]):
        problems.append("container port metrics %s != metrics.listen %s" % (
            ports.get("metrics"), config["metrics"]["listen"]))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe, {})
        if p.get("grpc", {}).get("port") != ports.get("grpc"):
            problems.append("%s is not a gRPC probe on the grpc port" % probe)
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    if int(ann.get("prometheus.io/port", -1)) != ports.get("metrics"):
        problems.append("prometheus.io/port annotation != metrics port")
    svc = load_k8s(K8S + "/base/service.yaml")
    for p in svc["spec"]["ports"]:
        if p["targetPort"] not in ports:
            problems.append("service port %s: targetPort %s is not a "
                            "container port" % (p["name"], p["targetPort"]))
        elif p["port"] != ports[p["targetPort"]]:
            problems.append("service port %s differs from the container's"
                            % p["name"])
    if svc["spec"]["selector"].items() - \
            dep["spec"]["template"]["metadata"]["labels"].items():
        problems.append("service selector does not select the pod")
    netpol = load_k8s(K8S + "/base/networkpolicy.yaml")
    allowed = {p["port"] for rule in netpol["spec"]["ingress"]
               for p in rule["ports"]}
    if allowed != set(ports.values()):
        problems.append("networkpolicy ports %s != container ports %s" % (
            sorted(allowed), sorted(ports.values())))
    # The config file lands where the image's ENTRYPOINT reads it.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    conf_path = [a.split("=", 1)[1] for a in entrypoint_argv("cpu")
                 if a.startswith("--config=")][0]
    cm_vol = [n for n, v in vols.items()
              if v.get("configMap", {}).get("name") == "kvharbord-config"]
    if not cm_vol or mounts.get(cm_vol[0]) + "/kvharbord.yaml" != conf_path:
        problems.append("the ConfigMap is not mounted at the image's %s"
                        % conf_path)
    data_mount = [m for n, m in mounts.items()
                  if "persistentVolumeClaim" in vols.get(n, {})]
    for ns in config.get("namespaces", []):
        d = ns.get("disk_dir")
        if d and not any(d.startswith(m + "/") for m in data_mount):
            problems.append("namespace %s: disk_dir %s is not on the "
                            "persistent volume" % (ns["name"], d))
    # Memory: the pool, the host tier and slack must fit the limit.
    need = parse_size(config["store"]["pool_budget_bytes"]) + sum(
        parse_size(ns.get("host_compressed_bytes", 0))
        for ns in config.get("namespaces", []))
    limit = parse_size(c["resources"]["limits"]["memory"])
    if limit < need + (1 << 30):
        problems.append("memory limit %d < pool + host tiers %d + 1 GiB"
                        % (limit, need))
    disk = sum(parse_size(ns.get("disk_bytes", 0))
               for ns in config.get("namespaces", []))
    pvc = load_k8s(K8S + "/base/pvc.yaml")
    if parse_size(pvc["spec"]["resources"]["requests"]["storage"]) <= disk:
        problems.append("PVC not larger than the sum of disk_bytes")
    # Shutdown: preStop sleep + drain must end before SIGKILL.
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    pre_s = int(pre[1]) if pre[0] == "sleep" else 0
    drain_s = config.get("drain_timeout_ms", 10000) / 1000
    if pod["terminationGracePeriodSeconds"] <= pre_s + drain_s:
        problems.append("terminationGracePeriodSeconds <= preStop + drain")
    uid = [r.split(":")[0] for k, r in stage("cpu").instructions
           if k == "USER"][-1]
    if str(pod["securityContext"]["runAsUser"]) != uid:
        problems.append("runAsUser != the image's USER %s" % uid)
    gpu = load_k8s(K8S + "/gpu/deployment-gpu.yaml")
    gc = gpu["spec"]["template"]["spec"]["containers"][0]
    if gc["name"] != c["name"] or \
            gc["resources"]["limits"].get("nvidia.com/gpu") != 1:
        problems.append("gpu patch does not ask the kvharbord container "
                        "for nvidia.com/gpu: 1")
    # The device arena must hold every namespace of the base ConfigMap.
    arena = [parse_size(a.split("=", 1)[1]) for a in gc.get("args", [])
             if a.startswith("--device_pool_bytes=")]
    ns_bytes = sum(parse_size(ns.get("capacity_bytes", 0))
                   for ns in config.get("namespaces", []))
    if not arena or arena[0] < ns_bytes:
        problems.append("gpu patch's --device_pool_bytes does not hold the "
                        "ConfigMap's namespaces (%d bytes)" % ns_bytes)
    problems += tls_overlay_problems(config, mounts)
    for p in problems:
        print("k8s: " + p)
    return 1 if problems else 0


def compose_flags():
    compose = load_k8s("deploy/docker-compose.yaml")
    return compose["services"]["kvharbord"].get("command", [])


def cmd_compose_static():
    problems = []
    compose = load_k8s("deploy/docker-compose.yaml")
    svc = compose["services"]["kvharbord"]
    config = yaml.safe_load(open(CONTAINER_CONFIG, encoding="utf-8"))
    published = {port_of(p) for p in svc["ports"]}
    want = {port_of(config["listen"]), port_of(config["metrics"]["listen"])}
    if published != want:
        problems.append("published ports %s != the image's %s" % (
            sorted(published), sorted(want)))
    if any(not p.startswith("127.0.0.1:") for p in svc["ports"]):
        problems.append("a port is published beyond loopback (no TLS/auth)")
    if svc["build"]["target"] not in [s.name for s in dockerfile_stages()]:
        problems.append("build target %s is no Dockerfile stage"
                        % svc["build"]["target"])
    prom = load_k8s("deploy/prometheus.yml")
    targets = [t for job in prom["scrape_configs"]
               if job["job_name"] == "kvharbord"
               for sc in job["static_configs"] for t in sc["targets"]]
    if targets != ["kvharbord:%d" % port_of(config["metrics"]["listen"])]:
        problems.append("prometheus scrapes %s, not kvharbord's metrics port"
                        % targets)
    pool = [parse_size(f.split("=", 1)[1]) for f in svc.get("command", [])
            if f.startswith("--pool_bytes=")]
    if pool and parse_size(svc["mem_limit"]) < pool[0]:
        problems.append("mem_limit below --pool_bytes")
    for p in problems:
        print("compose: " + p)
    return 1 if problems else 0


def systemd_execstart(path="deploy/systemd/kvharbord.service"):
    for line in open(path, encoding="utf-8"):
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    sys.exit("deploy_check: no ExecStart in " + path)


def cmd_library_packages(paths):
    """Debian packages owning the shared libraries that the ELF files among
    `paths` load (ldd), one dpkg -S call for all; exit 1 if one has none."""
    libs = set()
    for p in paths:
        with open(p, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        out = subprocess.run(["ldd", p], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            m = re.search(r"=> (/\S+)", line)
            if m:
                libs.add(m.group(1))
    # KVH_IGNORE_LIB_PREFIX: libraries the image's own build does not link.
    # The CPU stage builds with -DKVHARBOR_CUDA=OFF, but this test installs
    # the prebuilt BUILD_DIR, which CI configures with CUDA when nvcc is
    # present (kvharbor-calibrate then links cuBLAS/cuSOLVER from the
    # toolkit, which no Debian package owns).
    ignore = os.environ.get("KVH_IGNORE_LIB_PREFIX", "")
    if ignore:
        libs = {lib for lib in libs
                if not os.path.realpath(lib).startswith(ignore)}
    if not libs:
        print("library-packages: no libraries found")
        return 1
    variants = {}
    for lib in libs:
        real = os.path.realpath(lib)
        names = {lib, real}
        for n in list(names):  # usrmerge: /lib and /usr/lib are one place
            names.add(n[4:] if n.startswith("/usr/") else "/usr" + n)
        variants[lib] = names
    query = sorted(set().union(*variants.values()))
    out = subprocess.run(["dpkg", "-S"] + query, capture_output=True,
                         text=True).stdout
    owner = {}
    for line in out.splitlines():
        pkgs, _, path = line.partition(": ")
        owner[path] = pkgs.split(",")[0].split(":")[0].strip()
    status, found = 0, set()
    for lib, names in sorted(variants.items()):
        pkgs = {owner[n] for n in names if n in owner}
        if not pkgs:
            print("library-packages: no package owns " + lib)
            status = 1
        found |= pkgs
    print("\n".join(sorted(found)))
    return status


def main(argv):
    cmd = argv[0]
    if cmd == "dockerfile-static":
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True, text=True).stdout.split()
        return cmd_dockerfile_static(files)
    if cmd == "context-files":
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True, text=True).stdout.split("\n")
        files = [f for f in files if f and os.path.isfile(f)]
        print("\n".join(sorted(set(files) - set(dockerignore_excludes(files)))))
    elif cmd == "library-packages":
        return cmd_library_packages(argv[1:])
    elif cmd == "build-run":
        # argv[2]: a directory standing in for the image's / (the RUN line's
        # /build and /opt/kvharbor move under it).
        run = build_run(argv[1])
        if len(argv) > 2:
            run = re.sub(r"(?<=[\s=])/build(?=\s|$)", argv[2] + "/build", run)
            run = re.sub(r"(?<=[\s=])/opt/kvharbor(?=[\s/]|$)",
                         argv[2] + "/opt/kvharbor", run)
        print(run)
    elif cmd == "apt-packages":
        print("\n".join(apt_packages(argv[1])))
    elif cmd == "healthcheck":
        print("\n".join(healthcheck_argv(argv[1])))
    elif cmd == "entrypoint":
        print("\n".join(entrypoint_argv(argv[1])))
    elif cmd == "configmap-config":
        sys.stdout.write(configmap_config())
    elif cmd == "k8s-static":
        return cmd_k8s_static()
    elif cmd == "compose-flags":
        print("\n".join(compose_flags()))
    elif cmd == "compose-static":
        return cmd_compose_static()
    elif cmd == "systemd-execstart":
        print("\n".join(systemd_execstart()))
    else:
        sys.exit("deploy_check: unknown subcommand " + cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
