"""Offline checks of cluster/: launcher configs, KubeRay manifests, Dockerfile, README commands.

Nothing here contacts a cloud, a registry or a Kubernetes API; nothing is built or started.

- Ray cluster launcher YAMLs: Ray's own schema (``ray/autoscaler/ray-schema.json``) and Ray's own
  preparation (``prepare_config`` + ``validate_config``, what ``ray up`` does before it calls the
  cloud); a typo fails (negative tests); EC2 node configs against botocore's RunInstances model,
  Compute Engine node configs against the Compute API's discovery document; GPU node types
  declare the GPUs their machines have; the head takes no trials; the start commands parse with
  ``ray start`` and publish the dashboard; setup installs raysearch on Ray's image of this Ray.
- KubeRay manifests (no CRD schema ships with Ray or KubeRay's Python packages): apiVersion, kind
  and the known fields of RayCluster / RayJob, GPU limits, image and Ray version consistent with
  cluster/Dockerfile, the RayJob entrypoint parsed by ``raysearch sweep``'s own option parser;
  every pod template, Deployment and Service against Kubernetes' schemas (kubernetes-validate).
- cluster/Dockerfile: FROM Ray's image of the installed Ray version; installs raysearch.
- cluster/README.md: every ``raysearch``, ``ray`` and ``mlflow server`` command in its code
  blocks parses with the installed command-line tools (docs and CLIs cannot drift); the
  placeholders the files use are all listed.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shlex
from importlib.metadata import version
from pathlib import Path

import click
import jsonschema
import pytest
import ray
import yaml

# importing Ray's CLI imports Ray Serve, whose pydantic models warn on import
pytestmark = pytest.mark.filterwarnings(
    "ignore:Using extra keyword arguments on `Field`:DeprecationWarning")

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
KUBERAY = CLUSTER / "kuberay"
LAUNCHERS = ["aws-gpu.yaml", "gcp-gpu.yaml", "onprem.yaml"]
CLOUD_LAUNCHERS = ["aws-gpu.yaml", "gcp-gpu.yaml"]

# vCPUs and NVIDIA GPUs of the machine types the configs use (AWS and Google Cloud docs). Ray
# advertises exactly what a node type's `resources` say, so they must match the machine.
AWS_MACHINES = {"g5.xlarge": (4, 1), "g5.12xlarge": (48, 4), "m5.2xlarge": (8, 0)}
# accelerator-optimized GCE machine types come with their GPUs (no guestAccelerators)
GCP_BUILTIN_GPUS = {"g2-standard-8": (8, 1), "a2-highgpu-1g": (12, 1)}
GCP_VCPUS = {"n1-standard-8": 8, "n1-standard-32": 32}

# Fields of the KubeRay v1 API (RayCluster / RayJob) that a manifest here may use: a typo or a
# field from another API version fails instead of being silently dropped by the operator.
RAYCLUSTER_SPEC = {"rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec",
                   "workerGroupSpecs", "suspend", "headServiceAnnotations",
                   "gcsFaultToleranceOptions", "managedBy"}
AUTOSCALER_OPTIONS = {"upscalingMode", "idleTimeoutSeconds", "image", "imagePullPolicy",
                      "resources", "env", "envFrom", "securityContext", "volumeMounts", "version"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType", "headService", "enableIngress"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams",
                "template", "idleTimeoutSeconds", "scaleStrategy", "suspend", "numOfHosts"}
RAYJOB_SPEC = {"entrypoint", "runtimeEnvYAML", "shutdownAfterJobFinishes",
               "ttlSecondsAfterFinished", "activeDeadlineSeconds", "rayClusterSpec",
               "submissionMode", "submitterPodTemplate", "backoffLimit", "clusterSelector",
               "entrypointNumCpus", "entrypointNumGpus", "entrypointResources", "jobId",
               "metadata", "suspend", "managedBy", "deletionStrategy", "submitterConfig"}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def _ray_schema() -> dict:
    import ray.autoscaler

    path = os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")
    with open(path) as f:
        return json.load(f)


def _head_and_workers(config: dict) -> tuple[dict, dict[str, dict]]:
    types = config["available_node_types"]
    head = config["head_node_type"]
    return types[head], {k: v for k, v in types.items() if k != head}


def _parse(cli: click.Group, argv: list[str]) -> tuple[click.Command, dict]:
    """Resolve `argv` through a click group and parse it: unknown options or bad values raise."""
    cmd, name, args = cli, None, list(argv)
    while isinstance(cmd, click.Group):
        assert args, f"no subcommand in {argv}"
        name = args.pop(0)
        assert name in cmd.commands, f"unknown command {name!r} in {argv}"
        cmd = cmd.commands[name]
    ctx = cmd.make_context(name, args)
    return cmd, ctx.params


def _raysearch(argv: list[str]) -> dict:
    from raysearch.cli.commands import main

    assert argv[0] == "raysearch", argv
    return _parse(main, argv[1:])[1]


def _ray(argv: list[str]) -> dict:
    from ray.scripts.scripts import cli

    assert argv[0] == "ray", argv
    return _parse(cli, argv[1:])[1]


def _mlflow(argv: list[str]) -> dict:
    from mlflow.cli import cli

    assert argv[0] == "mlflow", argv
    return _parse(cli, argv[1:])[1]


def _dockerfile() -> list[str]:
    """Dockerfile instructions, continuation lines joined, comments dropped."""
    text = (CLUSTER / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [line.strip() for line in text.splitlines() if line.strip()]


def _documented_image() -> str:
    """The registry tag cluster/Dockerfile tells users to build and push."""
    tags = re.findall(r"docker build -f cluster/Dockerfile -t (\S+) \.",
                      (CLUSTER / "Dockerfile").read_text())
    pushed = [t for t in tags if "/" in t]
    assert len(set(pushed)) == 1, f"one registry tag expected in the Dockerfile's notes: {tags}"
    return pushed[0]


def _code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", markdown, flags=re.S | re.M)


def _commands(block: str) -> list[list[str]]:
    """Shell command lines of a code block, `\\` continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", block)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words = words[:-1]
        if words:
            out.append(words)
    return out


