#!/usr/bin/env python3
"""Validate rendered Kubernetes manifests offline (scripts/chart.sh lint).

Built-in kinds are checked strictly (unknown fields are errors) against the
Kubernetes JSON schemas that kubernetes-validate carries, for the version
given. Objects of a CustomResourceDefinition (Rivora's, the Gateway API's)
are checked against that CRD's openAPIV3Schema for the object's version,
taken from --crds directories or from a CRD in the stream itself; where the
CRD's schema does not say an object keeps unknown fields, they are errors
too, as the API server's strict field validation would make them. A kind
with neither schema fails, except those named in NO_SCHEMA, which are
reported as not validated.

usage: validate-manifests.py --kubernetes-version 1.36 [--kubernetes-version V]...
                             [--crds DIR]... FILE...
"""

import argparse
import copy
import glob
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

# Kinds whose CRD is not vendored: their objects are reported, not checked.
NO_SCHEMA = {
    ("monitoring.coreos.com", "ServiceMonitor"): "the prometheus-operator CRD is not vendored",
}


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def strict_schema(schema):
    """The CRD schema as JSON Schema, with unknown fields refused where the
    schema lists properties and neither keeps unknown fields nor says what
    other keys may hold."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            # OpenAPI's nullable: JSON Schema says it with a type list.
            if node.get("nullable") and isinstance(node.get("type"), str):
                node["type"] = [node["type"], "null"]
            # int-or-string has no type of its own in the CRD's schema.
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    # metadata is the API server's, not the CRD's to describe.
    props = s.get("properties", {})
    props["metadata"] = {"type": "object"}
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    return s


class Crds:
    def __init__(self):
        # (group, kind, version) -> schema
        self.schemas = {}

    def add(self, crd):
        spec = crd["spec"]
        for v in spec["versions"]:
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if schema is not None and v.get("served", False):
                self.schemas[(spec["group"], spec["names"]["kind"], v["name"])] = strict_schema(schema)

    def add_dir(self, d):
        for p in sorted(glob.glob(os.path.join(d, "*.yaml"))):
            for doc in load_docs(p):
                if doc.get("kind") == "CustomResourceDefinition":
                    self.add(doc)

    def schema(self, api_version, kind):
        group, _, version = api_version.rpartition("/")
        return self.schemas.get((group, kind, version))


def name_of(doc):
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return "%s %s%s" % (doc.get("kind"), ns + "/" if ns else "", meta.get("name"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubernetes-version", action="append", required=True)
    ap.add_argument("--crds", action="append", default=[])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    crds = Crds()
    for d in args.crds:
        crds.add_dir(d)
    errors = 0
    checked = 0
    for path in args.files:
        docs = load_docs(path)
        for doc in docs:
            if doc.get("kind") == "CustomResourceDefinition":
                crds.add(doc)
        for doc in docs:
            where = "%s: %s" % (os.path.basename(path), name_of(doc))
            if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
                print("ERROR %s: no metadata.name" % where)
                errors += 1
                continue
            api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
            group = api_version.rpartition("/")[0]
            schema = crds.schema(api_version, kind)
            try:
                if schema is not None:
                    jsonschema.Draft202012Validator(schema).validate(doc)
                elif (group, kind) in NO_SCHEMA:
                    print("NOTE %s: not validated: %s" % (where, NO_SCHEMA[(group, kind)]))
                    continue
                else:
                    for v in args.kubernetes_version:
                        kubernetes_validate.validate(doc, v, strict=True)
                checked += 1
            except jsonschema.ValidationError as e:
                path_ = ".".join(str(p) for p in e.absolute_path)
                print("ERROR %s: %s: %s" % (where, path_ or "(top)", e.message))
                errors += 1
            except kubernetes_validate.SchemaNotFoundError as e:
                print("ERROR %s: %s" % (where, e.message))
                errors += 1
    print(
        "validate-manifests: %d objects valid against Kubernetes %s, %d errors"
        % (checked, " and ".join(args.kubernetes_version), errors)
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
