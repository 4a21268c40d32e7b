"""The deployment files of `deploy/`, rendered and validated as a cluster would take them.

Each kustomization (`deploy/base`, `deploy/overlays/kserve`, `deploy/overlays/llm-d`) is
rendered with `kubectl kustomize`, and every object it gives is validated:

- core kinds with `kubernetes-validate` (PyPI), strictly (an unknown field fails), against
  the oldest and the newest Kubernetes versions below;
- custom resources against the schemas of their CRDs kept in `deploy/crds` (their source and
  version in `deploy/crds/README.md`), strictly as the API server's field validation is:
  a field the schema does not declare fails unless the schema keeps unknown fields;
- what a schema cannot say: every `settings.json` a ConfigMap carries passes
  `hangard config check`; probes ask routes hangard serves, the KServe runtime's readiness
  is `/healthz` and its settings trust the local agent on its model folder; the pool, the
  Services and the picker's config point at pods, ports and plugins that exist; the picker
  scrapes `/metrics/node`.

Then it breaks things on purpose (a misspelled field, a wrong type in a custom resource, a
missing required field, a kustomization naming a missing file, a Service selecting nothing)
and asserts each is caught, so a validator that passes everything fails this script.

Environment: HANGARD (the binary, for `config check`), KUBECTL (default `kubectl`).
"""

import copy
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = ["base", "overlays/kserve", "overlays/llm-d"]
# The oldest Kubernetes minor the files are meant for, and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
HANGARD = os.environ.get("HANGARD", str(ROOT / "target/debug/hangard"))
# Routes of hangard a probe may ask.
PROBE_PATHS = {"/healthz", "/readyz"}


def render(directory):
    """`kubectl kustomize <directory>` as a list of objects; raises with kubectl's message."""
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def load_crds():
    """{(group, version, kind): strict schema} from deploy/crds."""
    schemas = {}
    for path in sorted((DEPLOY / "crds").iterdir()):
        if path.name.endswith(".yaml.gz"):
            crd = yaml.safe_load(gzip.open(path, "rt"))
        elif path.name.endswith(".yaml"):
            crd = yaml.safe_load(path.read_text())
        else:
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (spec["group"], version["name"], spec["names"]["kind"])
            schemas[key] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema):
    """The schema with undeclared fields refused, as the API server's strict field validation
    refuses them: every object schema that lists properties, keeps no unknown fields and has
    no additionalProperties of its own gets `additionalProperties: false`."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def validate(obj, crds):
    """Problems of one object, as strings (empty when it validates)."""
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    key = (group, version, obj.get("kind"))
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if key in crds:
        errors = jsonschema.Draft7Validator(crds[key]).iter_errors(obj)
        return [f"{name}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    if "." in group and not group.endswith(".k8s.io"):
        return [f"{name}: no CRD in deploy/crds for {obj['apiVersion']} {obj['kind']}"]
    problems = []
    for k8s in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, k8s, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(map(str, e.path))
            problems.append(f"{name} (Kubernetes {k8s}): {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name}: Kubernetes {k8s} has no {obj['apiVersion']} {obj['kind']}")
    return problems


def pod_templates(objects):
    """(name, labels, pod spec) of every pod an object makes."""
    for o in objects:
        if o["kind"] == "Deployment":
            template = o["spec"]["template"]
            yield o["metadata"]["name"], template["metadata"].get("labels", {}), template["spec"]
        elif o["kind"] == "ClusterServingRuntime":
            yield o["metadata"]["name"], {}, o["spec"]


def hangard_containers(objects):
    for name, labels, spec in pod_templates(objects):
        for c in spec.get("containers", []):
            if "hangard" in c.get("image", "") or c.get("args", [None])[0] == "serve":
                yield name, labels, spec, c


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def config_check(settings_json):
    with tempfile.TemporaryDirectory() as config:
        Path(config, "settings.json").write_text(settings_json)
        done = subprocess.run(
            [HANGARD, "config", "check", "--config", config], capture_output=True, text=True
        )
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def semantics(label, objects):
    """What a schema cannot say, as problems."""
    problems = []
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    settings = {}
    for cm in by_kind.get("ConfigMap", []):
        if "settings.json" in cm.get("data", {}):
            ok, out = config_check(cm["data"]["settings.json"])
            if not ok:
                problems.append(f"{label}: ConfigMap/{cm['metadata']['name']}: {out}")
            settings[cm["metadata"]["name"]] = json.loads(cm["data"]["settings.json"])
    containers = list(hangard_containers(objects))
    if not containers:
        problems.append(f"{label}: no hangard container")
    for owner, labels, spec, c in containers:
        where = f"{label}: {owner}/{c['name']}"
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"]:
            path = c.get(probe, {}).get("httpGet", {}).get("path")
            if probe != "startupProbe" and path is None:
                problems.append(f"{where}: no {probe}")
            elif path is not None and path not in PROBE_PATHS:
                problems.append(f"{where}: {probe} asks {path}, which hangard does not serve")
        mounted = [v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v]
        node = next((settings[m] for m in mounted if m in settings), None)
        if node is None:
            problems.append(f"{where}: mounts no settings ConfigMap of this render")
            continue
        ports = {p["containerPort"] for p in c.get("ports", [])}
        if node.get("port") not in ports:
            problems.append(f"{where}: settings port {node.get('port')} is not a container port")
        if c["name"] == "kserve-container":
            if c["readinessProbe"]["httpGet"]["path"] != "/healthz":
                problems.append(f"{where}: a KServe runtime must be ready on /healthz")
            if not node.get("http", {}).get("trust_local_repository_agent"):
                problems.append(f"{where}: the KServe agent's loopback calls are not trusted")
            if node.get("model_repository") != "/mnt/models":
                problems.append(f"{where}: the repository is not KServe's /mnt/models")
    pods = list(pod_templates(objects))
    for svc in by_kind.get("Service", []):
        selector = svc["spec"].get("selector", {})
        if not any(selects(selector, labels) for _, labels, _ in pods):
            problems.append(f"{label}: Service/{svc['metadata']['name']} selects no pod")
    for pool in by_kind.get("InferencePool", []):
        problems += check_pool(label, pool, pods, by_kind)
    return problems


def check_pool(label, pool, pods, by_kind):
    problems = []
    where = f"{label}: InferencePool/{pool['metadata']['name']}"
    selected = [p for p in pods if selects(pool["spec"]["selector"]["matchLabels"], p[1])]
    if not selected:
        problems.append(f"{where}: selects no pod")
    for name, _, spec in selected:
        ports = {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
        for target in pool["spec"]["targetPorts"]:
            if target["number"] not in ports:
                problems.append(f"{where}: pod {name} has no port {target['number']}")
    ref = pool["spec"]["endpointPickerRef"]
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    epp = services.get(ref["name"])
    if epp is None or ref["port"]["number"] not in {p["port"] for p in epp["spec"]["ports"]}:
        problems.append(f"{where}: no Service {ref['name']} on port {ref['port']['number']}")
    for cm in by_kind.get("ConfigMap", []):
        for key, text in cm.get("data", {}).items():
            config = yaml.safe_load(text) if key.endswith(".yaml") else None
            if isinstance(config, dict) and config.get("kind") == "EndpointPickerConfig":
                problems += check_picker(f"{label}: ConfigMap/{cm['metadata']['name']}", config)
    return problems


def check_picker(where, config):
    """The picker's config: known shape, references that resolve, /metrics/node scraped."""
    problems = []
    if config.get("apiVersion") != "inference.networking.x-k8s.io/v1alpha1":
        problems.append(f"{where}: apiVersion {config.get('apiVersion')}")
    plugins = {p.get("name", p["type"]): p for p in config.get("plugins", [])}
    refs = [r["pluginRef"] for prof in config.get("schedulingProfiles", []) for r in prof["plugins"]]
    for source in config.get("data", {}).get("sources", []):
        refs.append(source["pluginRef"])
        refs += [e["pluginRef"] for e in source.get("extractors", [])]
    problems += [f"{where}: no plugin named {r}" for r in refs if r not in plugins]
    sources = [p for p in plugins.values() if p["type"] == "metrics-data-source"]
    if [s.get("parameters", {}).get("path") for s in sources] != ["/metrics/node"]:
        problems.append(f"{where}: the picker must scrape /metrics/node, once")
    if "lora-affinity-scorer" not in {p["type"] for p in plugins.values()}:
        problems.append(f"{where}: no lora-affinity-scorer (model residency)")
    return problems