def _readme_commands() -> list[list[str]]:
    text = (CLUSTER / "README.md").read_text()
    return [cmd for block in _code_blocks(text) for cmd in _commands(block)]


def _entrypoint_of(submit: list[str]) -> list[str]:
    """The command after `--` of a `ray job submit ... -- CMD`."""
    return submit[submit.index("--") + 1:]


# --------------------------------------------------------------------------------------------
# Ray cluster launcher configs
# --------------------------------------------------------------------------------------------


def test_the_launcher_configs_are_there():
    assert sorted(p.name for p in CLUSTER.glob("*.yaml")) == sorted(LAUNCHERS)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_config_passes_rays_schema_and_preparation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _load(name)
    jsonschema.validate(config, _ray_schema())
    # what `ray up` does before it talks to the cloud: defaults merged, node types filled in
    # (the local provider builds its single node type from head_ip / worker_ips)
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


@pytest.mark.parametrize(("where", "mutate"), [
    ("top-level key", lambda c: c.update(max_wrokers=c.pop("max_workers"))),
    ("node type key", lambda c: c["available_node_types"]["gpu.1xa10g"].update(
        min_wrokers=c["available_node_types"]["gpu.1xa10g"].pop("min_workers"))),
    ("docker key", lambda c: c["docker"].update(imgae=c["docker"].pop("image"))),
    ("fractional GPU resource", lambda c: c["available_node_types"]["gpu.1xa10g"].update(
        resources={"CPU": 4, "GPU": 0.5})),
    ("missing provider", lambda c: c.pop("provider")),
])
def test_rays_schema_rejects_a_broken_config(where, mutate):
    config = _load("aws-gpu.yaml")
    jsonschema.validate(config, _ray_schema())
    mutate(config)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, _ray_schema())


@pytest.mark.parametrize("name", CLOUD_LAUNCHERS)
def test_the_head_takes_no_trials(name):
    head, workers = _head_and_workers(_load(name))
    assert head["resources"] == {"CPU": 0}
    assert workers
    assert all(t["resources"].get("GPU", 0) >= 1 for t in workers.values())
    for node_type in workers.values():
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"]


