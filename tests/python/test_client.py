"""The official Python `kubernetes` client against skiff-server (SKIFF_KUBECONFIG)."""

import os
import threading
import time

import pytest
from kubernetes import client, config, dynamic, watch
from kubernetes.client.rest import ApiException


@pytest.fixture(scope="module")
def api():
    config.load_kube_config(config_file=os.environ["SKIFF_KUBECONFIG"])
    return client.ApiClient()


def test_create_list_patch(api):
    core = client.CoreV1Api(api)
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py-cm", labels={"from": "python"}), data={"a": "1"})
    created = core.create_namespaced_config_map("default", cm)
    assert created.metadata.uid
    assert created.metadata.resource_version

    items = core.list_namespaced_config_map("default", label_selector="from=python").items
    assert [i.metadata.name for i in items] == ["py-cm"]

    patched = core.patch_namespaced_config_map("py-cm", "default", {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)

    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map("default", cm)
    assert e.value.status == 409


def test_deployment_and_scale(api):
    apps = client.AppsV1Api(api)
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "py-web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "py-web"}},
            "template": {
                "metadata": {"labels": {"app": "py-web"}},
                "spec": {"containers": [{"name": "c", "image": "skiff.local/busybox:1"}]},
            },
        },
    }
    apps.create_namespaced_deployment("default", dep)
    apps.patch_namespaced_deployment_scale("py-web", "default", {"spec": {"replicas": 4}})
    got = apps.read_namespaced_deployment("py-web", "default")
    assert got.spec.replicas == 4
    assert got.metadata.generation == 2


def test_watch_sees_changes(api):
    core = client.CoreV1Api(api)
    seen = []

    def writer():
        time.sleep(0.5)
        for i in range(3):
            core.create_namespaced_config_map(
                "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"w-{i}", labels={"w": "yes"}))
            )
        core.delete_namespaced_config_map("w-0", "default")

    t = threading.Thread(target=writer)
    t.start()
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_config_map, "default", label_selector="w=yes", timeout_seconds=10):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 4:
            w.stop()
    t.join()
    assert seen == [("ADDED", "w-0"), ("ADDED", "w-1"), ("ADDED", "w-2"), ("DELETED", "w-0")]


def test_dynamic_client_discovery(api):
    dyn = dynamic.DynamicClient(api)
    deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    names = [d.metadata.name for d in deployments.get(namespace="default").items]
    assert "py-web" in names
