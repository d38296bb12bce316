"""Deployment artefacts: Kubernetes manifests validate strictly, compose files parse.

The Docker end-to-end run lives in tests/test_docker_e2e.py (marker `docker`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.31.0"  # pinned: a newer schema set must not silently change what passes
KUSTOMIZATIONS = ["k8s/base", "k8s/overlays/cpu", "k8s/overlays/gpu"]


def render(kustomization: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (for `kubectl kustomize`) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(REPO / kustomization)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def docs(request) -> list[dict]:
    return render(request.param)


def test_every_document_validates_strictly(docs):
    kv = pytest.importorskip("kubernetes_validate")
    kinds = set()
    for doc in docs:
        # Raises SchemaNotFoundError for an unknown apiVersion/kind (the CLI only warns).
        kv.validate(doc, K8S_VERSION, strict=True)
        kinds.add(doc["kind"])
    assert kinds == {
        "ConfigMap",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }


def test_unknown_api_version_fails_validation():
    kv = pytest.importorskip("kubernetes_validate")
    bogus = {
        "apiVersion": "autoscaling/v9",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"},
    }
    with pytest.raises(kv.SchemaNotFoundError):
        kv.validate(bogus, K8S_VERSION, strict=True)


def test_unknown_field_fails_strict_validation():
    kv = pytest.importorskip("kubernetes_validate")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "dta": {}}
    with pytest.raises(kv.ValidationError):
        kv.validate(cm, K8S_VERSION, strict=True)


def _deployment(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")


def test_pod_is_locked_down_and_probed(docs):
    pod = _deployment(docs)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"


def test_shutdown_timeline_fits_the_grace_period(docs):
    """preStop pause + the service's drain timeout must end before Kubernetes sends SIGKILL."""
    pod = _deployment(docs)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    drain = float(config["BERT_HEADS_DRAIN_TIMEOUT"])
    assert pause + drain < pod["terminationGracePeriodSeconds"]


def test_configmap_names_only_real_settings(docs):
    from service.settings import Settings

    fields = {f"BERT_HEADS_{name.upper()}" for name in Settings.model_fields}
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert set(config) <= fields, set(config) - fields


def test_gpu_overlay_asks_for_a_gpu():
    pod = _deployment(render("k8s/overlays/gpu"))["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["image"].endswith(":local-gpu")
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


# Marked docker: compose is set up with the Docker engine (CI's docker stage, .ci/with-docker.sh).
@pytest.mark.docker
@pytest.mark.parametrize("profiles", [[], ["gpu"], ["monitoring"], ["gpu", "monitoring"]])
def test_compose_config_is_valid(profiles):
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "compose", "version"], capture_output=True).returncode
    ):
        pytest.skip("docker compose is not installed")
    args = [docker, "compose", *[a for p in profiles for a in ("--profile", p)], "config", "-q"]
    subprocess.run(args, cwd=REPO, check=True)


# -- KServe (k8s/kserve): no cluster and no KServe CRD schema here, so the two custom resources
# are checked structurally: the fields KServe reads, their core parts (the container, the
# resources) against Kubernetes' own schema, and the runtime's args parsed by the service.


@pytest.fixture(scope="module")
def kserve() -> dict[str, dict]:
    return {d["kind"]: d for d in render("k8s/kserve")}


def test_the_kserve_runtime_runs_this_image_with_the_v2_protocol(kserve, tmp_path):
    from heads.package import FORMAT_VERSION
    from service.__main__ import parse_settings

    runtime = kserve["ServingRuntime"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2"]
    assert spec["supportedModelFormats"] == [
        {"name": "bert-heads", "version": str(FORMAT_VERSION), "autoSelect": True}
    ]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the name KServe looks for
    kv = pytest.importorskip("kubernetes_validate")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [container]}}  # fmt: skip
    kv.validate(pod, K8S_VERSION, strict=True)
    # KServe fills {{.Name}} with the InferenceService's name; the service parses the rest
    package = tmp_path / "mnt-models"
    package.mkdir()
    args = [a.replace("{{.Name}}", "sentiment").replace("/mnt/models", str(package)) for a in container["args"]]  # fmt: skip
    settings = parse_settings(args)
    assert (settings.model_dir, settings.model_name, settings.port) == (package, "sentiment", 8080)
    # the probes are the protocol's, and the service answers them
    from service.app import create_app

    paths = create_app(settings).openapi()["paths"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in paths


def test_the_example_inference_service_uses_the_runtime(kserve):
    runtime, isvc = kserve["ServingRuntime"], kserve["InferenceService"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    model = isvc["spec"]["predictor"]["model"]
    fmt = runtime["spec"]["supportedModelFormats"][0]
    assert model["modelFormat"] == {"name": fmt["name"], "version": fmt["version"]}
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == "v2" and model["storageUri"].startswith("pvc://")
    kv = pytest.importorskip("kubernetes_validate")
    container = {"name": "x", "image": "x", "resources": model["resources"]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [container]}}  # fmt: skip
    kv.validate(pod, K8S_VERSION, strict=True)