def test_aws_node_types_declare_the_gpus_of_their_instances():
    config = _load("aws-gpu.yaml")
    for name, node_type in config["available_node_types"].items():
        instance = node_type["node_config"]["InstanceType"]
        assert instance in AWS_MACHINES, f"{name}: add {instance}'s vCPUs and GPUs to the table"
        vcpus, gpus = AWS_MACHINES[instance]
        if name == config["head_node_type"]:
            assert gpus == 0, "the head is a CPU machine"
            continue
        assert node_type["resources"] == {"CPU": vcpus, "GPU": gpus}, name
        # workers write checkpoints to S3: they need an instance profile of their own
        assert node_type["node_config"]["IamInstanceProfile"]["Arn"].endswith(
            ":instance-profile/ray-autoscaler-v1")


def test_aws_node_configs_are_valid_run_instances_requests():
    botocore_session = pytest.importorskip("botocore.session")
    from botocore.validate import ParamValidator

    model = botocore_session.get_session().get_service_model("ec2")
    request = model.operation_model("RunInstances").input_shape
    instance_types = set(model.shape_for("InstanceType").enum)
    for name, node_type in _load("aws-gpu.yaml")["available_node_types"].items():
        # Ray passes node_config to ec2.create_instances together with these
        params = {**node_type["node_config"], "MinCount": 1, "MaxCount": 1}
        report = ParamValidator().validate(params, request)
        assert not report.has_errors(), f"{name}: {report.generate_report()}"
        assert params["InstanceType"] in instance_types, name
    broken = {**params, "InstanceMarketOption": {"MarketType": "spot"}}
    assert ParamValidator().validate(broken, request).has_errors()


def test_gcp_gpu_node_types_attach_gpus_and_never_live_migrate():
    config = _load("gcp-gpu.yaml")
    project = config["provider"]["project_id"]
    head, workers = _head_and_workers(config)
    assert "guestAccelerators" not in head["node_config"]
    for name, node_type in workers.items():
        node = node_type["node_config"]
        machine = node["machineType"]
        accelerators = node.get("guestAccelerators", [])
        if machine in GCP_BUILTIN_GPUS:
            assert not accelerators, f"{name}: {machine} comes with its GPUs"
            vcpus, gpus = GCP_BUILTIN_GPUS[machine]
        else:
            assert machine.startswith("n1-"), f"{name}: {machine} has no GPU of its own"
            assert accelerators, f"{name}: GPUs via guestAccelerators"
            assert all(a["acceleratorType"].startswith("nvidia-") for a in accelerators)
            vcpus, gpus = GCP_VCPUS[machine], sum(a["acceleratorCount"] for a in accelerators)
        # Ray does not detect resources on GCP: they must be written, and right
        assert node_type["resources"] == {"CPU": vcpus, "GPU": gpus}, name
        # a dict, not Ray's old examples' list (ray-project/ray#46248); GCE refuses GPU VMs
        # that may live-migrate
        assert isinstance(node["scheduling"], dict), name
        assert node["scheduling"]["onHostMaintenance"] == "TERMINATE", name
        # workers write checkpoints to GCS: Ray gives its service account to the head only
        emails = [a["email"] for a in node["serviceAccounts"]]
        assert emails == [f"ray-autoscaler-sa-v1@{project}.iam.gserviceaccount.com"], name


