"""deploy/: every manifest parses, has the structure its tool needs, and runs commands that exist.

Commands are checked against the real parsers: ``hetsched ...`` against
:func:`api.cli.build_parser`, ``ray start ...`` against Ray's own click
command (unknown flags and badly typed values fail), and HTTP probe paths
against the routes of :func:`api.app.create_app`. KubeRay turns
``rayStartParams`` into ``ray start`` flags; :func:`kuberay_ray_start_argv`
mirrors its rule (``"true"`` becomes a bare flag, ``"false"`` drops it, any
other value becomes ``--key=value``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"
KUBERAY = DEPLOY / "kuberay"
DOCKERFILE = DEPLOY / "Dockerfile"

# Flags whose value may literally be true/false (KubeRay passes them as --key=value).
KUBERAY_VALUED_BOOLEANS = {"log-color", "include-dashboard"}


def load_all(path: Path) -> list[Any]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kuberay_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(KUBERAY.glob("*.yaml")) for doc in load_all(path)]


def one(kind: str) -> dict[str, Any]:
    found = [d for d in kuberay_docs() if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} under deploy/kuberay, found {len(found)}"
    return found[0]


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a ``sh -c`` script joined by ``&&``, without ``exec``."""
    commands = []
    for part in re.split(r"\s*&&\s*", script.strip()):
        argv = shlex.split(part)
        if argv and argv[0] == "exec":
            argv = argv[1:]
        if argv:
            commands.append(argv)
    return commands


def command_lines(command: str | list[str]) -> list[list[str]]:
    """A compose or container command (string or list) as argv lists."""
    if isinstance(command, str):
        return shell_commands(command)
    if command[:2] == ["sh", "-c"]:
        return shell_commands(command[2])
    return [list(command)]


def check_ray_start(argv: list[str]) -> dict[str, Any]:
    """Parse ``ray start`` arguments with Ray's own command; returns the parsed params."""
    from ray.scripts.scripts import start

    assert argv[:2] == ["ray", "start"], argv
    context = start.make_context("ray start", list(argv[2:]))
    params = context.params
    assert params["head"] != bool(params["address"]), (
        f"ray start needs exactly one of --head and --address: {argv}"
    )
    return params


def check_hetsched(argv: list[str]) -> Any:
    assert argv[0] == "hetsched", argv
    args = build_parser(argv[1]).parse_args(argv[1:])
    assert callable(args.run)
    return args


def app_paths() -> set[str]:
    """Paths the control plane serves, from its OpenAPI schema (built without starting it)."""
    from api.app import create_app

    return set(create_app().openapi()["paths"])


def kuberay_ray_start_argv(params: dict[str, str], *, head: bool, address: str) -> list[str]:
    argv = ["ray", "start", "--head" if head else f"--address={address}", "--block"]
    for key, value in params.items():
        text = str(value)
        if text.lower() in ("true", "false") and key not in KUBERAY_VALUED_BOOLEANS:
            if text.lower() == "true":
                argv.append(f"--{key}")
        else:
            argv.append(f"--{key}={text}")
    return argv


def test_every_manifest_parses_as_yaml() -> None:
    paths = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert COMPOSE in paths and len(list(KUBERAY.glob("*.yaml"))) >= 2
    for path in paths:
        assert load_all(path), f"{path} is empty"


# --- Dockerfile -------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_copies_what_exists_and_serves_the_control_plane() -> None:
    import json

    instructions = dockerfile_instructions()
    assert instructions[0][0] in ("ARG", "FROM")
    assert any(word == "FROM" for word, _ in instructions)
    for word, rest in instructions:
        if word == "COPY":
            *sources, _dest = rest.split()
            for source in sources:
                assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
    cmd = json.loads(next(rest for word, rest in instructions if word == "CMD"))
    args = check_hetsched(cmd)
    assert args.command == "serve" and args.port == 8000 and args.host == "0.0.0.0"
    exposed = next(rest for word, rest in instructions if word == "EXPOSE").split()
    assert "8000" in exposed and "6379" in exposed
    healthcheck = next(rest for word, rest in instructions if word == "HEALTHCHECK")
    assert "/healthz" in healthcheck and "/healthz" in app_paths()
    # The build context must not ship the local virtualenv or data.
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv/" in ignore and ".git/" in ignore


