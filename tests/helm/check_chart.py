#!/usr/bin/env python3
"""Checks the Helm chart charts/switchyard without a cluster and without a helm binary.

For the default values, the HA example (charts/switchyard/examples/ha-values.yaml) and a few
variants, it
  1. lints the chart with Helm's own Go SDK (PyPI helm-python-sdk, which binds Helm v4's
     pkg/action lint and pkg/engine render through a C ABI), strict, against Kubernetes 1.33;
  2. renders it the way `helm template` does (same SDK, offline);
  3. validates every rendered object with kubernetes-validate in strict mode (unknown fields
     rejected) against the Kubernetes 1.33 OpenAPI schemas -- the version k8s-openapi's v1_33
     feature targets. The CRDs themselves are validated; only the ServiceMonitor, a Prometheus
     Operator custom resource with no schema in that set, is exempt;
  4. asserts properties that matter: hardened containers, probes, least-privilege RBAC with
     the exact rules each process needs, the CRDs equal to crds/, the HA replica counts;
  5. checks that values.schema.json rejects typos and unsafe overrides;
  6. runs the switchyard binary's flag parser on every container's arguments
     (target/debug/switchyard, or $SWITCHYARD_BIN), so a renamed flag fails here.

Run: cargo build -p switchyard && .venv/bin/python tests/helm/check_chart.py
(scripts/test.sh does, after its build step)
Ends with "N passed, N failed" and exits non-zero on any failure.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import traceback
from typing import Any, Callable

import helm_python as helm
import kubernetes_validate
import yaml
from kubernetes_validate.version import __version__ as kv_version

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "switchyard"
KUBE_VERSION = "1.33.0"
RELEASE = "switchyard"
NAMESPACE = "switchyard"
# Custom resources of other projects: no schema ships with kubernetes-validate.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

passed = 0
failed = 0


def check(name: str, fn: Callable[[], None]) -> None:
    global passed, failed
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        failed += 1
        print(f"FAIL {name}: {e}")
        if not isinstance(e, AssertionError):
            traceback.print_exc()
    else:
        passed += 1
        print(f"ok   {name}")


def load_values(path: pathlib.Path) -> dict[str, Any]:
    return helm.values_from_yaml(path.read_text())


def merged(base: dict[str, Any] | None, patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base or {})

    def put(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                put(dst[k], v)
            else:
                dst[k] = v

    put(out, patch)
    return out


def render(chart: helm.Chart, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    files = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path in sorted(files):
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for doc in yaml.safe_load_all(files[path]):
            if doc:
                doc.setdefault("__source", path)
                docs.append(doc)
    return docs


def objects(docs, kind, component=None):
    out = [d for d in docs if d["kind"] == kind]
    if component is not None:
        out = [
            d
            for d in out
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]
    return out


def one(docs, kind, component=None):
    found = objects(docs, kind, component)
    assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
    return found[0]


# ---- checks applied to every rendering ---------------------------------------------------


def lint_clean(values):
    def run():
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
        # Severity 1 is informational (e.g. "icon is recommended"); 2 warning, 3 error.
        bad = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not bad, f"lint: {report['errors']} {bad}"

    return run


def validates_strict(docs):
    def run():
        problems = []
        for d in docs:
            body = {k: v for k, v in d.items() if k != "__source"}
            if (body["apiVersion"], body["kind"]) in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(body, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                problems.append(f"{d['__source']} {body['kind']}/{body['metadata']['name']}: {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                problems.append(f"{d['__source']}: {e.message}")
        assert not problems, "\n  " + "\n  ".join(problems)

    return run


def validate_cli(name, docs):
    """The same validation through the command users run, on the rendered files."""

    def run():
        out = pathlib.Path(tempfile.mkdtemp(prefix=f"switchyard-chart-{name}-"))
        files = []
        for i, d in enumerate(docs):
            body = {k: v for k, v in d.items() if k != "__source"}
            f = out / f"{i:02}-{body['kind'].lower()}.yaml"
            f.write_text(yaml.safe_dump(body))
            files.append(str(f))
        cmd = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", KUBE_VERSION, *files]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        shutil.rmtree(out)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        # Only "no schema" warnings for the allowed custom kinds may appear.
        unexpected = [line for line in lines if not ("WARN" in line and "ServiceMonitor" in line)]
        assert proc.returncode == 0 and not unexpected, f"exit {proc.returncode}: {lines} {proc.stderr}"

    return run


def binary() -> pathlib.Path:
    """The switchyard binary to try the chart's arguments on (scripts/test.sh builds it first)."""
    path = pathlib.Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target" / "debug" / "switchyard"))
    assert path.is_file(), f"{path} not found: build it (cargo build -p switchyard) or set SWITCHYARD_BIN"
    return path


