"""Kubernetes manifests (ops/k8s/): they parse, hang together (selectors, ports, Secret and ConfigMap
references, kustomization), and every container command line parses with the real argument parser of
the program it starts (SGLang's server arguments, `python -m controller`, `jetspec shadow run`).
kubeconform is not available here: schema validation against the Kubernetes API is not done."""

from __future__ import annotations

import shlex

import pytest
import yaml
from ops_support import OPS

from policies import parse_policy_text

K8S = OPS / "k8s"
FILES = sorted(K8S.glob("*.yaml"))
DOCS = [(path.name, doc) for path in FILES for doc in yaml.safe_load_all(path.read_text()) if doc]


def kind(name: str) -> list[dict]:
    return [doc for _, doc in DOCS if doc["kind"] == name]


def workloads() -> list[dict]:
    return kind("Deployment") + kind("StatefulSet")


def container(workload_name: str) -> dict:
    (workload,) = [w for w in workloads() if w["metadata"]["name"] == workload_name]
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def test_every_manifest_parses_and_names_its_objects():
    assert len(FILES) >= 9
    for filename, doc in DOCS:
        assert doc.get("apiVersion") and doc.get("kind"), filename
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], filename


def test_the_kustomization_lists_every_manifest():
    (kustomization,) = kind("Kustomization")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in FILES if p.name != "kustomization.yaml")


def test_services_select_pods_and_name_their_container_ports():
    for service in kind("Service"):
        selector = service["spec"]["selector"]
        (workload,) = [
            w for w in workloads() if w["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
        ]
        port_names = {p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (
                f"{service['metadata']['name']}: no container port {port['targetPort']}"
            )


def test_service_monitors_scrape_existing_service_ports_and_the_jobs_the_alerts_use():
    services = {s["metadata"]["name"]: s for s in kind("Service")}
    monitored = set()
    for monitor in kind("ServiceMonitor"):
        labels = monitor["spec"]["selector"]["matchLabels"]
        (name,) = [n for n, s in services.items() if s["metadata"]["labels"].items() >= labels.items()]
        ports = {p["name"] for p in services[name]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
        monitored.add(name)  # the Prometheus Operator's job label is the Service name
    rules = (OPS / "prometheus" / "jetspec.rules.yml").read_text()
    for job in ("jetspec-controller", "jetspec-shadow", "jetspec-sglang"):
        assert job in monitored
    assert 'job="jetspec-controller"' in rules and 'job="jetspec-shadow"' in rules


def test_secret_and_configmap_references_resolve():
    secrets = {s["metadata"]["name"]: s for s in kind("Secret")}
    configmaps = {c["metadata"]["name"] for c in kind("ConfigMap")}
    for workload in workloads():
        spec = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"]
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in configmaps


def test_the_policy_configmap_holds_a_valid_policy():
    (configmap,) = [c for c in kind("ConfigMap") if c["metadata"]["name"] == "jetspec-policy"]
    policy = parse_policy_text(configmap["data"]["policy.yaml"], "ops/k8s/policy-configmap.yaml")
    assert policy.cohorts


def test_the_collector_configmap_is_ops_otel_collector_yaml():
    (configmap,) = [c for c in kind("ConfigMap") if c["metadata"]["name"] == "otel-collector"]
    assert configmap["data"]["collector.yaml"] == (OPS / "otel" / "collector.yaml").read_text()


def test_the_sglang_server_runs_jetspec_with_metrics_tracing_and_the_admin_key():
    server_args = pytest.importorskip("sglang.srt.server_args", reason="SGLang not installed (pip install '.[sglang]')")
    import argparse

    c = container("jetspec-sglang")
    assert c["command"] == ["python3", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    known = {o for action in parser._actions for o in action.option_strings}
    flags = {arg.split("=", 1)[0] for arg in c["args"]}
    assert flags <= known, f"SGLang has no {sorted(flags - known)}"
    args = dict(arg.split("=", 1) if "=" in arg else (arg, True) for arg in c["args"])
    assert args["--speculative-algorithm"] == "JETSPEC"
    assert args["--enable-metrics"] is True and args["--enable-trace"] is True
    assert args["--otlp-traces-endpoint"] == "otel-collector:4317"
    assert args["--admin-api-key"] == "$(JETSPEC_ADMIN_KEY)"
    assert {e["name"] for e in c["env"]} >= {"JETSPEC_POLICY", "JETSPEC_ADMIN_KEY"}


def test_the_controller_arguments_parse_and_name_every_server_replica():
    from controller.cli import build_parser

    c = container("jetspec-controller")
    assert c["command"] == ["python3", "-m", "controller"]
    args = build_parser().parse_args(c["args"])
    (statefulset,) = kind("StatefulSet")
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    assert args.server == [f"http://{name}-{i}.{service}:30000" for i in range(statefulset["spec"]["replicas"])]
    assert args.metrics_port == 9109 and args.admin_key_env == "JETSPEC_ADMIN_KEY"
    assert args.shadow_alarm == "http://jetspec-shadow:9110/metrics"


def test_the_shadow_checker_arguments_parse():
    from sglang_jetspec.cli.main import build_parser

    c = container("jetspec-shadow")
    assert c["command"] == ["jetspec"]
    args = build_parser().parse_args(c["args"])
    assert (args.spool, args.reference, args.follow, args.metrics_port) == ("/spool", "local", True, 9110)


def test_the_dockerfile_installs_the_plugin_with_sglang():
    dockerfile = (K8S / "Dockerfile").read_text()
    (install,) = [line for line in dockerfile.splitlines() if line.startswith("RUN pip install")]
    assert shlex.split(install)[-1].endswith("[sglang]")
