#!/usr/bin/env python3
"""Static checks of deploy/docker and deploy/k8s.

Every YAML file parses; the Kubernetes objects are exactly those docs/operations.md lists
(its table of `| deploy/k8s/FILE | Kind | name |` rows); shards and workers have /livez and
/readyz probes; the job files inside (ConfigMaps, deploy/docker/job.cfg, the systemd
example) load with Tessera's own config loader (psctl); the Dockerfile's default target is
the CPU image; docker-compose.yml has two shards with psctl healthchecks, workers that
wait for them to be healthy, a GPU profile with device reservations and checkpoint
volumes, and passes `docker compose config` /
`docker-compose config` where either works. Exits 77 (skip), saying why, without PyYAML,
or after the other checks when neither compose tool is installed (CONTRIBUTING.md: a
check that needs something optional).

usage: check_deploy.py SOURCE_ROOT PSCTL
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (apt-get install python3-yaml)")
    sys.exit(77)

root, psctl = sys.argv[1], sys.argv[2]
failures = []
skipped = []  # checks that could not run here: the test exits 77 unless one failed


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


TF_CONFIG = ('{"cluster": {"ps": ["tessera-tfjob-ps-0:2222", "tessera-tfjob-ps-1:2222"], '
             '"worker": ["tessera-tfjob-worker-0:2222", "tessera-tfjob-worker-1:2222"]}, '
             '"task": {"type": "ps", "index": 0}}')


def load_job_file(text, where, tf_config=None):
    """Tessera's loader accepts the job: --shard 255 gets exit 2 (no such shard) only after
    the file loaded; a bad file gives 78. tf_config: the TF_CONFIG the operator injects."""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as f:
        f.write(text)
    try:
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if tf_config:
            env["TF_CONFIG"] = tf_config
        r = subprocess.run([psctl, "-c", f.name, "--shard", "255", "health"],
                           capture_output=True, text=True, timeout=30, env=env)
        check(r.returncode == 2 and "shard(s)" in r.stderr,
              f"{where}: the job file does not load: exit {r.returncode}: {r.stderr.strip()}")
    finally:
        os.unlink(f.name)


# --- Kubernetes ---------------------------------------------------------------------
k8s = os.path.join(root, "deploy", "k8s")
found = set()
objects = {}
for name in sorted(os.listdir(k8s)):
    if not name.endswith(".yaml"):
        continue
    with open(os.path.join(k8s, name)) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            key = (f"deploy/k8s/{name}", doc["kind"], doc["metadata"]["name"])
            found.add(key)
            objects[key[1:]] = doc

with open(os.path.join(root, "docs", "operations.md")) as f:
    guide = f.read()
listed = set(re.findall(r"^\| `(deploy/k8s/[\w.-]+)` \| (\w+) \| `([\w.-]+)` \|", guide, re.M))
check(listed, "docs/operations.md lists no Kubernetes objects")
for k in sorted(found - listed):
    check(False, f"{k[0]}: {k[1]} {k[2]} is not in docs/operations.md")
for k in sorted(listed - found):
    check(False, f"docs/operations.md names {k[1]} {k[2]} in {k[0]}, which has no such object")


def containers(doc):
    kind = doc["kind"]
    if kind == "TFJob":
        for spec in doc["spec"]["tfReplicaSpecs"].values():
            yield from spec["template"]["spec"]["containers"]
    else:
        yield from doc["spec"]["template"]["spec"]["containers"]


for (kind, name), doc in objects.items():
    if kind in ("StatefulSet", "Job", "TFJob"):
        for c in containers(doc):
            live = c.get("livenessProbe", {}).get("httpGet", {}).get("path")
            ready = c.get("readinessProbe", {}).get("httpGet", {}).get("path")
            check(live == "/livez", f"{kind} {name}: container {c['name']} probes liveness on {live}")
            check(ready == "/readyz", f"{kind} {name}: container {c['name']} probes readiness on {ready}")
    if kind == "ConfigMap":
        load_job_file(doc["data"]["job.cfg"], f"ConfigMap {name}",
                      TF_CONFIG if name == "tessera-tfjob" else None)
sts = objects.get(("StatefulSet", "tessera-ps"))
svc = objects.get(("Service", "tessera-ps"))
check(sts and svc and sts["spec"]["serviceName"] == "tessera-ps" and svc["spec"]["clusterIP"] == "None",
      "the shards' StatefulSet must name its headless Service")
job = objects.get(("Job", "tessera-worker"))
check(job and job["spec"]["completionMode"] == "Indexed", "the workers' Job must be Indexed")
check(job and job["spec"]["template"]["spec"].get("subdomain") == "tessera-worker",
      "the workers' pods must have the subdomain of their headless Service")
tf = objects.get(("TFJob", "tessera-tfjob"))
check(tf and set(tf["spec"]["tfReplicaSpecs"]) == {"PS", "Worker"}, "the TFJob needs PS and Worker replicas")
if tf:
    for spec in tf["spec"]["tfReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            check("--shard" not in c["command"] and "--task" not in c["command"],
                  "TFJob commands must take their index from TF_CONFIG")

# --- docker ---------------------------------------------------------------------------
docker = os.path.join(root, "deploy", "docker")
with open(os.path.join(docker, "docker-compose.yml")) as f:
    compose = yaml.safe_load(f)
svcs = compose["services"]
for s in ("ps0", "ps1"):
    hc = svcs[s].get("healthcheck", {}).get("test", [])
    check("psctl" in hc and "health" in hc, f"compose: {s} has no psctl health healthcheck")
    check(any(":/var/lib/tessera" in v for v in svcs[s].get("volumes", [])),
          f"compose: {s} has no checkpoint volume")
for w in ("worker0", "worker1", "worker0-gpu", "worker1-gpu"):
    dep = svcs[w].get("depends_on", {})
    check(all(dep.get(s, {}).get("condition") == "service_healthy" for s in ("ps0", "ps1")),
          f"compose: {w} does not wait for healthy shards")
for w in ("worker0-gpu", "worker1-gpu"):
    check(svcs[w].get("profiles") == ["gpu"], f"compose: {w} is not in the gpu profile")
    devs = svcs[w].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    check(devs and all("gpu" in d.get("capabilities", []) for d in devs),
          f"compose: {w} reserves no GPU")
with open(os.path.join(docker, "job.cfg")) as f:
    load_job_file(f.read(), "deploy/docker/job.cfg")
with open(os.path.join(root, "deploy", "systemd", "job.cfg.example")) as f:
    load_job_file(f.read(), "deploy/systemd/job.cfg.example")
with open(os.path.join(docker, "Dockerfile")) as f:
    dockerfile = f.read()
stages = set(re.findall(r"^FROM \S+ AS (\S+)", dockerfile, re.M))
check({"build", "runtime", "build-cuda", "worker-cuda"} <= stages, f"Dockerfile stages: {stages}")
# `docker build` without --target builds the last stage: it must be the CPU image.
bases = re.findall(r"^FROM (\S+)", dockerfile, re.M)
check(bases and bases[-1] == "runtime",
      f"Dockerfile: the last stage (the default target) is FROM {bases[-1:]}, not FROM runtime")

tool = None
if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                             capture_output=True).returncode == 0:
    tool = ["docker", "compose"]
elif shutil.which("docker-compose"):
    tool = ["docker-compose"]
if tool:
    for profile in ("cpu", "gpu"):
        r = subprocess.run(tool + ["config", "-q"], cwd=docker, capture_output=True, text=True,
                           env=dict(os.environ, COMPOSE_PROFILES=profile))
        check(r.returncode == 0, f"{' '.join(tool)} config ({profile}): {r.stderr.strip()}")
    print(f"{' '.join(tool)} config: checked")
else:
    skipped.append("neither `docker compose` nor docker-compose is installed "
                   "(apt-get install docker-compose): `compose config` not run")
    print("SKIP:", skipped[-1])

print(f"deploy: {len(found)} Kubernetes objects, {len(svcs)} compose services;",
      "FAILED" if failures else "skipped in part" if skipped else "ok")
sys.exit(1 if failures else 77 if skipped else 0)