def _check_discovery(value, schema: dict, schemas: dict, path: str) -> list[str]:
    """Unknown fields and wrong JSON types against a Google API discovery schema."""
    if "$ref" in schema:
        schema = schemas[schema["$ref"]]
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        errors = []
        for key, item in value.items():
            if key not in schema["properties"]:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += _check_discovery(item, schema["properties"][key], schemas,
                                           f"{path}.{key}")
        return errors
    if kind == "object":  # a map (labels, ...)
        return [] if isinstance(value, dict) else [f"{path}: expected an object"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, item in enumerate(value)
                for e in _check_discovery(item, schema["items"], schemas, f"{path}[{i}]")]
    if kind == "string" and schema.get("format") in ("int64", "uint64"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer"]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: expected a string"]
        enum = schema.get("enum")
        return [] if not enum or value in enum else [f"{path}: {value!r} not in {enum}"]
    if kind == "integer":
        return [] if isinstance(value, int) and not isinstance(value, bool) else [
            f"{path}: expected an integer"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean"]
    return []


def test_gcp_node_configs_match_the_compute_api():
    googleapiclient = pytest.importorskip("googleapiclient")
    doc_path = (Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                / "compute.v1.json")
    schemas = json.loads(doc_path.read_text())["schemas"]
    for name, node_type in _load("gcp-gpu.yaml")["available_node_types"].items():
        errors = _check_discovery(node_type["node_config"], {"$ref": "Instance"}, schemas, name)
        assert not errors, errors
    # the check can fail: Ray's old list form of `scheduling`, and a typo
    broken = {"machineType": "n1-standard-8", "scheduling": [{"onHostMaintenance": "TERMINATE"}],
              "guestAccelerator": []}
    assert len(_check_discovery(broken, {"$ref": "Instance"}, schemas, "x")) == 2


@pytest.mark.parametrize("name", LAUNCHERS)
def test_start_commands_parse_and_publish_the_dashboard(name):
    config = _load(name)

    def ray_starts(commands):
        starts = []
        for command in commands:
            for part in command.split(";"):
                words = shlex.split(part)
                if words[:2] == ["ray", "start"]:
                    starts.append(_ray(words))
        return starts

    (head,) = ray_starts(config["head_start_ray_commands"])
    (worker,) = ray_starts(config["worker_start_ray_commands"])
    assert head["head"]
    assert head["port"] == 6379
    # Ray Jobs and Ray Train's state API need the dashboard; bound to localhost it would publish
    # 127.0.0.1 to the other nodes, where a DDP trial's controller may run
    assert head["dashboard_host"] == "0.0.0.0"
    assert head["include_dashboard"] is not False
    assert head["autoscaling_config"] == "~/ray_bootstrap_config.yaml"
    assert worker["address"] == "$RAY_HEAD_IP:6379"
    assert not worker["head"]


@pytest.mark.parametrize("name", LAUNCHERS)
def test_setup_installs_raysearch_from_the_synced_checkout(name):
    config = _load(name)
    assert config["file_mounts"] == {"~/raysearch": "."}
    assert ".gitignore" in config["rsync_filter"]
    assert any(re.fullmatch(r"pip install (--quiet )?-e ~/raysearch", c)
               for c in config["setup_commands"])


@pytest.mark.parametrize("name", CLOUD_LAUNCHERS)
def test_cloud_nodes_run_rays_gpu_image_of_this_ray(name):
    image = _load(name)["docker"]["image"]
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray.__version__)}-py3\d+-gpu", image), image
    assert image == _dockerfile_base()


def test_onprem_installs_this_ray_with_its_dashboard():
    setup = " ".join(_load("onprem.yaml")["setup_commands"])
    assert f'"ray[default,tune]=={ray.__version__}"' in setup


# --------------------------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------------------------


def _dockerfile_base() -> str:
    froms = [line.split()[1] for line in _dockerfile() if line.upper().startswith("FROM ")]
    assert len(froms) == 1, froms
    return froms[0]


def test_dockerfile_builds_on_rays_image_of_the_installed_ray():
    base = _dockerfile_base()
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-(gpu|cu\d+)", base)
    assert match, f"expected rayproject/ray:<version>-py3XX-gpu, got {base}"
    assert match.group(1) == ray.__version__
    assert 10 <= int(match.group(2)) <= 13  # raysearch needs Python >= 3.10


def test_dockerfile_installs_raysearch():
    lines = _dockerfile()
    assert any(re.fullmatch(r"COPY (--chown=\S+ )?\. /app", line) for line in lines), lines
    run = " ".join(line for line in lines if line.startswith("RUN "))
    assert re.search(r'pip install --no-cache-dir "/app\$\{EXTRAS\}"', run), run
    assert "raysearch --version" in run
    ignore = (CLUSTER / "Dockerfile.dockerignore").read_text().split()
    for needed in ("raysearch", "search_spaces", "pyproject.toml", "README.md"):
        assert needed not in ignore


