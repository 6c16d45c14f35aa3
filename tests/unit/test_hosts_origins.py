"""The Host and Origin policies of the server's front door, without a server."""

from __future__ import annotations

import socket

import pytest

from strata.errors import ConfigError
from strata.server.hosts import HostPolicy, normalise_allowed_host, split_host
from strata.server.origins import OriginPolicy, normalise_allowed_origin, parse_origin


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("localhost:8080", "localhost"),
        ("LocalHost", "localhost"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("example.com.", "example.com"),
        ("::1", None),  # IPv6 needs brackets
        ("[::1", None),
        ("[nothost]:80", None),
        ("localhost:http", None),
        ("", None),
    ],
)
def test_split_host(header, host):
    assert split_host(header) == host


def test_loopback_bind_accepts_only_loopback_names_and_allowed_ones():
    policy = HostPolicy.for_bind("127.0.0.1", ("strata.test", "*.corp.example"))
    for ok in ("localhost:1", "127.0.0.1", "[::1]:9", "strata.test", "a.corp.example:80"):
        assert policy.allows(ok), ok
    for bad in ("evil.example", "10.0.0.1", "corp.example", "localhost.evil.example", "x:y"):
        assert not policy.allows(bad), bad
    assert HostPolicy.for_bind("::1").allows("localhost")


def test_wildcard_bind_accepts_ip_literals_and_this_machine_but_no_other_name():
    policy = HostPolicy.for_bind("0.0.0.0")
    for ok in ("10.1.2.3:8080", "[fe80::1]", "localhost", socket.gethostname()):
        assert policy.allows(ok), ok
    assert not policy.allows("rebind.evil.example")
    assert HostPolicy.for_bind("0.0.0.0", ("*",)).allows("anything.example")


def test_allow_host_values_are_checked():
    assert normalise_allowed_host("Strata.Test.") == "strata.test"
    assert normalise_allowed_host("[::1]") == "::1"
    for bad in ("", "a b", "host:80", "http://x"):
        with pytest.raises(ConfigError, match="--allow-host"):
            normalise_allowed_host(bad)


def test_origins_parse_to_one_spelling():
    assert parse_origin("HTTPS://App.Example:443") == "https://app.example"
    assert parse_origin("http://[::1]:8080") == "http://[::1]:8080"
    for bad in ("null", "file://", "ftp://x", "http://a/b", "http://u@a", "http://a:"):
        assert parse_origin(bad) is None, bad
    assert normalise_allowed_origin(" * ") == "*"
    with pytest.raises(ConfigError, match="--allow-origin"):
        normalise_allowed_origin("app.example")


def test_origin_policy_same_origin_and_allowed():
    policy = OriginPolicy(frozenset({"https://app.example"}))
    assert policy.allows("https://app.example", "127.0.0.1:8080")
    assert policy.allows("http://127.0.0.1:8080", "127.0.0.1:8080")  # same origin
    assert policy.allows("http://localhost", "localhost:80")
    assert not policy.allows("http://127.0.0.1:8081", "127.0.0.1:8080")  # another port
    assert not policy.allows("http://evil.example", "127.0.0.1:8080")
    assert not policy.allows("null", "127.0.0.1:8080")
    assert not policy.allows("http://127.0.0.1:8080", None)
    assert OriginPolicy(frozenset({"*"})).allows("null", None)
