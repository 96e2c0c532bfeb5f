"""A JSON Schema validator of the subset gpudoc's schemas use (schemars' draft 2020-12 output: types,
`const`, `enum`, objects' `properties` and `required`, arrays' `items`, `$ref` into `$defs`, `oneOf`,
`anyOf`, `allOf`, `minimum`, `maximum`), for the Python tests, whose environment has no `jsonschema`. A
keyword outside the subset fails the check rather than being passed over: a schema this cannot read is
never taken as satisfied. Its own tests: test_schema_check.py."""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Keywords that say nothing of validity.
ANNOTATIONS = frozenset(("$schema", "$defs", "title", "description", "format", "default", "examples"))
TYPES = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}
KNOWN = ANNOTATIONS | frozenset(("type", "const", "enum", "properties", "required", "items", "$ref",
                                 "oneOf", "anyOf", "allOf", "minimum", "maximum",
                                 "additionalProperties"))


def published(name):
    """docs/schema/NAME.schema.json."""
    with open(os.path.join(ROOT, "docs", "schema", name + ".schema.json")) as f:
        return json.load(f)


def errors(schema, value, root=None, at="$"):
    """Where `value` breaks `schema` (empty: it conforms). `root` holds the `$defs` that `$ref` names."""
    root = schema if root is None else root
    if schema is True:
        return []
    if schema is False:
        return ["%s: no value is allowed" % at]
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError("%s: keywords outside the subset: %s" % (at, sorted(unknown)))
    out = []
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError("%s: a $ref outside $defs: %s" % (at, ref))
        out += errors(root["$defs"][ref[len("#/$defs/"):]], value, root, at)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if type(kinds) is str else kinds
        if not any(TYPES[k](value) for k in kinds):
            return out + ["%s: %r is not of type %s" % (at, value, "/".join(kinds))]
    if "const" in schema and not _equal(value, schema["const"]):
        out.append("%s: %r is not %r" % (at, value, schema["const"]))
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        out.append("%s: %r is none of %r" % (at, value, schema["enum"]))
    if TYPES["number"](value) and type(value) is not bool:
        if "minimum" in schema and value < schema["minimum"]:
            out.append("%s: %r is below %r" % (at, value, schema["minimum"]))
        if "maximum" in schema and value > schema["maximum"]:
            out.append("%s: %r is above %r" % (at, value, schema["maximum"]))
    if type(value) is dict:
        out += _object(schema, value, root, at)
    if type(value) is list and "items" in schema:
        for i, item in enumerate(value):
            out += errors(schema["items"], item, root, "%s[%d]" % (at, i))
    out += _combined(schema, value, root, at)
    return out


def _object(schema, value, root, at):
    out = ["%s: %r is missing" % (at, k) for k in schema.get("required", ()) if k not in value]
    props = schema.get("properties", {})
    for k, v in value.items():
        if k in props:
            out += errors(props[k], v, root, "%s.%s" % (at, k))
        elif "additionalProperties" in schema:
            out += errors(schema["additionalProperties"], v, root, "%s.%s" % (at, k))
    return out


def _combined(schema, value, root, at):
    out = []
    for sub in schema.get("allOf", ()):
        out += errors(sub, value, root, at)
    if "anyOf" in schema:
        found = [errors(s, value, root, at) for s in schema["anyOf"]]
        if all(found):
            out.append("%s: %r matches none of anyOf (%s)" % (at, value, _said(found)))
    if "oneOf" in schema:
        found = [errors(s, value, root, at) for s in schema["oneOf"]]
        matched = sum(1 for f in found if not f)
        if matched != 1:
            out.append("%s: %r matches %d of oneOf, not one (%s)" % (at, value, matched, _said(found)))
    return out


def _said(found):
    """What each alternative found wrong."""
    return "; ".join(", ".join(f) for f in found if f)


def _equal(a, b):
    """JSON's equality: 1 and 1.0 are one number, True is no number."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return a == b