def all_problems(label, objects, crds):
    problems = [p for o in objects for p in validate(o, crds)]
    return problems + semantics(label, objects)


def breakages(rendered, crds):
    """(what, problems) of each broken copy: every one must have problems."""
    out = []
    base = rendered["base"]
    deployment = copy.deepcopy(next(o for o in base if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["containerPorts"] = []
    out.append(("a misspelled Deployment field", validate(deployment, crds)))
    kserve = rendered["overlays/kserve"]
    runtime = copy.deepcopy(next(o for o in kserve if o["kind"] == "ClusterServingRuntime"))
    runtime["spec"]["multiModel"] = "yes"
    out.append(("ClusterServingRuntime multiModel: \"yes\"", validate(runtime, crds)))
    model = copy.deepcopy(next(o for o in kserve if o["kind"] == "TrainedModel"))
    model["spec"]["model"]["storgeUri"] = model["spec"]["model"].pop("storageUri")
    out.append(("TrainedModel with storageUri misspelled", validate(model, crds)))
    pool = copy.deepcopy(next(o for o in rendered["overlays/llm-d"] if o["kind"] == "InferencePool"))
    del pool["spec"]["selector"]
    out.append(("InferencePool without a selector", validate(pool, crds)))
    lonely = [copy.deepcopy(o) for o in base]
    for o in lonely:
        if o["kind"] == "Service":
            o["spec"]["selector"]["app.kubernetes.io/component"] = "nothing"
    out.append(("a Service selecting no pod", semantics("base", lonely)))
    with tempfile.TemporaryDirectory() as scratch:
        copy_of = Path(scratch) / "deploy"
        shutil.copytree(DEPLOY, copy_of)
        (copy_of / "base/service.yaml").unlink()
        try:
            render(copy_of / "base")
            out.append(("a kustomization naming a missing file", []))
        except RuntimeError as e:
            out.append(("a kustomization naming a missing file", [str(e)]))
    return out


def main():
    crds = load_crds()
    failed = False
    rendered = {}
    for name in KUSTOMIZATIONS:
        objects = render(DEPLOY / name)
        rendered[name] = objects
        problems = all_problems(name, objects, crds)
        kinds = sorted({o["kind"] for o in objects})
        if problems:
            failed = True
            print(f"FAIL: deploy/{name} ({len(objects)} objects)")
            for p in problems:
                print(f"  {p}")
        else:
            print(f"ok: deploy/{name}: {len(objects)} objects validate ({', '.join(kinds)})")
    for what, problems in breakages(rendered, crds):
        if problems:
            print(f"ok: caught {what}: {problems[0].splitlines()[0]}")
        else:
            failed = True
            print(f"FAIL: {what} was not caught")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