# --------------------------------------------------------------------------------------------
# KubeRay manifests
# --------------------------------------------------------------------------------------------


def _kuberay(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d]


def _pod_templates(spec: dict) -> list[tuple[str, dict]]:
    groups = [("head", spec["headGroupSpec"])]
    groups += [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    return [(name, group["template"]) for name, group in groups]


def _check_ray_cluster_spec(spec: dict) -> None:
    assert set(spec) <= RAYCLUSTER_SPEC, set(spec) - RAYCLUSTER_SPEC
    assert set(spec.get("autoscalerOptions", {})) <= AUTOSCALER_OPTIONS
    assert spec["rayVersion"] == ray.__version__
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP, set(head) - HEAD_GROUP
    # rayStartParams become `ray start` flags: string values only
    assert head["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0"}
    head_container = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head_container["resources"].get("limits", {})
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP, set(group) - WORKER_GROUP
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        resources = group["template"]["spec"]["containers"][0]["resources"]
        gpus = resources["limits"]["nvidia.com/gpu"]
        assert isinstance(gpus, int), group["groupName"]
        assert gpus >= 1, group["groupName"]
        assert resources["requests"]["nvidia.com/gpu"] == gpus
    image = _documented_image()
    claim = _kuberay("data-pvc.yaml")[0]["metadata"]["name"]
    for name, template in _pod_templates(spec):
        pod = template["spec"]
        assert [c["image"] for c in pod["containers"]] == [image], name
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in pod["containers"][0].get("volumeMounts", []):
            assert mount["name"] in volumes, f"{name}: volume {mount['name']} is not defined"
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim
        assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} == {"/data"}


def test_raycluster_manifest():
    (cluster,) = _kuberay("raycluster.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    _check_ray_cluster_spec(cluster["spec"])


def test_rayjob_manifest_runs_a_real_sweep_on_the_same_cluster_spec():
    (job,) = _kuberay("rayjob.yaml")
    (cluster,) = _kuberay("raycluster.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"] == cluster["spec"], "rayjob.yaml and raycluster.yaml differ"
    _check_ray_cluster_spec(spec["rayClusterSpec"])
    params = _raysearch(shlex.split(spec["entrypoint"]))
    assert params["storage_path"].startswith("s3://")
    assert params["address"] == "auto"
    assert params["data_dir"] == "/data"
    # the MLflow service of mlflow.yaml, by its in-cluster name
    deployment, service = _kuberay("mlflow.yaml")
    host_port = params["tracking_uri"].removeprefix("http://")
    assert host_port == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"


def test_mlflow_manifest():
    deployment, service = _kuberay("mlflow.yaml")
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    # the server at the version of the client raysearch runs
    assert container["image"] == f"ghcr.io/mlflow/mlflow:v{version('mlflow')}"
    (script,) = container["args"]
    server = shlex.split(script.split("exec ", 1)[1])
    params = _mlflow(server)
    assert params["host"] == "0.0.0.0"
    assert params["port"] == service["spec"]["ports"][0]["port"]
    assert params["backend_store_uri"] == "$MLFLOW_BACKEND_STORE_URI"
    assert params["artifacts_destination"].startswith("s3://")
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-db"
    # MLflow 3 answers 403 to a Host header it does not allow: the in-cluster names the
    # sweeps use, and the port-forward's, must be allowed
    allowed = params["allowed_hosts"].split(",")
    port = service["spec"]["ports"][0]["port"]
    for host in (f"mlflow:{port}", f"mlflow.default.svc.cluster.local:{port}",
                 "127.0.0.1:5000", "localhost:5000"):
        assert any(fnmatch.fnmatch(host, pattern) for pattern in allowed), host


def test_kubernetes_objects_match_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    k8s = kubernetes_validate.latest_version()

    def check(obj):
        kubernetes_validate.validate(obj, k8s, strict=True)

    for doc in _kuberay("mlflow.yaml") + _kuberay("data-pvc.yaml"):
        check(doc)
    (cluster,) = _kuberay("raycluster.yaml")
    for name, template in _pod_templates(cluster["spec"]):
        check({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
               "template": template})
    broken = copy.deepcopy(_pod_templates(cluster["spec"])[0][1])
    broken["spec"]["containers"][0]["resource"] = broken["spec"]["containers"][0].pop(
        "resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        check({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
               "template": broken})