def args_accepted(docs):
    """Every container's arguments parse: the binary's own flag parser, with --help appended so
    nothing starts. Catches a renamed or removed flag, and conflicting flags."""

    def run():
        exe = binary()
        for dep in objects(docs, "Deployment"):
            for c in dep["spec"]["template"]["spec"]["containers"]:
                proc = subprocess.run([str(exe), *c["args"], "--help"], capture_output=True, text=True, check=False)
                first = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[0]
                assert proc.returncode == 0, f"{dep['metadata']['name']}: {c['args']}: {first}"
                # The literal environment values too (e.g. SWITCHYARD_REDIS_TIMEOUT): clap reads
                # them only on a real start, so start against a kubeconfig that does not exist.
                # Exit 2 is clap's usage error; anything else got past parsing.
                env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
                proc = subprocess.run(
                    [str(exe), *c["args"], "--kubeconfig", "/nonexistent/kubeconfig"],
                    capture_output=True, text=True, check=False, timeout=30,
                    env={"PATH": os.environ.get("PATH", ""), **env},
                )
                assert proc.returncode not in (0, 2), (
                    f"{dep['metadata']['name']}: {c['args']} with {env}: exit {proc.returncode}: {proc.stderr.strip()}"
                )

    return run


def fail(message: str) -> None:
    raise AssertionError(message)


def pod_templates(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


def hardened(docs):
    def run():
        seen = 0
        for d, pod in pod_templates(docs):
            name = d["metadata"]["name"]
            psc = pod.get("securityContext", {})
            assert psc.get("runAsNonRoot") is True, f"{name}: pod runAsNonRoot"
            assert psc.get("runAsUser", 0) != 0, f"{name}: pod runs as UID 0"
            for c in pod.get("initContainers", []) + pod["containers"]:
                seen += 1
                where = f"{name}/{c['name']}"
                sc = c.get("securityContext")
                assert sc, f"{where}: no securityContext"
                assert sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
                assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
                assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
                assert sc.get("privileged", False) is False, f"{where}: privileged"
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities.drop"
                assert not sc.get("capabilities", {}).get("add"), f"{where}: capabilities.add"
                seccomp = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
                assert seccomp.get("type") == "RuntimeDefault", f"{where}: seccomp {seccomp}"
                assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{where}: liveness"
                assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{where}: readiness"
                res = c.get("resources", {})
                assert res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory"), (
                    f"{where}: resource requests"
                )
                assert res.get("limits", {}).get("memory"), f"{where}: memory limit"
                env = {e["name"] for e in c.get("env", [])}
                assert "POD_NAME" in env, f"{where}: POD_NAME"
        assert seen >= 2, f"only {seen} containers rendered"

    return run


