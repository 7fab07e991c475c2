"""Names matched whole: a node name, a domain or a claim reference with a trailing newline passes a
`^...$` pattern (`$` also matches before a final newline), and would then be published (a slice for node
"n1\\n", a driver "rdma.gpustack.ai\\n" the API server and kubelet refuse on every write) or written into
a file name. Each is refused as what it is, through the real commands where a user types it."""

from __future__ import annotations

from pathlib import Path

import pytest
from dra_helpers import NODE, hgx

from nodefabric_deviceplugin.dra.claims import ClaimError, ClaimRef, allocated_devices
from nodefabric_deviceplugin.dra.config import DriverConfig

UID = "6f1c2a4e-2b0d-4d43-9a55-0c7f1b2b9e10"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--node-name", f"{NODE}\n"], "node name must be a DNS subdomain"),
        (["--node-name", NODE, "--domain", "gpustack.ai\n"], "domain must be a DNS subdomain"),
        (["--node-name", "a..b"], "node name must be a DNS subdomain"),
    ],
    ids=["node-newline", "domain-newline", "empty-label"],
)
def test_slices_refuse_a_name_that_is_valid_only_up_to_a_trailing_newline(
    console, tmp_path: Path, args: list[str], why: str
) -> None:
    hgx(tmp_path / "h")
    done = console("slices", "--root", str(tmp_path / "h"), *args)
    assert done.returncode == 2, done.stdout[:300]
    assert why in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_draplugin_refuses_a_domain_with_a_trailing_newline(console, tmp_path: Path) -> None:
    done = console("draplugin", "--root", str(tmp_path), "--node-name", NODE, "--domain", "gpustack.ai\n")
    assert done.returncode == 2
    assert "domain must be a DNS subdomain" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "kwargs", [{"node_name": f"{NODE}\n"}, {"domain": "gpustack.ai\n"}, {"domain": "gpustack..ai"}]
)
def test_the_driver_configuration_refuses_names_the_api_server_would(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="must be a DNS subdomain"):
        DriverConfig(**{"node_name": NODE, **kwargs})


@pytest.mark.parametrize(
    "ref",
    [ClaimRef("ml", f"{UID}\n", "pair"), ClaimRef("ml\n", UID, "pair"), ClaimRef("ml", UID, "pair\n")],
    ids=["uid", "namespace", "name"],
)
def test_a_claim_reference_with_a_trailing_newline_is_invalid(ref: ClaimRef) -> None:
    with pytest.raises(ClaimError, match="invalid claim"):
        ref.check()


def test_an_allocated_device_name_with_a_trailing_newline_is_refused() -> None:
    claim = {
        "metadata": {"uid": UID},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "rdma.gpustack.ai",
                            "pool": NODE,
                            "device": "pci-0000-1c-00-0\n",
                            "request": "nic",
                        }
                    ]
                }
            }
        },
    }
    with pytest.raises(ClaimError, match="names no valid device"):
        allocated_devices(claim, ClaimRef("ml", UID, "pair"), driver="rdma.gpustack.ai", pool=NODE)
