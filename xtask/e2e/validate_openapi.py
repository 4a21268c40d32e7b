"""Validates hangard's generated `GET /openapi.json` with openapi-spec-validator and checks
that every route group is documented. Exits non-zero when the document is invalid.

Usage: HANGAR_URL=http://127.0.0.1:PORT python validate_openapi.py
"""

import json
import os
import urllib.request

from openapi_spec_validator import validate

BASE = os.environ["HANGAR_URL"].rstrip("/")
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
EXPECTED = [
    ("get", "/v1/admin/models"),
    ("post", "/v1/admin/models/{name}/load"),
    ("post", "/v1/admin/models/{name}/unload"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/responses"),
    ("post", "/v1/embeddings"),
    ("post", "/api/v1/unload"),
    ("post", "/v2/repository/index"),
    ("get", "/healthz"),
]


def main():
    with urllib.request.urlopen(f"{BASE}/openapi.json", timeout=30) as response:
        assert response.status == 200, response.status
        document = json.load(response)
    validate(document)  # raises with the failing JSON path
    print(f"  ok  openapi {document['openapi']} document is valid")
    assert document["openapi"].startswith("3."), document["openapi"]
    paths = document["paths"]
    missing = [f"{m.upper()} {p}" for m, p in EXPECTED if m not in paths.get(p, {})]
    assert not missing, f"undocumented routes: {missing}"
    undescribed = [
        f"{m.upper()} {p}"
        for p, item in paths.items()
        for m, op in item.items()
        if m in METHODS and not (op.get("summary") and op.get("responses"))
    ]
    assert not undescribed, f"operations without summary or responses: {undescribed}"
    operations = sum(1 for item in paths.values() for m in item if m in METHODS)
    print(f"  ok  {operations} operations on {len(paths)} paths, all described")


if __name__ == "__main__":
    main()
