"""`nodefabric labels -f FILE`: the label set of a record, through the real console-script entry point."""

from __future__ import annotations

import io
import json

import yaml
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_operator.console import main


def record() -> dict:
    return devices("n1", interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))]).wire()


def test_prints_the_label_set_from_json(tmp_path, capsys):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(record()))
    assert main(["labels", "-f", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "feature.gpustack.ai/fabric.domain=nvlink-5b0e112233445566778899aabbccddef-1",
        "feature.gpustack.ai/fabric.members=18",
        "feature.gpustack.ai/rdma.capable=true",
        "feature.gpustack.ai/rdma.distance=PIX",
        "feature.gpustack.ai/rdma.numa=0",
    ]


def test_reads_yaml_from_stdin_with_another_domain(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(record())))
    assert main(["labels", "-f", "-", "--domain", "example.com", "-o", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["feature.example.com/rdma.capable"] == "true" and len(got) == 5


def test_withheld_values_are_reported_on_stderr(tmp_path, capsys):
    bad = devices("n1", interfaces=[nic(numa="0-1")]).wire()
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["labels", "-f", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["feature.gpustack.ai/rdma.capable=true"]
    assert "withheld feature.gpustack.ai/rdma.numa=0-1" in out.err


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    cases = {
        "missing.json": None,
        "list.yaml": "- a\n- b\n",
        "pod.yaml": "kind: Pod\nmetadata: {name: x}\n",
        "broken.json": "{not json",
        "invalid.yaml": "kind: Devices\nmetadata: {}\n",  # no name
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        assert main(["labels", "-f", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"nodefabric labels: cannot read {path}:"), err


def test_bad_domain_is_refused(tmp_path, capsys):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(record()))
    assert main(["labels", "-f", str(path), "--domain", "Not_A_Domain"]) == 2
    assert "label domain 'Not_A_Domain'" in capsys.readouterr().err


def test_a_yaml_alias_bomb_is_refused_not_a_hang(tmp_path, capsys):
    # 1 KB of nested aliases that expands to a billion values: it loaded at once (the loader shares
    # aliased values) and then hung the record's validation for ever.
    lines = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(["metadata: {name: n1}", "spec:", *("  " + line for line in lines)]) + "\n")
    assert main(["labels", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nodefabric labels: cannot read {path}: the document expands to more than")
    # Anchors a person writes stay fine.
    ok = tmp_path / "anchors.yaml"
    ok.write_text("kind: Devices\nmetadata: {name: &n n1}\nspec: {}\nextra: *n\n")
    assert main(["labels", "-f", str(ok)]) == 0


def test_a_bad_domain_is_not_reported_as_an_unreadable_file(tmp_path, capsys):
    path = tmp_path / "devices.json"
    path.write_text("{}")
    assert main(["labels", "-f", str(path), "--domain", "Not_A_Domain"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nodefabric labels: label domain 'Not_A_Domain'"), err
    assert "cannot read" not in err


def test_a_record_the_model_refuses_is_named_by_its_first_bad_field_in_one_clause(tmp_path, capsys):
    """pydantic's report (a paragraph per error and a URL, the whole input repeated) is one clause: the
    first bad field, what it was (shown bounded, however large the record), and how many errors."""
    bad = record()
    bad["spec"]["interfaces"][0]["mtu"] = "x" * 100_000
    del bad["metadata"]
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(bad))
    assert main(["labels", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nodefabric labels: cannot read {path}: metadata: Field required, got {{")
    assert err.endswith("(2 validation errors)\n") and len(err.splitlines()) == 1 and len(err) < 400
    assert "errors.pydantic.dev" not in err
