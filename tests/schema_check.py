"""Checks specs against tmpfsctl's JSON Schema (draft 2020-12), for tests/it/schema.rs.

stdin: {"schema": {...}, "good": {name: yaml}, "bad": {name: yaml}}.
Every good spec must validate and every bad one must not; the schema itself
must be a valid draft 2020-12 schema. Prints what went wrong; exit 1 then.
"""
import json
import sys

import jsonschema
import yaml

job = json.load(sys.stdin)
schema = job["schema"]
jsonschema.Draft202012Validator.check_schema(schema)
assert schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema", schema.get("$schema")
v = jsonschema.Draft202012Validator(schema)
failed = False
for name, text in job["good"].items():
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(yaml.safe_load(text))]
    if errors:
        failed = True
        print(f"good spec {name} fails the schema: {errors}")
for name, text in job["bad"].items():
    if v.is_valid(yaml.safe_load(text)):
        failed = True
        print(f"bad spec {name} passes the schema")
print(f"{len(job['good'])} good, {len(job['bad'])} bad specs checked")
sys.exit(1 if failed else 0)
