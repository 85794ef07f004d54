#!/usr/bin/python3
"""Validates generated JSON against a JSON schema with python3-jsonschema.

    validate_json.py SCHEMA.json < OUTPUTS   (one JSON text a line)

Prints each line that does not parse or does not validate, and exits 1 when there is one
(2 when jsonschema is not installed: apt-get install python3-jsonschema)."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("validate_json.py: python3-jsonschema is not installed", file=sys.stderr)
    sys.exit(2)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    validator = cls(schema)
    bad = 0
    lines = sys.stdin.buffer.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines):
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            print(f"output {i}: not JSON ({e}): {raw!r}", file=sys.stderr)
            bad += 1
            continue
        errors = list(validator.iter_errors(doc))
        for e in errors:
            print(f"output {i}: {e.message} at {list(e.path)}: {raw!r}", file=sys.stderr)
        bad += bool(errors)
    print(f"validate_json.py: {len(lines) - bad} of {len(lines)} outputs valid")
    sys.exit(1 if bad else 0)


main()
