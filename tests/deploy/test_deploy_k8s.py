"""deploy/k8s: every manifest parses, the DaemonSet keeps to the least privilege that works, and
the shiftd.toml of the ConfigMap passes shiftd's own validator."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from shiftd import config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
NAMESPACE = "shift-system"


def documents() -> dict[str, dict]:
    """kind -> document, across every manifest (one object of each kind)."""
    found: dict[str, dict] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in found, f"{path.name}: a second {doc['kind']}"
            found[doc["kind"]] = doc
    return found


def test_manifests_are_a_namespace_a_configmap_and_a_daemonset():
    docs = documents()
    assert set(docs) == {"Namespace", "ConfigMap", "DaemonSet"}
    assert docs["Namespace"]["metadata"]["name"] == NAMESPACE
    assert docs["ConfigMap"]["metadata"]["namespace"] == NAMESPACE
    assert docs["DaemonSet"]["metadata"]["namespace"] == NAMESPACE
    assert docs["DaemonSet"]["apiVersion"] == "apps/v1"


def test_daemonset_has_the_least_privilege_that_works():
    spec = documents()["DaemonSet"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert not pod.get("hostPID") and not pod.get("hostIPC")
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "CHOWN"]}
    assert container["command"][:3] == ["shiftd", "--config", "/etc/shift/shiftd.toml"]


def test_daemonset_mounts_socket_dir_sys_read_only_and_the_config():
    docs = documents()
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    toml = config.parse(tomllib.loads(docs["ConfigMap"]["data"]["shiftd.toml"]))

    def source(mount_path: str) -> dict:
        return volumes[mounts[mount_path]["name"]]

    socket_dir = str(Path(toml.server.socket).parent)
    assert source(socket_dir)["hostPath"]["path"] == "/run/shift"
    assert not mounts[socket_dir].get("readOnly")
    assert source(toml.monitors.sysfs_root)["hostPath"]["path"] == "/sys"
    assert mounts[toml.monitors.sysfs_root]["readOnly"] is True
    assert source("/etc/shift")["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    # the metrics port the pod declares is the one shiftd listens on
    port = config.parse_host_port("metrics.listen", toml.metrics.listen)[1]
    assert [p["containerPort"] for p in pod["containers"][0]["ports"]] == [port]


def test_configmap_config_passes_shiftds_validator():
    text = documents()["ConfigMap"]["data"]["shiftd.toml"]
    parsed = config.parse(tomllib.loads(text))
    # the three-member cluster of README.md, through its headless Service (one name, every member)
    assert parsed.etcd.endpoints == ("etcd.shift-system.svc.cluster.local:2379",)
    assert parsed.metrics.listen.startswith("0.0.0.0:")  # reachable from Prometheus in the cluster