# --- docker compose -----------------------------------------------------------


def test_compose_has_a_ray_head_two_gpu_workers_and_the_control_plane() -> None:
    (compose,) = load_all(COMPOSE)
    services = compose["services"]
    heads, workers, planes = [], [], []
    for name, service in services.items():
        for argv in command_lines(service["command"]):
            if argv[:2] == ["ray", "start"]:
                params = check_ray_start(argv)
                (heads if params["head"] else workers).append((name, params))
            elif argv[0] == "hetsched":
                args = check_hetsched(argv)
                if args.ray_address:
                    planes.append((name, args, service))
            else:
                pytest.fail(f"service {name} runs an unknown command {argv[0]!r}")
        for dep in service.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown service {dep}"
        image_build = service.get("build")
        if image_build:
            context = (COMPOSE.parent / image_build["context"]).resolve()
            assert (context / image_build["dockerfile"]).is_file()
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in compose.get("volumes", {}), volume

    assert len(heads) == 1, heads
    head_name, head = heads[0]
    gpu_workers = [name for name, params in workers if params["num_gpus"] != 0]
    assert len(gpu_workers) >= 2, "two Ray worker nodes with GPUs"
    for name in gpu_workers:
        assert (
            services[name]["deploy"]["resources"]["reservations"]["devices"][0]["driver"]
            == "nvidia"
        )
        params = dict(workers)[name]
        assert params["address"] == f"{head_name}:{head['port']}"
    assert not head["num_gpus"] and head["num_cpus"] == 0, "the head schedules no training"

    # The control plane joins the cluster (a driver needs a local raylet) and attaches.
    assert len(planes) == 1
    name, args, service = planes[0]
    joined = [p for n, p in workers if n == name]
    assert joined and joined[0]["num_gpus"] == 0 and joined[0]["num_cpus"] == 0
    assert args.ray_address == "auto"
    assert f"{args.port}" in [p.split(":")[-1] for p in service["ports"]]

    # The GPU-free demo runs the embedded default.
    sim = services["sim"]
    (argv,) = command_lines(sim["command"])
    sim_args = check_hetsched(argv)
    assert sim_args.ray_address is None and sim_args.cluster is None


# --- KubeRay ------------------------------------------------------------------


def test_raycluster_has_one_worker_group_per_gpu_type() -> None:
    import ray

    from scheduler.hardware.catalogue import lookup

    cluster = one("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert spec["rayVersion"].split(".")[:2] == ray.__version__.split(".")[:2], (
        "rayVersion must match the Ray the image installs"
    )
    head = spec["headGroupSpec"]
    head_params = check_ray_start(
        kuberay_ray_start_argv(head["rayStartParams"], head=True, address="")
    )
    assert head_params["num_gpus"] == 0 and head_params["num_cpus"] == 0
    images = {c["image"] for c in head["template"]["spec"]["containers"]}
    address = f"{cluster['metadata']['name']}-head-svc:6379"

    groups = spec["workerGroupSpecs"]
    types = []
    for group in groups:
        where = f"workerGroupSpecs[{group['groupName']}]"
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        params = check_ray_start(
            kuberay_ray_start_argv(group["rayStartParams"], head=False, address=address)
        )
        pod = group["template"]["spec"]
        assert pod["nodeSelector"], f"{where}: needs a nodeSelector for its GPU type"
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), where
        (container,) = pod["containers"]
        images.add(container["image"])
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus == params["num_gpus"] >= 1, f"{where}: num-gpus must equal the GPU limit"
        # The pods' GPU type is a catalogue entry of the model Ray's label names.
        accelerator = group["labels"]["ray.io/accelerator-type"]
        gpu_type = group["template"]["metadata"]["labels"]["hetsched.io/gpu-type"]
        assert lookup(gpu_type).key.split("-")[0] == accelerator.upper(), where
        types.append(gpu_type)
    assert len(types) == len(set(types)) >= 2, "one worker group per GPU type"
    assert len({g["groupName"] for g in groups}) == len(groups)

    deployment = one("Deployment")
    (plane,) = deployment["spec"]["template"]["spec"]["containers"]
    assert plane["image"] in images and len(images) == 1, "one image for Ray and the control plane"