# --------------------------------------------------------------------------------------------
# cluster/README.md
# --------------------------------------------------------------------------------------------


def _readme_ids(cmd: list[str]) -> str:
    return " ".join(cmd)[:70]


README_COMMANDS = [c for c in _readme_commands()
                   if c[0] in ("raysearch", "ray") or c[:2] == ["mlflow", "server"]]


def test_the_readme_has_the_commands_of_each_step():
    firsts = {tuple(c[:2]) for c in README_COMMANDS}
    for expected in [("raysearch", "sweep"), ("ray", "up"), ("ray", "dashboard"),
                     ("ray", "job"), ("ray", "down"), ("ray", "attach"), ("mlflow", "server")]:
        assert expected in firsts, expected
    submits = [c for c in README_COMMANDS if c[:3] == ["ray", "job", "submit"]]
    entrypoints = [_entrypoint_of(c) for c in submits]
    assert any("--workers-per-trial" in e for e in entrypoints)


@pytest.mark.parametrize("cmd", README_COMMANDS, ids=_readme_ids)
def test_readme_command_parses(cmd, monkeypatch):
    monkeypatch.chdir(REPO)
    if cmd[0] == "raysearch":
        _raysearch(cmd)
    elif cmd[0] == "mlflow":
        _mlflow(cmd)
    else:
        params = _ray(cmd)
        config = params.get("cluster_config_file")
        if config:
            assert (REPO / config).is_file(), config
        if cmd[:3] == ["ray", "job", "submit"]:
            _raysearch(_entrypoint_of(cmd))


@pytest.mark.parametrize(
    "cmd", [c for c in README_COMMANDS if c[:3] == ["ray", "job", "submit"]], ids=_readme_ids)
def test_readme_jobs_join_the_cluster_and_keep_results_off_it(cmd):
    params = _raysearch(_entrypoint_of(cmd))
    # without --address the sweep inside a Ray Job fails at once while the autoscaler still has
    # no GPU node up; with `auto` it joins the job's cluster and waits
    assert params["address"] == "auto"
    assert params["tracking_uri"].startswith("http://")
    assert params["storage_path"].startswith(("s3://", "gs://"))
    assert params["data_dir"].startswith("/")


def test_the_parser_check_can_fail():
    with pytest.raises(click.UsageError):
        _raysearch(["raysearch", "sweep", "acls", "--gpus-per-trail", "1"])
    with pytest.raises(click.UsageError):
        _ray(["ray", "up", "--yes-please", "cluster/aws-gpu.yaml"])
    with pytest.raises(click.BadParameter):
        _raysearch(["raysearch", "sweep", "acls", "--num-samples", "many"])


def test_every_placeholder_is_listed_in_the_readme():
    readme = (CLUSTER / "README.md").read_text()
    listed = set(re.findall(r"`(YOUR_[A-Z0-9_]+)`", readme.split("## 1.")[0]))
    used = set()
    for path in CLUSTER.rglob("*"):
        if path.is_file():
            used |= set(re.findall(r"YOUR_[A-Z0-9_]+", path.read_text()))
    assert used <= listed, sorted(used - listed)


def test_readme_builds_the_image_the_manifests_pull():
    readme = (CLUSTER / "README.md").read_text()
    tags = set(re.findall(r"docker (?:build -f cluster/Dockerfile -t|push) (\S+)", readme))
    assert _documented_image() in tags
    assert {t for t in tags if "/" in t} == {_documented_image()}


def test_readme_paths_exist():
    readme = (CLUSTER / "README.md").read_text()
    for path in set(re.findall(r"\bcluster/[\w./-]+\.(?:yaml|md)\b|\bcluster/Dockerfile\b",
                               readme)):
        assert (REPO / path).is_file(), path
