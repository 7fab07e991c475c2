"""A Lease create refused by RBAC, run through the real CLI against the embedded API: the one line the
operator ends with quotes the API server's message (what the role lacks), cut and cleaned."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

import kmock
import pytest
from operator_harness import NS, fleet
from test_operator_hostile_waits import RBAC_DENIED

from nodefabric_devicemanager import crd
from nodefabric_operator import cli, leader
from nodefabric_operator.demo.kubeapi import running_api

LEASE = f"cannot take the lease {NS}/nodefabric-operator"
FORBIDDEN = 'User "system:serviceaccount:nodefabric:op" cannot create resource "leases"'


def refused_with(message: str) -> kmock.Response:
    body = {**json.loads(RBAC_DENIED), "message": message}
    return kmock.Response(
        status=403, payload=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )


async def ended_with(caplog: pytest.LogCaptureFixture, message: str) -> str:
    """The operator run with --leader-elect, its Lease create refused with `message`: its exit line."""
    caplog.set_level(logging.INFO, logger="nodefabric_operator")
    async with running_api([crd.devices_crd()]) as k:
        await fleet(k, 1)
        k.api[lambda req: req.method == "POST" and str(req.url.path).endswith("/leases")] << refused_with(
            message
        )
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(["--kubeconfig", k.kubeconfig, "--namespace", NS, "--leader-elect"])
        assert await asyncio.to_thread(cli.run, args) == 2
    (line,) = [r for r in caplog.records if r.getMessage() == "operator cannot start"]
    error: str = line.error
    return error


async def test_an_rbac_refusal_of_the_lease_says_what_the_role_lacks(caplog):
    message = json.loads(RBAC_DENIED)["message"]
    error = await ended_with(caplog, message)
    assert error == f"{LEASE}: HTTP 403 Forbidden: {message}", error
    assert FORBIDDEN in error


async def test_the_servers_message_is_cut_and_its_control_characters_dropped(caplog):
    message = "leases is forbidden:\n\x1b[31mred\x1b[0m\tand " + "x" * 5000
    error = await ended_with(caplog, message)
    said = error.removeprefix(f"{LEASE}: HTTP 403 Forbidden: ")
    assert said.startswith("leases is forbidden: [31mred [0m and xxx"), said
    assert said.endswith("...") and len(said) == leader.SAID_CHARS
    assert all(c.isprintable() for c in error)