def test_control_plane_deployment_joins_the_raycluster_and_serves() -> None:
    cluster = one("RayCluster")
    deployment = one("Deployment")
    service = one("Service")
    assert deployment["apiVersion"] == "apps/v1" and service["apiVersion"] == "v1"
    template = deployment["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"

    (container,) = template["spec"]["containers"]
    ray_start, serve = command_lines(container["command"] + container["args"])
    params = check_ray_start(ray_start)
    assert params["address"] == f"{cluster['metadata']['name']}-head-svc:6379"
    assert params["num_gpus"] == 0 and params["num_cpus"] == 0
    args = check_hetsched(serve)
    assert args.command == "serve" and args.ray_address == "auto"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)

    paths = app_paths()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in paths, probe

    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in template["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    pvcs = {
        d["metadata"]["name"] for d in kuberay_docs() if d.get("kind") == "PersistentVolumeClaim"
    }
    assert claims and claims <= pvcs
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    data_volume = next(
        v["name"] for v in template["spec"]["volumes"] if "persistentVolumeClaim" in v
    )
    assert str(args.data_dir) == mounts[data_volume]
    token = next(e for e in container["env"] if e["name"] == "HETSCHED_API_TOKEN")
    # --host 0.0.0.0 without a token is refused, so the secret must not be optional.
    assert token["valueFrom"]["secretKeyRef"].get("optional", False) is False


def test_kustomization_lists_existing_files() -> None:
    (kustomization,) = load_all(KUBERAY / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (KUBERAY / resource).is_file(), resource
    assert {p.name for p in KUBERAY.glob("*.yaml")} - {"kustomization.yaml"} == set(
        kustomization["resources"]
    )


def test_the_checks_reject_what_would_break_a_deployment() -> None:
    """The checkers above are not vacuous: a typo'd flag or wrong command fails them."""
    import click

    with pytest.raises(click.UsageError):
        check_ray_start(["ray", "start", "--address=ray-head:6379", "--num-gpu=1"])
    with pytest.raises(click.BadParameter):
        check_ray_start(["ray", "start", "--head", "--num-gpus=all"])
    with pytest.raises(SystemExit):
        check_hetsched(["hetsched", "serve", "--ray-adress", "auto"])
    assert kuberay_ray_start_argv(
        {"disable-usage-stats": "true", "num-gpus": "2", "include-dashboard": "false"},
        head=False,
        address="h:1",
    ) == [
        "ray",
        "start",
        "--address=h:1",
        "--block",
        "--disable-usage-stats",
        "--num-gpus=2",
        "--include-dashboard=false",
    ]


def test_readme_hetsched_commands_parse() -> None:
    """Every ``hetsched ...`` line in deploy/README.md's code blocks is accepted by the CLI."""
    text = (DEPLOY / "README.md").read_text()
    fenced = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    blocks = [body for lang, body in fenced if lang in ("", "bash", "sh")]
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("hetsched ")]
    assert commands
    for argv in commands:
        check_hetsched(argv)


