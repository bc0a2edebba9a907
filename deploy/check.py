#!/usr/bin/env python3
"""Checks the deployment files under deploy/ against Kubernetes' schemas and
against the code they deploy.

    python3 deploy/check.py [path/to/strata]

- deploy/kubernetes/*.yaml: every document validates against the Kubernetes
  JSON schemas of K8S_VERSION in strict mode (kubernetes-validate: an unknown
  field is an error); no document names a namespace; every `strata peer
  serve` container uses only flags the binary lists (with a binary) and a
  memory limit that covers the budgets its flags give (docs/protocol.md);
  every STRATA_* variable is one Strata reads; every $(VAR) in a command or
  its args is a variable the container defines; every strata.toml in a
  ConfigMap uses only keys of the Rust Config.
- deploy/grafana/strata-dashboard.json: every strata_* series a query names
  is one peer/src/metrics.rs or client/src/metrics/mod.rs renders (a
  histogram only as _bucket, _sum or _count).
- deploy/systemd/strata-peer.service: ExecStart runs `strata peer serve`
  with flags the binary lists (with a binary), and `systemd-analyze verify`
  accepts the unit (where systemd-analyze exists; skipped otherwise).

Needs python3 and kubernetes-validate (`pip install kubernetes-validate`,
which brings PyYAML). Exits 1 naming every problem, 0 when all is well.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

K8S_VERSION = "1.30"
# Connections of a peer service sending or receiving at once, for its
# memory bound: every rank keeps a connection to each peer it has talked
# to (--max-connections counts those), but only the ranks replicating to
# a node or restoring from it keep their QUIC windows full
# (peer-daemonset.yaml's header).
BUSY_CONNECTIONS = 32
ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def rel(p):
    return os.path.relpath(p, ROOT)


# ---------------------------------------------------------------- the code


def metric_names():
    """(every strata_* name the two metrics files write literally, the
    histograms among them)."""
    names, histograms = set(), set()
    peer = (ROOT / "peer/src/metrics.rs").read_text()
    client = (ROOT / "client/src/metrics/mod.rs").read_text()
    for text in (peer, client):
        names |= set(re.findall(r'"(strata_[a-z0-9_]+)"', text))
        # `("strata_x", "histogram", ...)` or `let name = "strata_x"; head(&mut out, name, "histogram", ...)`
        histograms |= set(re.findall(r'"(strata_[a-z0-9_]+)",\s*"histogram"', text))
        histograms |= set(
            re.findall(
                r'let name = "(strata_[a-z0-9_]+)";\s*head\(\s*&mut out,\s*name,\s*"histogram"',
                text,
            )
        )
    # The client renders its histograms from one table: `for (h, name, help) in [...] { h.render(`.
    m = re.search(r"for \(h, name, help\) in \[(.*?)\]\s*\{\s*h\.render\(", client, re.S)
    if m:
        histograms |= set(re.findall(r'"(strata_[a-z0-9_]+)"', m.group(1)))
    if not histograms:
        problem("deploy/check.py", "found no histogram in the metrics code: its shape changed, update metric_names()")
    return names, histograms


def env_settings():
    """The STRATA_* variables Strata reads: the Config's settings
    (client/src/config/env_names.rs) and the binaries' own."""
    text = (ROOT / "client/src/config/env_names.rs").read_text()
    m = re.search(r"pub\(crate\) const SETTINGS: &\[&str\] = &\[(.*?)\];", text, re.S)
    if not m:
        problem("deploy/check.py", "cannot find SETTINGS in client/src/config/env_names.rs")
        return set()
    settings = {"STRATA_" + s for s in re.findall(r'"([A-Z0-9_]+)"', m.group(1))}
    # Read by the binaries themselves: the log filter (cli/src/main.rs) and
    # the QUIC MTU (peer/src/tls.rs).
    return settings | {"STRATA_LOG", "STRATA_QUIC_MTU"}


