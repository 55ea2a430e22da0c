"""Strict JSON schemas for kubeconform, made offline from Kubernetes' own API definitions.

kubeconform normally downloads its schemas; here they are generated from the OpenAPI v2
document in the ``k8s.io/kubernetes`` Go module (``api/openapi-spec/swagger.json``) and from
CustomResourceDefinition files (the Prometheus Operator's ServiceMonitor), both fetched with
``go mod download`` by ``scripts/helm_tools.sh``. Each kind becomes one self-contained file
named the way kubeconform looks for it (``{kind}{-group}-{version}.json``: ``statefulset-
apps-v1.json``, ``service-v1.json``, ``servicemonitor-monitoring-v1.json``), holding the
kind's schema and, under ``definitions``, every definition it reaches, so the swagger
``$ref``\\ s (``#/definitions/…``) resolve inside the file.

Strict: every object that lists its properties gets ``additionalProperties: false`` (as the
``-strict`` schemas kubeconform downloads), so a misspelt or misplaced field fails. Like
those schemas, an optional field may be ``null``, an ``IntOrString`` is a string or an
integer, and a ``Quantity`` a string or a number.

    python openapi2jsonschema.py OUT_DIR --swagger swagger.json [--crd crd.yaml ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["kind_file", "kinds_from_swagger", "kinds_from_crd", "main"]

Schema = dict[str, Any]

#: Definitions whose swagger form is narrower than what the API server accepts.
_LOOSER: dict[str, Schema] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "io.k8s.apimachinery.pkg.api.resource.Quantity":
        {"anyOf": [{"type": "string"}, {"type": "number"}]},
}
_REF = re.compile(r"^#/definitions/(.+)$")
_DRAFT4 = "http://json-schema.org/draft-04/schema#"


def kind_file(group: str, version: str, kind: str) -> str:
    """The file kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` names for a
    kind: the group's first label, then the version (a core kind: the version alone)."""
    api_version = f"{group}/{version}" if group else version
    parts = api_version.split("/")
    suffix = "-" + parts[0].split(".")[0].lower()
    if len(parts) > 1:
        suffix += "-" + parts[1].lower()
    return f"{kind.lower()}{suffix}.json"


def _strict(node: Any) -> Any:
    """A copy of ``node`` with closed objects and nullable optional fields."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        open_ended = out.get("x-kubernetes-preserve-unknown-fields")
        if "additionalProperties" not in out and not open_ended:
            out["additionalProperties"] = False
        required = set(out.get("required", []))
        for name, prop in props.items():
            kind = prop.get("type") if isinstance(prop, dict) else None
            if name not in required and isinstance(kind, str):
                prop["type"] = [kind, "null"]
    if out.get("format") == "int-or-string" or out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("format", None)
        out.setdefault("anyOf", [{"type": "string"}, {"type": "integer"}])
    return out


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            m = _REF.match(ref)
            if m:
                yield m.group(1)
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _closure(definitions: dict[str, Schema], root: str) -> list[str]:
    """Every definition ``root`` reaches through ``$ref`` (``root`` included)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in definitions:
            raise ValueError(f"swagger: {root} refers to {name}, which is not defined")
        seen.add(name)
        todo.extend(_refs(definitions[name]))
    return sorted(seen)


def kinds_from_swagger(swagger: Schema) -> dict[str, Schema]:
    """``{file name: schema}`` for every kind (group, version, kind) the document defines."""
    raw: dict[str, Schema] = swagger.get("definitions", {})
    if not raw:
        raise ValueError("swagger: no 'definitions': not an OpenAPI v2 document")
    definitions = {name: _LOOSER.get(name) or _strict(d) for name, d in raw.items()}
    out: dict[str, Schema] = {}
    for name, d in raw.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            schema = copy.deepcopy(definitions[name])
            schema["$schema"] = _DRAFT4
            schema["definitions"] = {n: definitions[n] for n in _closure(raw, name)}
            out[kind_file(gvk.get("group", ""), gvk["version"], gvk["kind"])] = schema
    return out


def kinds_from_crd(crd: Schema) -> dict[str, Schema]:
    """``{file name: schema}`` for every served version of a CustomResourceDefinition."""
    if crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"expected a CustomResourceDefinition, got kind {crd.get('kind')!r}")
    spec = crd["spec"]
    out: dict[str, Schema] = {}
    for version in spec["versions"]:
        schema = version.get("schema", {}).get("openAPIV3Schema")
        if not version.get("served", True) or schema is None:
            continue
        strict = _strict(schema)
        strict["$schema"] = _DRAFT4
        out[kind_file(spec["group"], version["name"], spec["names"]["kind"])] = strict
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder to write the schemas into")
    p.add_argument("--swagger", type=Path, required=True, help="Kubernetes' swagger.json")
    p.add_argument("--crd", type=Path, action="append", default=[],
                   help="a CustomResourceDefinition YAML file (repeatable)")
    ns = p.parse_args(argv)
    schemas = kinds_from_swagger(json.loads(ns.swagger.read_text()))
    if ns.crd:
        import yaml

        for path in ns.crd:
            schemas.update(kinds_from_crd(yaml.safe_load(path.read_text())))
    ns.out.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas.items():
        (ns.out / name).write_text(json.dumps(schema, separators=(",", ":")))
    print(f"{len(schemas)} schemas in {ns.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
