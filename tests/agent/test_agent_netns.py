"""Why the chart runs the agent with hostNetwork: the kernel sends a net device's uevents only to listeners
in that device's network namespace. Two real agents, one inside a new namespace and one outside; a link
is created and deleted inside. Only the agent in that namespace hears it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import NODE, api_with_node, nodefabric_bin, two_nic_host, uevents_writable


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def forwarder(listen: str, target: str) -> AsyncIterator[int]:
    """A TCP forwarder on `listen` to the embedded API, so an agent in another namespace reaches it."""
    host, port = urllib.parse.urlsplit(target).hostname, urllib.parse.urlsplit(target).port

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, listen, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def _wire(ns: str) -> tuple[str, str]:
    """A veth pair between this namespace and `ns`: (our address, theirs)."""
    octet = os.getpid() % 250 + 1
    here, there = f"169.254.{octet}.1", f"169.254.{octet}.2"
    host_end, ns_end = f"nfh{os.getpid() % 10000}", f"nfn{os.getpid() % 10000}"
    for args in (
        ["link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", ns],
        ["addr", "add", f"{here}/30", "dev", host_end],
        ["link", "set", host_end, "up"],
        ["-n", ns, "addr", "add", f"{there}/30", "dev", ns_end],
        ["-n", ns, "link", "set", ns_end, "up"],
        ["-n", ns, "link", "set", "lo", "up"],
    ):
        done = _ip(*args)
        if done.returncode != 0:
            pytest.skip(f"cannot wire the namespace: ip {' '.join(args)}: {done.stderr.strip()}")
    return here, there


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"nfa-{os.getpid()}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"ip netns is not available here: {made.stderr.strip()}")
    try:
        yield name
    finally:
        _ip("netns", "del", name)


def _add_link(ns: str, name: str) -> None:
    # A dummy link where the module exists; a bridge is as good a net device wherever it does not.
    for kind in ("dummy", "bridge"):
        if _ip("-n", ns, "link", "add", name, "type", kind).returncode == 0:
            return
    pytest.skip("no link type can be created in a namespace here")


class Agent:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"msg": line.decode(errors="replace")})

    def heard(self, fragment: str) -> list[dict]:
        return [
            line
            for line in self.lines
            if line.get("msg") == "kernel uevent" and fragment in line.get("path", "")
        ]

    async def wait(self, predicate, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.returncode is None, f"the agent exited: {self.lines[-5:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.lines[-5:]}"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self.reader


async def _start(prefix: list[str], root: str, kubeconfig: str) -> Agent:
    proc = await asyncio.create_subprocess_exec(
        *prefix, nodefabric_bin(), "--log-format", "json", "--log-level", "DEBUG", "agent",
        "--node-name", NODE, "--root", root, "--kubeconfig", kubeconfig, "--interval", "3600",
        "--debounce", "0.1", "--no-device-plugin", "--metrics-port", "0", "--health-port", "0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    return Agent(proc)


async def test_only_the_agent_in_the_links_network_namespace_hears_its_uevents(tmp_path, netns):
    two_nic_host(tmp_path)
    here, _ = _wire(netns)
    async with api_with_node() as k, forwarder(here, k.url) as port:
        # The agent inside reaches the same API through the veth pair, as a pod network would carry it.
        (tmp_path / "kubeconfig").write_text(
            Path(k.kubeconfig).read_text().replace(k.url, f"http://{here}:{port}")
        )
        inside = await _start(["ip", "netns", "exec", netns], str(tmp_path), str(tmp_path / "kubeconfig"))
        outside = await _start([], str(tmp_path), k.kubeconfig)
        try:
            for agent in (inside, outside):
                await agent.wait(
                    lambda a=agent: any(
                        line.get("msg")
                        in (
                            "watching kernel uevents",
                            "kernel uevents unavailable; relying on the periodic pass",
                        )
                        for line in a.lines
                    ),
                    "the uevent socket",
                )
                if any(line.get("msg", "").startswith("kernel uevents unavailable") for line in agent.lines):
                    pytest.skip("netlink uevents are not permitted here")

            await inside.wait(
                lambda: (
                    any(line.get("msg") == "published the devices record" for line in inside.lines)
                    or any(line.get("msg") == "published the devices record" for line in outside.lines)
                ),
                "the first pass",
            )
            link = f"nfl{os.getpid() % 10000}"
            _add_link(netns, link)
            await inside.wait(lambda: inside.heard(f"/net/{link}"), "the link's add uevent inside")
            assert any(line.get("action") == "add" for line in inside.heard(f"/net/{link}"))
            await inside.wait(
                lambda: any(line.get("msg") == "kernel uevents; walking the host" for line in inside.lines),
                "the walk the uevent brings",
            )
            _ip("-n", netns, "link", "del", link)
            await inside.wait(
                lambda: any(line.get("action") == "remove" for line in inside.heard(f"/net/{link}")),
                "the link's remove uevent inside",
            )

            if uevents_writable():
                # Outside is listening (it hears its own namespace's lo), and it heard nothing of the link:
                # uevents arrive in order, so the link's would have come before this one.
                with open("/sys/class/net/lo/uevent", "w") as f:
                    f.write("change")
                await outside.wait(lambda: outside.heard("/net/lo"), "lo's uevent outside")
            else:
                await asyncio.sleep(1.0)  # no way to prove it listens; give the link's event time to arrive
            assert outside.heard(f"/net/{link}") == [], (
                "a listener outside the namespace never gets its events"
            )
        finally:
            await inside.stop()
            await outside.stop()