def test_kustomize_renders_the_manifests() -> None:
    """``kubectl kustomize`` (offline) builds what ``kubectl apply -k deploy/kuberay`` applies."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(KUBERAY)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d)
    assert kinds == [
        "Deployment",
        "PersistentVolumeClaim",
        "PersistentVolumeClaim",
        "RayCluster",
        "Service",
    ]


def test_compose_services_on_the_network_require_the_api_token() -> None:
    """``hetsched serve --host 0.0.0.0`` refuses to start without a token, so compose must
    demand one (``${VAR:?message}``) instead of passing an empty default."""
    (compose,) = load_all(COMPOSE)
    serving = 0
    for name, service in compose["services"].items():
        for argv in command_lines(service["command"]):
            if argv[0] != "hetsched":
                continue
            args = check_hetsched(argv)
            if args.host == "0.0.0.0" and not args.insecure_no_token:
                serving += 1
                token = service["environment"]["HETSCHED_API_TOKEN"]
                assert token.startswith("${HETSCHED_API_TOKEN:?"), (name, token)
    assert serving == 2  # the control plane and the simulation


# --- token authentication and the shared checkpoint volume ---------------------------


def compose_ray_services() -> dict[str, dict[str, Any]]:
    """Compose services that are Ray nodes or attach to the Ray cluster."""
    (compose,) = load_all(COMPOSE)
    found = {}
    for name, service in compose["services"].items():
        for argv in command_lines(service["command"]):
            is_ray = argv[:2] == ["ray", "start"]
            if is_ray or (argv[0] == "hetsched" and check_hetsched(argv).ray_address):
                found[name] = service
    return found


def test_compose_ray_cluster_runs_under_token_authentication() -> None:
    """Head, workers and the control plane all speak token auth with one shared token,
    which compose demands (``${VAR:?message}``) rather than defaulting to empty."""
    services = compose_ray_services()
    assert {"ray-head", "ray-worker-1", "ray-worker-2", "control-plane"} <= set(services)
    for name, service in services.items():
        env = service["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?"), (name, env)


def test_compose_checkpoints_go_to_one_volume_every_ray_node_mounts() -> None:
    (compose,) = load_all(COMPOSE)
    services = compose_ray_services()
    uri = services["control-plane"]["environment"]["HETSCHED_CHECKPOINT_URI"]
    volumes = set()
    for name, service in services.items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}  # path -> volume
        assert uri in mounts, f"{name} does not mount the checkpoint location {uri}"
        volumes.add(mounts[uri])
    assert len(volumes) == 1, f"every node must mount the same volume at {uri}: {volumes}"
    assert volumes <= set(compose["volumes"]), "a named volume, shared by the containers"
    assert f"mkdir -p /data {uri}" in DOCKERFILE.read_text(), "the mount point, owned by hetsched"


def kuberay_ray_pods() -> dict[str, dict[str, Any]]:
    """Pod specs of the Ray head, every worker group and the control plane."""
    spec = one("RayCluster")["spec"]
    pods = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec["workerGroupSpecs"]:
        pods[group["groupName"]] = group["template"]["spec"]
    pods["control-plane"] = one("Deployment")["spec"]["template"]["spec"]
    return pods


def test_kuberay_every_ray_pod_and_the_control_plane_get_one_ray_token() -> None:
    secrets = set()
    for name, pod in kuberay_ray_pods().items():
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", name
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref.get("optional", False) is False, f"{name}: a missing token must stop the pod"
        secrets.add((ref["name"], ref["key"]))
    assert len(secrets) == 1, f"one token for the whole cluster, found {secrets}"


def test_kuberay_checkpoints_go_to_one_shared_claim_every_pod_mounts() -> None:
    pods = kuberay_ray_pods()
    (plane,) = pods["control-plane"]["containers"]
    uri = next(e["value"] for e in plane["env"] if e["name"] == "HETSCHED_CHECKPOINT_URI")
    claims = set()
    for name, pod in pods.items():
        (container,) = pod["containers"]
        mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert uri in mounted, f"{name} does not mount the checkpoint location {uri}"
        volume = next(v for v in pod["volumes"] if v["name"] == mounted[uri])
        claims.add(volume["persistentVolumeClaim"]["claimName"])
    assert len(claims) == 1, f"every pod must mount the same claim at {uri}: {claims}"
    (claim,) = claims
    pvc = next(
        d
        for d in kuberay_docs()
        if d.get("kind") == "PersistentVolumeClaim" and d["metadata"]["name"] == claim
    )
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "many pods mount it at once"
