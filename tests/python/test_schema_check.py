"""The tests' JSON Schema validator (schema_check.py): each keyword of its subset refuses what it must, and a
keyword outside the subset is an error, never a pass."""
import pytest
from schema_check import errors, published

DEFS = {
    "$defs": {
        "Reading": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
                    "required": ["a"]},
    },
    "oneOf": [
        {"type": "object", "properties": {"k": {"type": "string", "const": "s"},
                                          "fwd": {"type": ["integer", "null"], "maximum": 10}},
         "$ref": "#/$defs/Reading", "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "e"}, "why": {"enum": ["oom", "peak"]},
                                          "rows": {"type": "array", "items": {"type": "string"}},
                                          "act": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
         "allOf": [{"required": ["why"]}], "required": ["k"], "additionalProperties": {"type": "number"}},
    ],
}


@pytest.mark.parametrize("value", [
    {"k": "s", "a": 1}, {"k": "s", "a": 0, "fwd": None}, {"k": "s", "a": 2, "fwd": 10},
    {"k": "e", "why": "oom", "rows": ["x"], "act": True, "extra": 1.5},
    {"k": "e", "why": "peak", "act": None},
])
def test_what_conforms_passes(value):
    assert errors(DEFS, value) == []


@pytest.mark.parametrize("value, said", [
    ({"k": "s"}, "'a' is missing"),  # through $ref
    ({"k": "s", "a": -1}, "below 0"),
    ({"k": "s", "a": 1, "fwd": 11}, "above 10"),
    ({"k": "s", "a": "1"}, "not of type integer"),
    ({"k": "s", "a": True}, "not of type integer"),
    ({"k": "x", "a": 1}, "matches 0 of oneOf"),
    ({"k": "e", "why": "later"}, "none of ['oom', 'peak']"),
    ({"k": "e"}, "'why' is missing"),  # through allOf
    ({"k": "e", "why": "oom", "rows": ["x", 2]}, "$.rows[1]: 2 is not of type string"),
    ({"k": "e", "why": "oom", "act": 1}, "matches none of anyOf"),
    ({"k": "e", "why": "oom", "extra": "no"}, "$.extra: 'no' is not of type number"),
    ([], "matches 0 of oneOf"),
])
def test_what_breaks_it_is_said_with_its_place(value, said):
    found = errors(DEFS, value)
    assert any(said in e for e in found), found


def test_a_keyword_outside_the_subset_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="pattern"):
        errors({"type": "string", "pattern": "^a"}, "b")
    with pytest.raises(ValueError, match="outside"):
        errors({"$ref": "other.json#/x"}, 1)


def test_every_published_schema_is_in_the_subset():
    for name in ("report", "trace-row", "baseline", "compare", "orphans", "fit", "shim-message"):
        errors(published(name), {})  # raises on a keyword it cannot read