def config_keys():
    """The keys a strata.toml may use: the Rust Config's public fields."""
    text = (ROOT / "client/src/config/mod.rs").read_text()
    m = re.search(r"pub struct Config \{(.*?)\n\}", text, re.S)
    if not m:
        problem("deploy/check.py", "cannot find `pub struct Config` in client/src/config/mod.rs")
        return set()
    return set(re.findall(r"^\s*pub (\w+):", m.group(1), re.M))


def serve_flags(binary):
    """The long flags `strata peer serve --help` lists (None without a binary)."""
    if not binary:
        return None
    try:
        out = subprocess.run(
            [binary, "peer", "serve", "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        problem(binary, f"`peer serve --help` failed: {e}")
        return None
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", out, re.M))
    if "--node" not in flags:
        problem(binary, "`peer serve --help` lists no --node: is this the strata binary?")
    return flags


def check_flags(where, args, flags):
    """`args` (after `peer serve`) use only `flags`."""
    for a in args:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            if flags is not None and flag not in flags:
                problem(where, f"`strata peer serve` has no flag {flag} (see `strata peer serve --help`)")


# ---------------------------------------------------------------- sizes

BINARY = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
QUANTITY = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def strata_size(s):
    """A size as `strata` parses it (cli/src/size.rs)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", s)
    if not m or m.group(2).lower() not in BINARY:
        raise ValueError(f"{s!r} is not a size")
    return int(float(m.group(1)) * BINARY[m.group(2).lower()])


def quantity(s):
    """A Kubernetes memory quantity."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(s))
    if not m or m.group(2) not in QUANTITY:
        raise ValueError(f"{s!r} is not a quantity this check knows")
    return int(float(m.group(1)) * QUANTITY[m.group(2)])


def memory_bound(where, args):
    """(the budgets, the bound of docs/protocol.md) of `strata peer serve` args."""
    vals = {}
    for a in args:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            vals[k] = v
    need = ["--memory", "--manifest-memory", "--inflight", "--work", "--max-connections"]
    missing = [f for f in need if f not in vals]
    if missing:
        problem(where, f"set {', '.join(missing)} explicitly (as --flag=value) so the memory limit can be checked")
        return None
    try:
        mem, manifest, inflight, work = (strata_size(vals[f]) for f in need[:4])
        conns = int(vals["--max-connections"])
        max_chunk = strata_size(vals.get("--max-chunk", "64MiB"))
    except ValueError as e:
        problem(where, str(e))
        return None
    # peer/src/service/mod.rs: the request budget is at least 4 largest
    # requests; one connection's windows are 2 x its share of it.
    max_request = max_chunk + 8192
    inflight = max(inflight, 4 * max_request)
    window = 2 * max(inflight // 4, max_request)
    # Pooled request buffers (replicas and requests in flight) are up to
    # 1/32 larger than their bytes (peer/src/service/arena.rs).
    budgets = mem + manifest + inflight + work + (mem + inflight) // 32
    return budgets, budgets + min(conns, BUSY_CONNECTIONS) * window + (1 << 30)


# ---------------------------------------------------------------- Kubernetes


def containers(doc):
    spec = doc.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or (spec if doc.get("kind") == "Pod" else {})
    return pod, (pod.get("initContainers") or []) + (pod.get("containers") or [])


def check_kubernetes(flags, settings, keys):
    try:
        import kubernetes_validate
        import yaml
    except ImportError:
        problem("deploy/check.py", "kubernetes-validate is not installed: pip install kubernetes-validate")
        return 0
    files = sorted(p for p in (DEPLOY / "kubernetes").rglob("*") if p.suffix in (".yaml", ".yml"))
    if not files:
        problem("deploy/kubernetes", "no manifests")
    count = 0
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problem(rel(f), f"not YAML: {e}")
            continue
        for doc in docs:
            count += 1
            if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                problem(rel(f), "a document without apiVersion and kind")
                continue
            name = f"{rel(f)}: {doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(top)"
                problem(name, f"does not validate against Kubernetes {K8S_VERSION} (strict): {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                problem(name, e.message)
            except Exception as e:  # the library's own errors (unsupported version, bad schema)
                problem(name, f"cannot be validated: {getattr(e, 'message', e)}")
            if (doc.get("metadata") or {}).get("namespace"):
                problem(name, "names a namespace: the manifests are applied with `kubectl -n NS`")
            check_pods(name, doc, flags, settings)
            if doc["kind"] == "ConfigMap":
                for key, text in (doc.get("data") or {}).items():
                    if key.endswith(".toml"):
                        check_toml(f"{name}: {key}", text, keys)
    return count


def check_pods(name, doc, flags, settings):
    pod, cs = containers(doc)
    for c in cs:
        where = f"{name}: container {c.get('name')}"
        env = {e.get("name") for e in c.get("env") or []}
        for v in sorted(env):
            if v and v.startswith("STRATA_") and v not in settings:
                problem(where, f"{v} is not a variable Strata reads (client/src/config/env_names.rs)")
        line = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        for a in line:
            for v in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                if v not in env:
                    problem(where, f"$({v}) is not defined in the container's env: Kubernetes would pass it literally")
            for v in re.findall(r"\bSTRATA_[A-Z0-9_]+(?==)", a):
                if v not in settings:
                    problem(where, f"{v} is not a variable Strata reads (client/src/config/env_names.rs)")
        if "peer" in line and "serve" in line and line.index("serve") == line.index("peer") + 1:
            args = line[line.index("serve") + 1:]
            check_flags(where, args, flags)
            bound = memory_bound(where, args)
            res = c.get("resources") or {}
            if bound:
                budgets, worst = bound
                try:
                    limit = quantity((res.get("limits") or {}).get("memory", "0"))
                    request = quantity((res.get("requests") or {}).get("memory", "0"))
                except ValueError as e:
                    problem(where, str(e))
                    continue
                gib = 1 << 30
                if limit < worst:
                    problem(where, f"memory limit {limit / gib:.1f} GiB is under the service's bound {worst / gib:.1f} GiB "
                                   f"(budgets + {BUSY_CONNECTIONS} busy connections x QUIC windows + 1 GiB)")
                if request < budgets:
                    problem(where, f"memory request {request / gib:.1f} GiB is under the budgets {budgets / gib:.1f} GiB")
            if doc.get("kind") == "DaemonSet":
                if (pod.get("terminationGracePeriodSeconds") or 30) < 60:
                    problem(name, "terminationGracePeriodSeconds under 60: SIGTERM writes the replicas in memory to disk")
                ru = ((doc["spec"].get("updateStrategy") or {}).get("rollingUpdate") or {})
                if ru.get("maxUnavailable") != 1:
                    problem(name, "updateStrategy.rollingUpdate.maxUnavailable should be 1")


def check_toml(where, text, keys):
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        problem(where, f"not TOML: {e}")
        return
    for k in sorted(cfg):
        if k not in keys:
            problem(where, f"{k} is not a Config key (client/src/config/mod.rs): an unknown key is an error")
    for p in cfg.get("peers", []):
        if not re.fullmatch(r"[^=\s]+=[^=\s]+:\d+", str(p)) and not str(p).startswith("slurm:"):
            problem(where, f"peer {p!r} is not name=host:port")


# ---------------------------------------------------------------- Grafana


def strings(obj, key_filter):
    """Every string under a key in key_filter, anywhere in obj."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and k in key_filter:
                yield v
            else:
                yield from strings(v, key_filter)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v, key_filter)


def check_grafana(names, histograms):
    path = DEPLOY / "grafana/strata-dashboard.json"
    try:
        dash = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problem(rel(path), f"not JSON: {e}")
        return 0, set()
    if not any(i.get("name") == "DS_PROMETHEUS" for i in dash.get("__inputs", [])):
        problem(rel(path), "no DS_PROMETHEUS datasource input")
    variables = {v.get("name") for v in (dash.get("templating") or {}).get("list", [])}
    for v in ("job", "node"):
        if v not in variables:
            problem(rel(path), f"no template variable {v}")
    exprs = list(strings(dash, {"expr", "query", "definition"}))
    if not exprs:
        problem(rel(path), "no queries")
    used = set()
    for e in exprs:
        for n in re.findall(r"\bstrata_[a-z0-9_]+", e):
            used.add(n)
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            if n in histograms:
                problem(rel(path), f"{n} is a histogram: query {n}_bucket, _sum or _count")
            elif n not in names and not (base != n and base in histograms):
                problem(rel(path), f"{n} is not a series the code renders (peer/src/metrics.rs, client/src/metrics/mod.rs): {e}")
    return len(exprs), used


# ---------------------------------------------------------------- systemd


def check_systemd(flags, binary):
    path = DEPLOY / "systemd/strata-peer.service"
    try:
        text = path.read_text()
    except OSError as e:
        problem(rel(path), str(e))
        return "missing"
    lines = re.sub(r"\\\n", " ", text).splitlines()
    execs = [l.split("=", 1)[1] for l in lines if l.startswith("ExecStart=")]
    if len(execs) != 1:
        problem(rel(path), f"{len(execs)} ExecStart lines, expected 1")
        return "bad"
    argv = shlex.split(execs[0])
    if argv[1:3] != ["peer", "serve"]:
        problem(rel(path), f"ExecStart does not run `strata peer serve`: {execs[0]}")
    check_flags(rel(path), argv[3:], flags)
    settings = dict(l.split("=", 1) for l in lines if re.match(r"^\w+=", l))
    if settings.get("KillSignal") != "SIGTERM":
        problem(rel(path), "KillSignal should be SIGTERM (the graceful stop that keeps what is in memory)")
    if not settings.get("TimeoutStopSec", "0").rstrip("s").isdigit() or int(settings.get("TimeoutStopSec", "0").rstrip("s")) < 60:
        problem(rel(path), "TimeoutStopSec should be at least 60")
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        return "systemd-analyze verify skipped (not installed)"
    if not binary:
        return "systemd-analyze verify skipped (no strata binary given: ExecStart must exist)"
    with tempfile.TemporaryDirectory() as d:
        # The unit names /usr/local/bin/strata; verify it against the binary given.
        unit = Path(d) / "strata-peer.service"
        unit.write_text(text.replace("/usr/local/bin/strata", os.path.abspath(binary)))
        r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or "strata-peer.service" in out:
            problem(rel(path), f"systemd-analyze verify: {out or 'exit ' + str(r.returncode)}")
    return "systemd-analyze verify passed"


def main():
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        print(__doc__)
        return 2
    binary = sys.argv[1] if len(sys.argv) == 2 else None
    flags = serve_flags(binary)
    names, histograms = metric_names()
    docs = check_kubernetes(flags, env_settings(), config_keys())
    n_exprs, used = check_grafana(names, histograms)
    systemd = check_systemd(flags, binary)
    if problems:
        for p in problems:
            print(f"deploy/check.py: {p}", file=sys.stderr)
        print(f"deploy/check.py: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    unused = sorted(n for n in names if n not in used and not any(u.startswith(n + "_") for u in used))
    print(f"kubernetes: {docs} documents valid against Kubernetes {K8S_VERSION} (strict)")
    print(f"grafana: {n_exprs} queries, {len(used)} strata series, all rendered by the code"
          + (f" (not on the dashboard: {', '.join(unused)})" if unused else ""))
    print(f"systemd: ExecStart flags {'checked against ' + binary if binary else 'not checked (no binary given)'}; {systemd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
