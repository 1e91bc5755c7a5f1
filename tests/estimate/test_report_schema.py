"""The saved-report format (application/vnd.xmem.report+json): the JSON schema of version 1,
the example reports the JupyterLab renderer is tested against too (labextension/test/), and a
freshly computed ``Estimate.to_report()``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

from xmem_engine.estimate import REPORT_MIME, REPORT_VERSION, estimate  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "xmem_engine" / "data"
SCHEMA_FILE = DATA / "report.schema.json"
EXAMPLES = sorted((DATA / "report-examples").glob("*.json"))

MARKUP = "<img src=x onerror=alert(1)>"

TINY_MLP = """
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(32, 64, device="cuda")
y = torch.randint(0, 10, (32,), device="cuda")
for _ in range(2):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def fresh_report() -> dict:
    return estimate(TINY_MLP, gpu="RTX-4060-8GB", namespace={}).to_report()


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_schema_is_a_valid_draft_2020_12_schema(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["version"]["const"] == REPORT_VERSION
    assert REPORT_MIME == "application/vnd.xmem.report+json"


def test_the_examples_are_there():
    names = {p.name for p in EXAMPLES}
    assert {"mlp-rtx4060.json", "mlp-large-rtx4060-does-not-fit.json", "markup-in-names.json",
            "unknown-version-99.json"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_or_is_recognised_as_unsupported(path, validator):
    report = load(path)
    assert isinstance(report.get("version"), int)
    if report["version"] == REPORT_VERSION:
        validator.validate(report)
    else:
        errors = list(validator.iter_errors(report))
        assert any(list(e.path) == ["version"] for e in errors), \
            f"{path.name}: version {report['version']} should be rejected by the version 1 schema"


def test_the_examples_show_what_their_names_say():
    fits = load(DATA / "report-examples" / "mlp-rtx4060.json")
    assert fits["fits"] and fits["headroom_bytes"] > 0
    nofit = load(DATA / "report-examples" / "mlp-large-rtx4060-does-not-fit.json")
    assert not nofit["fits"] and nofit["headroom_bytes"] < 0
    assert nofit["peak_device_bytes"] == (nofit["context_bytes"] + nofit["outside_allocator_bytes"]
                                          + nofit["peak_reserved_bytes"])
    markup = load(DATA / "report-examples" / "markup-in-names.json")
    assert MARKUP in markup["breakdown_by_module"]
    assert any(MARKUP == t["module"] for t in markup["top_tensors"])
    assert all("<" in t["source"] for t in markup["top_tensors"])
    assert load(DATA / "report-examples" / "unknown-version-99.json")["version"] == 99


def test_a_fresh_report_validates(fresh_report, validator):
    validator.validate(fresh_report)
    # plain JSON, no NaN / infinity
    assert json.loads(json.dumps(fresh_report, allow_nan=False)) == fresh_report
    assert fresh_report["version"] == REPORT_VERSION
    assert fresh_report["gpu_name"] == "NVIDIA GeForce RTX 4060"
    assert fresh_report["fits"] is True
    tl = fresh_report["timeline"]
    assert len(tl["event"]) == len(tl["allocated"]) == len(tl["reserved"]) > 0
    assert tl["peak_event"] in tl["event"]
    assert max(tl["allocated"]) == fresh_report["peak_allocated_bytes"]


def test_the_schema_documents_every_field_to_report_writes(fresh_report, schema):
    """additionalProperties is allowed (forward compatibility), so check the documentation
    side separately: every field written has a described property in the schema."""
    def described(props: dict, keys, where: str):
        missing = [k for k in keys if k not in props]
        assert not missing, f"{where}: fields not in the schema: {missing}"
        for k in keys:
            p = props[k]
            if "$ref" in p and "description" not in p:
                p = schema["$defs"][p["$ref"].rsplit("/", 1)[1]]
            assert p.get("description"), f"{where}.{k} has no description"

    described(schema["properties"], fresh_report.keys(), "report")
    described(schema["$defs"]["timeline"]["properties"], fresh_report["timeline"].keys(), "timeline")
    tensor_props = schema["$defs"]["tensor"]["properties"]
    for t in fresh_report["top_tensors"]:
        missing = [k for k in t if k not in tensor_props]
        assert not missing, f"tensor fields not in the schema: {missing}"


def test_the_schema_requires_the_headline_fields(schema, validator, fresh_report):
    for field in ("version", "gpu_name", "capacity_bytes", "peak_device_bytes", "fits", "headroom_bytes"):
        assert field in schema["required"]
        broken = {k: v for k, v in fresh_report.items() if k != field}
        assert not validator.is_valid(broken), f"a report without {field} validated"
    assert not validator.is_valid({**fresh_report, "capacity_bytes": "8 GiB"})
    assert not validator.is_valid({**fresh_report, "fits": "yes"})
    # forward compatible: unknown fields are allowed within version 1
    assert validator.is_valid({**fresh_report, "a_field_from_the_future": {"x": 1}})
