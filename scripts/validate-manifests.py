#!/usr/bin/env python3
"""Checks the manifests `frugal deploy kubernetes` wrote, offline, as a cluster would.

    scripts/validate-manifests.py DIR

- Core kinds (Deployment, Service, ConfigMap) against Kubernetes' own schemas, which the
  kubernetes-validate package bundles, for an older and the newest Kubernetes it knows, strictly:
  an unknown field is an error, as `kubectl apply` makes it by default.
- KEDA's ScaledObjects against the CRD vendored in data/kubernetes/ (jsonschema), made strict
  the same way, with int32 bounds and the CRD's CEL rule checked by hand.
- Every name and label as the API server checks them, and the references between objects: a
  ScaledObject's target and a Service's selector must find a Deployment.

Exit 0 when every object passes, 1 when any fails, 2 when a module is missing
(`python3 -m pip install kubernetes-validate jsonschema`).
"""

import copy
import pathlib
import re
import sys

try:
    import jsonschema
    import kubernetes_validate
    import yaml  # kubernetes-validate's own dependency
except ImportError as e:
    print(
        f"error: python module {e.name} is missing: "
        "python3 -m pip install kubernetes-validate jsonschema",
        file=sys.stderr,
    )
    sys.exit(2)

CRD = pathlib.Path(__file__).resolve().parent.parent / "data/kubernetes/keda.sh_scaledobjects.yaml"
# An older Kubernetes still in clusters' support windows, and the newest the package knows.
VERSIONS = ["1.30", kubernetes_validate.latest_version()]

# The CRD's CEL rules (x-kubernetes-validations), by rule text, checked by hand: a rule not
# here fails the run, so a newer CRD cannot pass unchecked.
RULES = {
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) "
    "? self.maxReplicaCount : 100)": lambda s: "minReplicaCount" not in s
    or s["minReplicaCount"] <= s.get("maxReplicaCount", 100),
}

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def strict(schema):
    """The schema with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        schema.get("type") == "object"
        and isinstance(schema.get("properties"), dict)
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def cel_rules(schema, path=()):
    """(path of properties, rule) for every CEL rule in the schema."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in schema.get("properties", {}).items():
        yield from cel_rules(sub, path + (name,))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict) and list(cel_rules(schema[key])):
            yield path + (f"<{key}>",), {"rule": "a rule below a list or map"}


def keda_checker():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    formats = jsonschema.FormatChecker()

    @formats.checks("int32")
    def int32(v):
        return not isinstance(v, int) or -(2**31) <= v < 2**31

    # OpenAPI v3.0's schema keywords are JSON Schema draft 4's.
    validator = jsonschema.Draft4Validator(strict(copy.deepcopy(schema)), format_checker=formats)
    rules = list(cel_rules(schema))

    def check(obj):
        errors = [
            f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
        # The API server evaluates CEL rules only on objects its schema admits.
        for path, rule in rules if not errors else []:
            known = RULES.get(rule["rule"])
            if known is None:
                errors.append(f"the CRD has a CEL rule this script does not check: {rule['rule']}")
                continue
            value = obj
            for p in path:
                value = value.get(p) if isinstance(value, dict) else None
            if isinstance(value, dict) and not known(value):
                errors.append(f"{'.'.join(path)}: {rule.get('message', rule['rule'])}")
        return errors

    return check


def core(obj):
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(map(str, e.path)) or "(top)"
            errors.append(f"Kubernetes {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(e.message)
    return errors


def labels(where, mapping, values=True):
    """Errors of label (or, without `values`, annotation) keys and values."""
    errors = []
    for key, value in (mapping or {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not DNS_SUBDOMAIN.match(prefix)) or len(name) > 63 or not QUALIFIED.match(name):
            errors.append(f"{where}: bad key {key!r}")
        if values and (not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value)):
            errors.append(f"{where}: bad label value {value!r}")
    return errors


def names(obj):
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "default")
    errors = []
    # A Service's name is a DNS label that starts with a letter; the others', a subdomain.
    pattern, most = (DNS_1035, 63) if obj.get("kind") == "Service" else (DNS_SUBDOMAIN, 253)
    if len(name) > most or not pattern.match(name):
        errors.append(f"metadata.name: {name!r} is not a valid {obj.get('kind')} name")
    if len(namespace) > 63 or not DNS_LABEL.match(namespace):
        errors.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label")
    errors += labels("metadata.labels", meta.get("labels"))
    errors += labels("metadata.annotations", meta.get("annotations"), values=False)
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Deployment":
        template = (spec.get("template") or {}).get("metadata") or {}
        errors += labels("spec.template.metadata.labels", template.get("labels"))
        errors += labels("spec.template.metadata.annotations", template.get("annotations"), values=False)
        errors += labels("spec.selector.matchLabels", (spec.get("selector") or {}).get("matchLabels"))
    if obj.get("kind") == "Service":
        errors += labels("spec.selector", spec.get("selector"))
    return errors


def references(objects):
    """(object, error) for objects that point at a Deployment that is not there."""
    pods = {
        (o["metadata"].get("namespace", "default"), o["metadata"]["name"]): (
            o.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}
        )
        for _, o in objects
        if o.get("kind") == "Deployment" and "name" in o.get("metadata", {})
    }
    errors = []
    for where, o in objects:
        ns = o.get("metadata", {}).get("namespace", "default")
        spec = o.get("spec") or {}
        if o.get("kind") == "ScaledObject":
            target = spec.get("scaleTargetRef") or {}
            if target.get("kind", "Deployment") == "Deployment" and (ns, target.get("name")) not in pods:
                errors.append((where, f"scaleTargetRef names no Deployment here: {target.get('name')!r}"))
        if o.get("kind") == "Service":
            selector = spec.get("selector") or {}
            if not any(
                n == ns and all(pod_labels.get(k) == v for k, v in selector.items())
                for (n, _), pod_labels in pods.items()
            ):
                errors.append((where, f"spec.selector matches no Deployment's pods: {selector}"))
    return errors


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    folder = pathlib.Path(argv[1])
    files = sorted(p for p in folder.iterdir() if p.suffix in {".yaml", ".yml", ".json"})
    objects, errors = [], []
    for path in files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            errors.append((path.name, f"not YAML: {e}"))
            continue
        for doc in docs:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            name = (doc.get("metadata") or {}).get("name") if kind else None
            objects.append((f"{path.name} {kind}/{name}", doc))
    if not objects and not errors:
        errors.append((str(folder), "no manifests"))
    scaled_object = keda_checker()
    for where, obj in objects:
        if not isinstance(obj, dict) or "kind" not in obj:
            found = ["not a Kubernetes object"]
        elif obj.get("apiVersion") == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject":
            found = scaled_object(obj) + names(obj)
        else:
            found = core(obj) + names(obj)
        errors += [(where, e) for e in found]
    errors += references(objects)
    for where, e in errors:
        print(f"FAIL {where}: {e}")
    failed = {where for where, _ in errors}
    print(f"{sum(where not in failed for where, _ in objects)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
