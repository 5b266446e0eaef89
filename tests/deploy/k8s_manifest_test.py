#!/usr/bin/env python3
"""deploy/k8s: the manifests parse as YAML and hold what a sharded replay
needs (kubectl apply --dry-run=client needs a cluster; this does not).

Each replay Job: an Indexed Job whose completions, parallelism and
`--shard /N` agree, that takes K from JOB_COMPLETION_INDEX, starts every
shard at one --start-at, mounts the trace the replay reads and writes each
shard's report where the merge Job reads them. And deploy/Dockerfile's
build stage installs every library scripts/setup installs for building.
Exit 0 when all hold, 1
with one line per failure otherwise."""
import glob
import os
import sys

import yaml

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
k8s = os.path.join(root, "deploy", "k8s")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def mounts(container):
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def arg_after(args, flag):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


replay_jobs = sorted(glob.glob(os.path.join(k8s, "replay-job*.yaml")))
check(len(replay_jobs) >= 1, f"{k8s}: no replay-job*.yaml")
report_claims = set()
for path in replay_jobs:
    name = os.path.relpath(path, root)
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    check(len(docs) == 1, f"{name}: expected one document, found {len(docs)}")
    job = docs[0]
    check(job.get("apiVersion") == "batch/v1" and job.get("kind") == "Job", f"{name}: not a batch/v1 Job")
    spec = job["spec"]
    check(spec.get("completionMode") == "Indexed", f"{name}: completionMode is {spec.get('completionMode')!r}, not Indexed")
    pod = spec["template"]["spec"]
    check(pod.get("restartPolicy") == "Never", f"{name}: restartPolicy is not Never")
    replay = [c for c in pod["containers"] if c.get("args", [None])[0] == "replay"]
    check(len(replay) == 1, f"{name}: no container runs tierlab replay")
    if not replay:
        continue
    c = replay[0]
    args = [str(a) for a in c["args"]]
    shard = arg_after(args, "--shard")
    check(shard is not None and shard.startswith("/"), f"{name}: --shard is {shard!r}, not /N (K from the index)")
    n = int(shard[1:]) if shard and shard[1:].isdigit() else None
    check(n is not None and n >= 2, f"{name}: --shard {shard!r} names no N of 2 or more")
    check(spec.get("completions") == n, f"{name}: completions {spec.get('completions')} is not N={n} of --shard")
    check(spec.get("parallelism") == n, f"{name}: parallelism {spec.get('parallelism')} is not N={n}: the shards must run at once")
    env = {e["name"]: e for e in c.get("env", [])}
    idx = env.get("JOB_COMPLETION_INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
    check("job-completion-index" in idx, f"{name}: JOB_COMPLETION_INDEX not from the job-completion-index annotation")
    start = arg_after(args, "--start-at")
    check(start == "$(START_AT)" and "START_AT" in env, f"{name}: --start-at is not one value for every shard ($(START_AT))")
    check(arg_after(args, "--db") is not None, f"{name}: no --db")
    # The trace the replay reads is on a mounted volume.
    trace = args[1]
    m = mounts(c)
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    tvol = [v for v, p in m.items() if trace.startswith(p.rstrip("/") + "/")]
    check(len(tvol) == 1 and tvol[0] in vols, f"{name}: the trace {trace} is on no volume of the pod")
    if tvol and tvol[0] in vols:
        v = vols[tvol[0]]
        if "emptyDir" in v:  # filled by an init container
            inits = pod.get("initContainers", [])
            check(any(tvol[0] in mounts(i) and trace in " ".join(map(str, i.get("command", []) + i.get("args", [])))
                      for i in inits), f"{name}: the trace volume is an emptyDir no init container fills with {trace}")
        else:
            check("persistentVolumeClaim" in v, f"{name}: the trace volume is neither a claim nor filled by an init container")
    # Each shard's report, by index, on the reports claim.
    out = arg_after(args, "--json") or ""
    check("$(JOB_COMPLETION_INDEX)" in out, f"{name}: --json {out!r} is not one file per shard")
    rvol = [v for v, p in m.items() if out.startswith(p.rstrip("/") + "/")]
    check(len(rvol) == 1 and "persistentVolumeClaim" in vols.get(rvol[0] if rvol else "", {}),
          f"{name}: the reports are not on a volume claim")
    if rvol and "persistentVolumeClaim" in vols.get(rvol[0], {}):
        report_claims.add((vols[rvol[0]]["persistentVolumeClaim"]["claimName"], os.path.dirname(out)))

# The merge reads the shards' reports from the same claim.
merge_path = os.path.join(k8s, "merge-job.yaml")
check(os.path.exists(merge_path), "deploy/k8s/merge-job.yaml is missing")
if os.path.exists(merge_path):
    with open(merge_path) as f:
        merge = yaml.safe_load(f)
    pod = merge["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cmd = " ".join(map(str, c.get("command", []) + c.get("args", [])))
    check("tierlab report merge" in cmd, "merge-job.yaml: does not run tierlab report merge")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for claim, directory in report_claims:
        ok = any(vols.get(v, {}).get("persistentVolumeClaim", {}).get("claimName") == claim and
                 f"{directory}/shard-" in cmd and p.rstrip("/") == directory for v, p in mounts(c).items())
        check(ok, f"merge-job.yaml: does not read the shards' reports {directory}/shard-* from claim {claim}")

# The image's build stage installs every library scripts/setup installs for
# building (its -dev packages), so that the image builds where the tests do.
import re

with open(os.path.join(root, "scripts", "setup")) as f:
    setup = f.read()
listed = re.search(r"^packages=\((.*?)^\)", setup, re.S | re.M)
check(listed is not None, "scripts/setup: no packages=( ... ) list")
needed = set(re.findall(r"\b(lib[\w.+-]*-dev)\b", listed.group(1) if listed else ""))
with open(os.path.join(root, "deploy", "Dockerfile")) as f:
    docker = f.read()
build_stage = docker.split("FROM ", 2)[1] if docker.count("FROM ") >= 2 else docker
for pkg in sorted(needed):
    check(re.search(rf"\b{re.escape(pkg)}\b", build_stage) is not None,
          f"deploy/Dockerfile: the build stage does not install {pkg}, which scripts/setup installs for building")

for f in failures:
    print("FAIL:", f)
print(f"{len(replay_jobs)} replay manifests checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