# Exactly what each process may do: (apiGroup, resource) -> verbs. Anything else fails.
OPERATOR_WATCHED_RULES = {
    ("switchyard.dev", "llmproviders"): {"get", "list", "watch"},
    ("switchyard.dev", "routingpolicies"): {"get", "list", "watch"},
    ("switchyard.dev", "tenantquotas"): {"get", "list", "watch"},
    ("switchyard.dev", "llmproviders/status"): {"patch"},
    ("switchyard.dev", "routingpolicies/status"): {"patch"},
    ("switchyard.dev", "tenantquotas/status"): {"patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("", "secrets"): {"get", "list", "watch"},
}
OPERATOR_LOCAL_RULES = {
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
    ("coordination.k8s.io", "leases"): {"create", "get", "patch"},
}
ROUTER_RULES = {
    ("switchyard.dev", "llmproviders"): {"get", "list", "watch"},
    ("switchyard.dev", "routingpolicies"): {"get", "list", "watch"},
    ("switchyard.dev", "tenantquotas"): {"get", "list", "watch"},
    ("", "secrets"): {"get", "list", "watch"},
}


def grants(role) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules", []):
        for group in rule.get("apiGroups", []):
            for res in rule.get("resources", []):
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


def least_privilege(docs, cluster_scoped: bool):
    def run():
        roles = objects(docs, "Role") + objects(docs, "ClusterRole")
        for role in roles:
            for rule in role.get("rules", []):
                for field in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: '*' in {field}"
                assert not rule.get("nonResourceURLs"), f"{role['metadata']['name']}: nonResourceURLs"
        kind = "ClusterRole" if cluster_scoped else "Role"
        if not cluster_scoped:
            assert not objects(docs, "ClusterRole"), "a ClusterRole without watch.allNamespaces"
            assert not objects(docs, "ClusterRoleBinding"), "a ClusterRoleBinding without watch.allNamespaces"
        by_name = {r["metadata"]["name"]: r for r in roles}
        op = by_name[f"{RELEASE}-operator"]
        assert op["kind"] == kind, f"operator role kind {op['kind']}"
        assert grants(op) == OPERATOR_WATCHED_RULES, f"operator rules {grants(op)}"
        local = by_name[f"{RELEASE}-operator-local"]
        assert local["kind"] == "Role" and local["metadata"]["namespace"] == NAMESPACE
        assert grants(local) == OPERATOR_LOCAL_RULES, f"operator local rules {grants(local)}"
        # The Lease may be read and written by name only; create cannot be narrowed by name.
        lease_name = f"{RELEASE}-operator"
        for rule in local["rules"]:
            if "leases" in rule["resources"] and set(rule["verbs"]) - {"create"}:
                assert rule.get("resourceNames") == [lease_name], f"lease rule {rule}"
        router = by_name[f"{RELEASE}-router"]
        assert router["kind"] == kind, f"router role kind {router['kind']}"
        assert grants(router) == ROUTER_RULES, f"router rules {grants(router)}"
        # Each binding names the role of the same name and the matching ServiceAccount.
        sas = {sa["metadata"]["name"] for sa in objects(docs, "ServiceAccount")}
        for b in objects(docs, "RoleBinding") + objects(docs, "ClusterRoleBinding"):
            assert b["roleRef"]["name"] == b["metadata"]["name"], b["metadata"]["name"]
            assert b["roleRef"]["name"] in by_name, f"binding to a missing role {b['roleRef']}"
            for s in b["subjects"]:
                assert s["kind"] == "ServiceAccount" and s["name"] in sas, f"subject {s}"
                assert s["namespace"] == NAMESPACE
        for dep in objects(docs, "Deployment"):
            assert dep["spec"]["template"]["spec"]["serviceAccountName"] in sas

    return run


def wiring(docs):
    """Names passed on the command line match the objects the chart creates."""

    def run():
        svc = one(docs, "Service", "router")
        op = one(docs, "Deployment", "operator")
        router = one(docs, "Deployment", "router")
        op_args = op["spec"]["template"]["spec"]["containers"][0]["args"]
        router_args = router["spec"]["template"]["spec"]["containers"][0]["args"]
        assert op_args[0] == "operator" and router_args[0] == "router", (op_args, router_args)
        assert f"--router-service={svc['metadata']['name']}" in op_args, op_args
        assert f"--lease-name={RELEASE}-operator" in op_args, op_args
        assert f"--router-port-name={svc['spec']['ports'][0]['name']}" in op_args, op_args
        sel = svc["spec"]["selector"]
        labels = router["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sel.items()), "Service selects no router pod"
        port = router["spec"]["template"]["spec"]["containers"][0]["ports"][0]
        assert port["name"] == svc["spec"]["ports"][0]["targetPort"] == "http"
        assert f"--listen=0.0.0.0:{port['containerPort']}" in router_args, router_args
        for d in docs:
            if d["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
                assert d["metadata"].get("namespace"), f"{d['kind']}/{d['metadata']['name']}: no namespace"

    return run


def crds_match_committed(docs, expect_installed: bool):
    def run():
        crds = objects(docs, "CustomResourceDefinition")
        if not expect_installed:
            assert not crds, "crds.install=false still renders CRDs"
            return
        committed = {}
        for f in sorted((ROOT / "crds").glob("*.yaml")):
            c = yaml.safe_load(f.read_text())
            committed[c["metadata"]["name"]] = c
        assert {c["metadata"]["name"] for c in crds} == set(committed), "CRD set differs from crds/"
        for c in crds:
            name = c["metadata"]["name"]
            assert c["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep", name
            assert c["spec"] == committed[name]["spec"], (
                f"{name}: chart copy differs from crds/; run `cargo run -p switchyard -- crdgen`"
            )

    return run


# ---- the renderings -------------------------------------------------------------------


def main() -> int:
    print(
        f"helm-python-sdk {helm.__version__} (Helm SDK {helm.helm_sdk_version()}), "
        f"kubernetes-validate {kv_version}, Kubernetes {KUBE_VERSION}"
    )
    chart = helm.Chart.load(CHART)
    ha = load_values(CHART / "examples" / "ha-values.yaml")
    sets: dict[str, dict[str, Any] | None] = {
        "default": None,
        "ha": ha,
        "ha-without-hpa": merged(ha, {"router": {"autoscaling": {"enabled": False}}}),
        "all-namespaces": {"watch": {"allNamespaces": True}},
        "redis-from-secret": merged(ha, {"router": {"redis": {"existingSecret": {"name": "switchyard-redis"}}}}),
        "other-namespace-no-crds": {
            "watch": {"namespace": "llm"},
            "crds": {"install": False},
        },
        "grafana-dashboard": {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"team": "platform"},
                "annotations": {"grafana_folder": "LLM"},
            }
        },
    }
    rendered: dict[str, list[dict[str, Any]]] = {}
    for name, values in sets.items():
        check(f"{name}: values match values.schema.json", lambda v=values: chart.validate_schema(v))
        check(f"{name}: helm lint --strict (Kubernetes {KUBE_VERSION})", lint_clean(values))
        try:
            rendered[name] = render(chart, values)
        except helm.HelmError as e:
            check(f"{name}: renders", lambda e=e: fail(str(e)))
            continue
        docs = rendered[name]
        check(f"{name}: renders ({len(docs)} objects)", lambda: None)
        check(f"{name}: kubernetes-validate --strict (each object)", validates_strict(docs))
        check(f"{name}: kubernetes-validate --strict (command line)", validate_cli(name, docs))
        check(f"{name}: containers hardened, probed, resourced", hardened(docs))
        check(
            f"{name}: RBAC least privilege",
            least_privilege(docs, cluster_scoped=bool(values and values.get("watch", {}).get("allNamespaces"))),
        )
        check(f"{name}: names wired between objects and arguments", wiring(docs))
        check(f"{name}: the binary accepts every container's arguments", args_accepted(docs))
        installs_crds = not (values and values.get("crds", {}).get("install") is False)
        check(f"{name}: CRDs equal crds/ and are kept", crds_match_committed(docs, installs_crds))

    def default_is_minimal():
        docs = rendered["default"]
        for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor"):
            assert not objects(docs, kind), f"default values render a {kind}"
        assert one(docs, "Deployment", "router")["spec"]["replicas"] == 2
        assert one(docs, "Deployment", "operator")["spec"]["replicas"] == 1

    def ha_shape():
        docs = rendered["ha"]
        hpa = one(docs, "HorizontalPodAutoscaler", "router")
        assert hpa["spec"]["minReplicas"] == 3, hpa["spec"]
        assert hpa["spec"]["scaleTargetRef"]["name"] == f"{RELEASE}-router"
        # The HPA owns the count: the Deployment must not carry one an upgrade would reset.
        assert "replicas" not in one(docs, "Deployment", "router")["spec"]
        assert one(docs, "Deployment", "operator")["spec"]["replicas"] == 2
        assert one(docs, "PodDisruptionBudget", "router")["spec"]["minAvailable"] == 2
        assert one(docs, "PodDisruptionBudget", "operator")["spec"]["maxUnavailable"] == 1
        assert len(objects(docs, "NetworkPolicy")) == 2
        assert {s["spec"]["endpoints"][0]["port"] for s in objects(docs, "ServiceMonitor")} == {"http", "metrics"}
        np = one(docs, "NetworkPolicy", "router")
        peers = [p for rule in np["spec"]["ingress"] for p in rule.get("from", [])]
        assert any(p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "operator"
                   for p in peers), "the operator cannot reach the routers' /outcomes"
        assert one(docs, "Deployment", "router")["spec"]["template"]["spec"]["topologySpreadConstraints"]

    def ha_without_hpa_three_routers():
        assert one(rendered["ha-without-hpa"], "Deployment", "router")["spec"]["replicas"] == 3

    def all_namespaces_args():
        for dep in objects(rendered["all-namespaces"], "Deployment"):
            args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--all-namespaces" in args and not any(a.startswith("--namespace") for a in args), args

    def other_namespace_roles():
        docs = rendered["other-namespace-no-crds"]
        for dep in objects(docs, "Deployment"):
            assert "--namespace=llm" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
        for name in (f"{RELEASE}-operator", f"{RELEASE}-router"):
            (role,) = [r for r in objects(docs, "Role") if r["metadata"]["name"] == name]
            assert role["metadata"]["namespace"] == "llm", role["metadata"]
        (local,) = [r for r in objects(docs, "Role") if r["metadata"]["name"].endswith("-local")]
        assert local["metadata"]["namespace"] == NAMESPACE

    def router_env(docs):
        c = one(docs, "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e for e in c["env"]}

    def redis_shared():
        assert "SWITCHYARD_REDIS_URL" not in router_env(rendered["default"]), "Redis without a URL"
        env = router_env(rendered["redis-from-secret"])
        ref = env["SWITCHYARD_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "switchyard-redis", "key": "url"}, ref
        # With the HPA, the fallback share is 1/maxReplicas: the replicas never exceed a limit.
        assert env["SWITCHYARD_REPLICAS"]["value"] == "12", env["SWITCHYARD_REPLICAS"]
        assert env["SWITCHYARD_REDIS_TIMEOUT"]["value"] == "100ms"

    def dashboard_configmap():
        assert not [c for c in objects(rendered["default"], "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")], \
            "default values render the dashboard"
        (cm,) = [c for c in objects(rendered["grafana-dashboard"], "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
        meta = cm["metadata"]
        assert meta["name"] == f"{RELEASE}-dashboard", meta
        assert meta["namespace"] == "monitoring", meta
        assert meta["labels"]["grafana_dashboard"] == "1", meta["labels"]
        assert meta["labels"]["team"] == "platform", meta["labels"]
        assert meta["annotations"] == {"grafana_folder": "LLM"}, meta
        text = cm["data"]["switchyard.json"]
        source = (CHART / "dashboards" / "switchyard.json").read_text()
        docs_copy = (ROOT / "docs" / "grafana" / "switchyard-dashboard.json").read_text()
        assert docs_copy == source, "docs/grafana/switchyard-dashboard.json differs from the chart's dashboards/switchyard.json"
        assert json.loads(text) == json.loads(source), "the ConfigMap does not carry the dashboard file"
        dash = json.loads(text)
        assert dash["uid"] == "switchyard" and dash["panels"], dash.get("uid")
        names = {v["name"] for v in dash["templating"]["list"]}
        assert {"datasource", "route", "provider"} <= names, names

    def dashboard_label_configurable():
        docs = render(chart, {"grafanaDashboard": {"enabled": True, "label": "dashboards.example.com/load", "labelValue": "yes"}})
        (cm,) = [c for c in objects(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
        assert cm["metadata"]["labels"]["dashboards.example.com/load"] == "yes", cm["metadata"]
        assert "grafana_dashboard" not in cm["metadata"]["labels"]
        assert cm["metadata"]["namespace"] == NAMESPACE

    for name, fn in [
        ("grafana-dashboard: sidecar-labelled ConfigMap carrying dashboards/switchyard.json (= docs copy)", dashboard_configmap),
        ("grafana-dashboard: label key, value and namespace configurable", dashboard_label_configurable),
        ("redis: URL from a Secret, local share 1/maxReplicas under the HPA", redis_shared),
        ("default: no HPA, PDB, NetworkPolicy or ServiceMonitor; 1 operator, 2 routers", default_is_minimal),
        ("ha: HPA from 3 routers, 2 operators, PDBs, NetworkPolicies, ServiceMonitors", ha_shape),
        ("ha without HPA: Deployment of 3 routers", ha_without_hpa_three_routers),
        ("all-namespaces: both processes get --all-namespaces", all_namespaces_args),
        ("watch.namespace: Roles land in the watched namespace, the Lease Role at home", other_namespace_roles),
    ]:
        check(name, fn)

    # values.schema.json catches typos and refuses to loosen the security posture.
    for label, bad in [
        ("a typo (router.replica)", {"router": {"replica": 3}}),
        ("an unknown top-level key", {"routers": {}}),
        ("readOnlyRootFilesystem: false", {"securityContext": {"readOnlyRootFilesystem": False}}),
        ("runAsNonRoot: false", {"podSecurityContext": {"runAsNonRoot": False}}),
        ("a bad pull policy", {"image": {"pullPolicy": "Sometimes"}}),
        ("a Redis URL that is not redis://", {"router": {"redis": {"url": "http://redis:6379"}}}),
        ("a typo under grafanaDashboard", {"grafanaDashboard": {"enable": True}}),
    ]:
        def rejects(bad=bad):
            try:
                chart.validate_schema(bad)
            except helm.HelmValuesError:
                return
            raise AssertionError("accepted")

        check(f"schema rejects {label}", rejects)

    def lint_reports_typo():
        report = helm.lint(CHART, {"router": {"replica": 3}}, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] or any(m["severity"] >= 2 for m in report["messages"]), report

    check("lint reports a values typo", lint_reports_typo)

    def render_refuses_two_pdb_bounds():
        try:
            render(chart, {"router": {"podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}}})
        except helm.HelmError as e:
            assert "not both" in str(e), e
            return
        raise AssertionError("rendered a PDB with both bounds")

    check("render refuses a PDB with both minAvailable and maxUnavailable", render_refuses_two_pdb_bounds)

    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
