#!/usr/bin/env python3
"""The Kubernetes manifests of deploy/k8s: schema, policy and the placeholder token.

1. Schema: every object validates against the Kubernetes 1.28 schema (the oldest release
   docs/operations.md supports), strictly (no unknown keys), with kubernetes-validate
   from PyPI, which bundles the schemas and runs offline. It lives in a small virtual
   environment of its own under ~/.cache/tessera/ (made on first use; the Debian packages
   python3-venv and python3-pip, as tests/run.sh installs them). The TFJob's pod templates
   are validated as Pods (the TFJob itself is a CRD, without a schema here).
2. Lint: every pod passes the `restricted` Pod Security Standard (v1.28): runAsNonRoot,
   no root uid, seccomp RuntimeDefault or Localhost, allowPrivilegeEscalation false,
   capabilities drop ALL (add at most NET_BIND_SERVICE), nothing privileged or on the
   host, only the allowed volume types; every container has memory requests and limits
   (limit >= request); the shards have a PodDisruptionBudget; a NetworkPolicy limits each
   pod's ports, naming the admin port, and opens none wholesale; the Job's
   podFailurePolicy names its real container and fails the Job on exit 2 and 78.
3. The Secret's placeholder is refused as a token: its value is Tessera's
   TS_AUTH_PLACEHOLDER_TOKEN (net/ts_auth.h), and ps-server, psctl (and ps-worker where
   Fashion-MNIST is installed) given a token file holding it exit 78 saying so.

Exits 77 (skip), saying why, when PyYAML is missing, or when kubernetes-validate could
not be installed and every other check passed.

usage: check_k8s.py SOURCE_ROOT PS_SERVER PSCTL PS_WORKER
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

root, ps_server, psctl, ps_worker = sys.argv[1:5]
VALIDATOR = "kubernetes-validate==1.37.0"
K8S_VERSION = "1.28.0"
failures = []
skipped = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


k8s = os.path.join(root, "deploy", "k8s")
files = sorted(os.path.join(k8s, n) for n in os.listdir(k8s) if n.endswith(".yaml"))
objects = []
for path in files:
    with open(path) as f:
        objects += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d]


def pod_templates():
    """(where, pod template) of every object that makes pods."""
    for name, doc in objects:
        kind, obj = doc["kind"], doc["metadata"]["name"]
        if kind == "TFJob":
            for rtype, spec in doc["spec"]["tfReplicaSpecs"].items():
                yield f"{name}: TFJob {obj} {rtype}", spec["template"]
        elif kind in ("StatefulSet", "Job", "Deployment", "DaemonSet"):
            yield f"{name}: {kind} {obj}", doc["spec"]["template"]


# --- 1. the 1.28 schema -----------------------------------------------------------------
def validator():
    """The kubernetes-validate program of the cached venv, made when missing; None (and a
    skip noted) when it cannot be made."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = VALIDATOR.replace("==", "-") + f"-py{sys.version_info[0]}.{sys.version_info[1]}"
    venv = os.path.join(cache, "tessera", tag)
    prog = os.path.join(venv, "bin", "kubernetes-validate")
    ready = os.path.join(venv, ".tessera-ready")
    if os.path.exists(ready):
        os.utime(ready)  # in use: python/venv.sh removes venvs here unused for a week
        return prog
    # Made in place (a venv's scripts name their interpreter by path); marked ready only
    # once complete, so a half-made one is made again.
    shutil.rmtree(venv, ignore_errors=True)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    for cmd in ([sys.executable, "-m", "venv", venv],
                [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", VALIDATOR]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            r, why = None, str(e)
        if r is None or r.returncode != 0:
            skipped.append(f"could not install {VALIDATOR} into {venv} ({why}): the schema check "
                           "did not run (it needs python3-venv, python3-pip and PyPI)")
            shutil.rmtree(venv, ignore_errors=True)
            return None
    open(ready, "w").close()
    return prog


prog = validator()
if prog:
    with tempfile.TemporaryDirectory() as d:
        # The TFJob's pod templates as Pods, the only part of a CRD the schema knows.
        pods = []
        for where, tpl in pod_templates():
            if "TFJob" in where:
                name = re.sub(r"[^a-z0-9-]", "-", where.split("TFJob ")[1].lower())
                pods.append({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": name, **tpl.get("metadata", {})},
                             "spec": tpl["spec"]})
        extra = os.path.join(d, "tfjob-pods.yaml")
        with open(extra, "w") as f:
            yaml.safe_dump_all(pods, f)
        # Through the venv's python: its scripts' #! lines name the venv's path at making.
        python = os.path.join(os.path.dirname(prog), "python")
        r = subprocess.run([python, prog, "-k", K8S_VERSION, "--strict", *files, extra],
                           capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        print(out.strip())
        check(r.returncode == 0, f"deploy/k8s does not validate against Kubernetes {K8S_VERSION}")
        passed = len(re.findall(r"^INFO .* passed for resource", out, re.M))
        want = sum(1 for _, doc in objects if doc["kind"] != "TFJob") + len(pods)
        check(passed == want, f"{passed} objects validated, {want} expected")

# --- 2. lint: restricted Pod Security Standard, resources, PDB, NetworkPolicy ----------
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}


def quantity(q):
    """Bytes of a memory quantity (1Gi, 512Mi, 2G, 1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTPE]i?)?", str(q))
    if not m:
        return None
    mult = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return float(m.group(1)) * mult[m.group(2) or ""]


shard_labels = None
for where, tpl in pod_templates():
    spec = tpl["spec"]
    pod_sc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not spec.get(key), f"{where}: {key}")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        check(kinds <= ALLOWED_VOLUMES, f"{where}: volume {v['name']} is {kinds}, not allowed by restricted")
    check(pod_sc.get("runAsUser", 1) != 0, f"{where}: runAsUser 0")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        cw = f"{where} container {c['name']}"
        check(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, f"{cw}: runAsNonRoot is not true")
        check(sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, f"{cw}: runs as uid 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        check(seccomp in ("RuntimeDefault", "Localhost"),
              f"{cw}: seccompProfile {seccomp}, restricted needs RuntimeDefault or Localhost")
        check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation is not false")
        check(not sc.get("privileged"), f"{cw}: privileged")
        caps = sc.get("capabilities", {})
        check("ALL" in caps.get("drop", []), f"{cw}: capabilities do not drop ALL")
        check(set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"{cw}: adds capabilities {caps.get('add')}")
        check(all("hostPort" not in p for p in c.get("ports", [])), f"{cw}: hostPort")
        res = c.get("resources", {})
        req = quantity(res.get("requests", {}).get("memory"))
        lim = quantity(res.get("limits", {}).get("memory"))
        check(req is not None and lim is not None, f"{cw}: needs memory requests and limits")
        check(req is None or lim is None or lim >= req, f"{cw}: memory limit below the request")
    if "StatefulSet tessera-ps" in where:
        shard_labels = tpl["metadata"]["labels"]


def by_kind(kind):
    return [doc for _, doc in objects if doc["kind"] == kind]


def selects(selector, labels):
    return labels is not None and all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


pdbs = [p for p in by_kind("PodDisruptionBudget") if selects(p["spec"]["selector"], shard_labels)]
check(len(pdbs) == 1, "the shards need one PodDisruptionBudget")
for p in pdbs:
    s = p["spec"]
    check(("maxUnavailable" in s) != ("minAvailable" in s), "the PDB needs maxUnavailable or minAvailable")
    check(s.get("maxUnavailable") != 0, "maxUnavailable 0 would block every node drain")

policies = by_kind("NetworkPolicy")
for where, tpl in pod_templates():
    if "TFJob" in where:  # the operator's pods carry its labels, not ours
        continue
    labels = tpl["metadata"]["labels"]
    mine = [n for n in policies if selects(n["spec"]["podSelector"], labels)]
    check(mine, f"{where}: no NetworkPolicy selects its pods")
    ports = {p["name"] for c in tpl["spec"]["containers"] for p in c.get("ports", [])}
    for n in mine:
        check("Ingress" in n["spec"].get("policyTypes", []), f"NetworkPolicy {n['metadata']['name']}: not Ingress")
        opened = set()
        for rule in n["spec"].get("ingress", []):
            check(rule.get("ports"), f"NetworkPolicy {n['metadata']['name']}: a rule opens every port")
            check(rule.get("from"), f"NetworkPolicy {n['metadata']['name']}: a rule admits everyone")
            opened |= {p["port"] for p in rule.get("ports", [])}
        check("admin" in opened, f"NetworkPolicy {n['metadata']['name']}: the admin port is not named")
        check(opened <= ports, f"NetworkPolicy {n['metadata']['name']}: ports {opened - ports} are not the pod's")

for job in by_kind("Job"):
    tspec = job["spec"]["template"]["spec"]
    names = {c["name"] for c in tspec["containers"]}
    pfp = job["spec"].get("podFailurePolicy", {}).get("rules", [])
    check(tspec.get("restartPolicy") == "Never", "a Job with podFailurePolicy needs restartPolicy Never")
    fail = [r for r in pfp if r["action"] == "FailJob" and r.get("onExitCodes")]
    check(fail and all(r["onExitCodes"].get("containerName") in names for r in fail),
          f"Job {job['metadata']['name']}: podFailurePolicy names no container of the Job")
    codes = {v for r in fail for v in r["onExitCodes"]["values"] if r["onExitCodes"]["operator"] == "In"}
    check({2, 78} <= codes, f"Job {job['metadata']['name']}: exit 2 and 78 must fail the Job at once")

# --- 3. the placeholder token ------------------------------------------------------------
with open(os.path.join(root, "net", "ts_auth.h")) as f:
    m = re.search(r'#define TS_AUTH_PLACEHOLDER_TOKEN "([^"]+)"', f.read())
placeholder = m.group(1) if m else None
check(placeholder, "net/ts_auth.h defines no TS_AUTH_PLACEHOLDER_TOKEN")
secrets = by_kind("Secret")
check(len(secrets) == 1 and secrets[0]["stringData"]["token"] == placeholder,
      "the Secret's token must be Tessera's placeholder (TS_AUTH_PLACEHOLDER_TOKEN), which every daemon refuses")

if placeholder:
    with tempfile.TemporaryDirectory() as d:
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write(placeholder + "\n")  # as the Secret's volume holds it, give or take the line end
        cfg = os.path.join(d, "job.cfg")
        with open(cfg, "w") as f:
            f.write('cluster = { ps = ["127.0.0.1:1"]; ps_http = ["127.0.0.1:2"]; workers = ["127.0.0.1:3"]; };\n'
                    'model = { layers = [784, 16, 10]; };\n'
                    f'auth = {{ token_file = "{token}"; }};\n')
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        runs = [("ps-server", [ps_server, "-c", cfg, "--shard", "0"]), ("psctl", [psctl, "-c", cfg, "health"])]
        if os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
            runs.append(("ps-worker", [ps_worker, "-c", cfg, "--task", "0"]))
        else:
            print("note: no Fashion-MNIST (dataset-fashion-mnist): ps-worker's refusal is left to "
                  "unit client_offline (it reads tokens through the same call)")
        for name, argv in runs:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
            said = "holds the placeholder" in r.stderr and token in r.stderr
            check(r.returncode == 78 and said,
                  f"{name} with the placeholder token: exit {r.returncode}, stderr: {r.stderr.strip()[-400:]}")

for s in skipped:
    print("SKIP:", s)
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
sys.exit(77 if skipped else 0)
