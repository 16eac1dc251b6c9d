"""CustomResourceDefinitions through the official Python client: ApiextensionsV1Api for the
CRD (typed models), CustomObjectsApi for its objects (create, get, list with selectors,
merge patch, status and scale subresources, watch, delete), against skiff-server."""

import os
import time

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "py.example.com", "v1", "crontabs"


@pytest.fixture(scope="module")
def api():
    config.load_kube_config(config_file=os.environ["SKIFF_KUBECONFIG"])
    return client.ApiClient()


def crd_body():
    schema = client.V1JSONSchemaProps(
        type="object",
        properties={
            "spec": client.V1JSONSchemaProps(
                type="object",
                properties={
                    "cronSpec": client.V1JSONSchemaProps(type="string", pattern=r"^(\S+ ){4}\S+$"),
                    "replicas": client.V1JSONSchemaProps(type="integer", minimum=0, default=1),
                },
                required=["cronSpec"],
            ),
            "status": client.V1JSONSchemaProps(
                type="object",
                properties={
                    "replicas": client.V1JSONSchemaProps(type="integer"),
                    "selector": client.V1JSONSchemaProps(type="string"),
                },
            ),
        },
    )
    version = client.V1CustomResourceDefinitionVersion(
        name=VERSION,
        served=True,
        storage=True,
        schema=client.V1CustomResourceValidation(open_apiv3_schema=schema),
        subresources=client.V1CustomResourceSubresources(
            status={},
            scale=client.V1CustomResourceSubresourceScale(
                spec_replicas_path=".spec.replicas",
                status_replicas_path=".status.replicas",
                label_selector_path=".status.selector",
            ),
        ),
    )
    return client.V1CustomResourceDefinition(
        metadata=client.V1ObjectMeta(name=f"{PLURAL}.{GROUP}"),
        spec=client.V1CustomResourceDefinitionSpec(
            group=GROUP,
            scope="Namespaced",
            names=client.V1CustomResourceDefinitionNames(plural=PLURAL, kind="CronTab", short_names=["ct"]),
            versions=[version],
        ),
    )


def established(ext, name):
    crd = ext.read_custom_resource_definition(name)
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def wait_served(custom):
    deadline = time.time() + 20
    while True:
        try:
            custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
            return
        except ApiException as e:
            if e.status != 404 or time.time() > deadline:
                raise
            time.sleep(0.2)


def test_crd_and_custom_objects(api):
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    name = f"{PLURAL}.{GROUP}"
    created = ext.create_custom_resource_definition(crd_body())
    assert created.metadata.name == name
    assert created.spec.names.list_kind == "CronTabList"
    deadline = time.time() + 20
    while not established(ext, name):
        assert time.time() < deadline, "CRD not Established"
        time.sleep(0.2)
    assert name in [c.metadata.name for c in ext.list_custom_resource_definition().items]
    wait_served(custom)

    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CronTab",
        "metadata": {"name": "every-minute", "labels": {"app": "py"}},
        "spec": {"cronSpec": "* * * * *"},
    }
    made = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, obj)
    assert made["spec"]["replicas"] == 1, "the schema's default"
    assert made["metadata"]["generation"] == 1

    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "every-minute")
    assert got["metadata"]["uid"] == made["metadata"]["uid"]
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, label_selector="app=py")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["every-minute"]
    assert custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["kind"] == "CronTabList"

    # Schema violations: 422 with the field in the message.
    bad = dict(obj, metadata={"name": "bad"}, spec={"cronSpec": "nope", "replicas": -1})
    with pytest.raises(ApiException) as e:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, bad)
    assert e.value.status == 422
    assert "spec.replicas" in e.value.body and "spec.cronSpec" in e.value.body

    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "every-minute", {"spec": {"replicas": 3}}
    )
    assert patched["spec"]["replicas"] == 3
    assert patched["metadata"]["generation"] == 2

    # Status: the main resource ignores it, /status writes it.
    status = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "every-minute", {"status": {"replicas": 3, "selector": "app=py"}}
    )
    assert status["status"]["replicas"] == 3
    assert status["metadata"]["generation"] == 2

    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "every-minute")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["selector"] == "app=py"
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "every-minute", {"spec": {"replicas": 5}}
    )
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "every-minute")
    assert got["spec"]["replicas"] == 5

    # A watch from the list's resourceVersion sees the delete.
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["metadata"]["resourceVersion"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "every-minute")
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        custom.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
        resource_version=rv, timeout_seconds=5,
    ):
        seen.append((ev["type"], ev["object"]["metadata"]["name"]))
        if ev["type"] == "DELETED":
            w.stop()
    assert ("DELETED", "every-minute") in seen

    ext.delete_custom_resource_definition(name)
    deadline = time.time() + 30
    while True:
        try:
            ext.read_custom_resource_definition(name)
        except ApiException as e:
            assert e.status == 404
            break
        assert time.time() < deadline, "CRD not deleted"
        time.sleep(0.2)
