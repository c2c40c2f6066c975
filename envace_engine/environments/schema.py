"""Tool schemas: BFCL's dialect to OpenAI function schemas, and argument validation.

Validation is deliberately a small subset of JSON Schema — the part tool schemas use: an
``object`` with ``properties``, ``required``, and per-value ``type``, ``enum`` and ``items``.
It runs before any tool code, so a call with missing, unknown or wrong-typed arguments never
reaches a backend (and cannot change its state). Numbers are also range-checked (``minimum``,
``maximum``, and |x| <= 1e18 always) so that model output cannot make tool code compute forever.
"""

from __future__ import annotations

from typing import Any

# BFCL writes Python-ish type names; OpenAI tools speak JSON Schema.
_DIALECT = {"dict": "object", "float": "number", "tuple": "array", "list": "array"}
_KEEP = ("description", "enum", "default", "required", "minimum", "maximum")
# Any number a model sends is bounded: backends do arithmetic on them (MathAPI.power), and Python
# ints are unbounded. 1e18 keeps every number of the BFCL data (card numbers are ~2e15).
MAX_MAGNITUDE = 1e18


def bfcl_to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one BFCL parameter schema (recursively) to JSON Schema.

    ``dict`` → ``object``, ``float`` → ``number``, ``tuple`` → ``array``; ``any`` drops the type
    constraint. Unknown keys (BFCL's ``optional``, ``response``) are dropped.
    """
    out: dict[str, Any] = {}
    kind = node.get("type")
    if isinstance(kind, str) and kind != "any":
        out["type"] = _DIALECT.get(kind, kind)
    for key in _KEEP:
        if key in node:
            out[key] = node[key]
    if "properties" in node:
        out["properties"] = {k: bfcl_to_json_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = bfcl_to_json_schema(node["items"])
    return out


def openai_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``{"type": "function", "function": {...}}`` tool schema."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def bfcl_doc_to_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """One entry of BFCL's ``multi_turn_func_doc/*.json`` as an OpenAI tool schema."""
    params = bfcl_to_json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.setdefault("required", [])
    return openai_tool(doc["name"], doc.get("description", ""), params)


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool schema."""
    return tool["function"]["name"]


def _type_ok(value: Any, kind: str) -> bool:
    # bool is an int subclass in Python but not a JSON integer/number.
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True


def _range_problem(value: float, schema: dict[str, Any], where: str) -> str | None:
    low = schema.get("minimum", -MAX_MAGNITUDE)
    high = schema.get("maximum", MAX_MAGNITUDE)
    if not low <= value <= high:
        return f"{where} must be between {low:g} and {high:g}, got {value:g}"
    return None


def check_value(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """Why ``value`` does not fit ``schema`` (a message naming ``where``), or None if it fits."""
    kind = schema.get("type")
    if isinstance(kind, str) and not _type_ok(value, kind):
        return f"{where} must be of type {kind}, got {type(value).__name__} {value!r:.60}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        problem = _range_problem(value, schema, where)
        if problem:
            return problem
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}, got {value!r:.60}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = check_value(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict) and "properties" in schema and schema.get("type") == "object":
        return check_object(value, schema, where, allow_extra=True)
    return None


def check_object(
    args: Any, schema: dict[str, Any], where: str = "arguments", allow_extra: bool = False
) -> str | None:
    """Validate a call's arguments object: required present, no unknown keys, types and enums."""
    if not isinstance(args, dict):
        return f"{where} must be a JSON object, got {type(args).__name__}"
    props: dict[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"{where}: missing required parameter(s) {', '.join(missing)}"
    unknown = [k for k in args if k not in props]
    if unknown and not allow_extra:
        allowed = ", ".join(props) or "none"
        return f"{where}: unknown parameter(s) {', '.join(unknown)} (allowed: {allowed})"
    for key, value in args.items():
        if key in props:
            problem = check_value(value, props[key], f"{where}.{key}")
            if problem:
                return problem
    return None
