import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from awl import BadRequest
from gateway._config import (
    DEFAULT_MAX_RESULT_BYTES,
    ConfigError,
    HttpTransport,
    StdioTransport,
    load_config,
)


def _refused(document: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(document)
    return info.value


@pytest.mark.spec("BIND-5")
def test_full_config_loads_into_frozen_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stdio and HTTP entries load with their per-server settings and the gateway settings."""
    monkeypatch.setenv("MAIL_TOKEN", "s3cret")
    config = load_config({
        "mcpServers": {
            "mail": {"command": "mail-mcp", "args": ["--quiet"], "env": {"TOKEN": "$MAIL_TOKEN"},
                     "costs": {"send_email": 0.01, "*": 0.001}, "hold": ["send_email"],
                     "timeout": 5, "max_result_bytes": 2048},
            "gh.v2": {"type": "http", "url": "https://example.test/mcp",
                      "headers": {"Authorization": "Bearer ${MAIL_TOKEN}", "X-Price": "$$5"}},
        },
        "gateway": {"safe_mode": True},
    })
    mail = config.server("mail")
    assert mail.transport == StdioTransport(command="mail-mcp", args=("--quiet",),
                                            env={"TOKEN": "s3cret"})
    assert (mail.timeout, mail.max_result_bytes) == (5.0, 2048)
    assert mail.cost_of("send_email") == 0.01
    assert mail.cost_of("list") == 0.001
    assert mail.holds("send_email") and not mail.holds("list")
    gh = config.servers["gh.v2"]
    assert isinstance(gh.transport, HttpTransport)
    assert dict(gh.transport.headers) == {"Authorization": "Bearer s3cret", "X-Price": "$5"}
    assert gh.cost_of("anything") == 0.0
    assert gh.max_result_bytes == DEFAULT_MAX_RESULT_BYTES
    assert config.gateway.safe_mode is True
    assert list(config.servers) == ["mail", "gh.v2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mail.timeout = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.servers["x"] = mail  # type: ignore[index]


@pytest.mark.spec("BIND-5")
def test_hold_star_holds_every_tool() -> None:
    """A hold list containing "*" holds every tool of that server."""
    config = load_config({"mcpServers": {"a": {"command": "x", "hold": ["*"]}}})
    assert config.server("a").holds("anything")


@pytest.mark.parametrize(
    ("document", "location", "key"),
    [
        ({"mcpServers": {}, "servers": {}}, "", "'servers'"),
        ({"mcpServers": {"a": {"command": "x", "timout": 3}}}, "/mcpServers/a", "'timout'"),
        ({"mcpServers": {"a": {"command": "x", "headers": {}}}}, "/mcpServers/a", "'headers'"),
        ({"mcpServers": {"a": {"url": "http://h/mcp", "env": {}}}}, "/mcpServers/a", "'env'"),
        ({"mcpServers": {}, "gateway": {"safe": True}}, "/gateway", "'safe'"),
    ],
)
@pytest.mark.spec("BIND-5")
def test_unknown_keys_are_refused_by_name_and_place(document: Any, location: str, key: str) -> None:
    """An unknown key is refused with its name, its location and the keys allowed there."""
    error = _refused(document)
    assert error.location == location
    assert key in error.message
    assert "allowed here:" in error.message
    assert isinstance(error, BadRequest)


@pytest.mark.parametrize("name", ["", "a/b", "a b", "mäil", "x" * 41, "a\n"])
def test_bad_server_names_are_refused(name: str) -> None:
    """Server names outside [A-Za-z0-9_.-]{1,40} are refused."""
    error = _refused({"mcpServers": {name: {"command": "x"}}})
    assert error.location == "/mcpServers/" + name.replace("/", "~1")
    assert "server name" in error.message


@pytest.mark.parametrize(
    ("entry", "location"),
    [
        ({}, "/mcpServers/a"),
        ({"args": ["x"]}, "/mcpServers/a"),
        ({"command": "x", "url": "http://h"}, "/mcpServers/a"),
        ({"type": "stdio", "url": "http://h"}, "/mcpServers/a"),
        ({"type": "sse", "url": "http://h"}, "/mcpServers/a/type"),
        ({"command": ""}, "/mcpServers/a/command"),
        ({"command": 3}, "/mcpServers/a/command"),
        ({"command": "x", "args": "--flag"}, "/mcpServers/a/args"),
        ({"command": "x", "args": ["ok", 1]}, "/mcpServers/a/args/1"),
        ({"command": "x", "env": {"K": 1}}, "/mcpServers/a/env/K"),
        ({"url": "ftp://h"}, "/mcpServers/a/url"),
        ({"command": "x", "timeout": 0}, "/mcpServers/a/timeout"),
        ({"command": "x", "timeout": True}, "/mcpServers/a/timeout"),
        ({"command": "x", "connect_timeout": "5"}, "/mcpServers/a/connect_timeout"),
        ({"command": "x", "costs": {"t": -1}}, "/mcpServers/a/costs/t"),
        ({"command": "x", "costs": []}, "/mcpServers/a/costs"),
        ({"command": "x", "hold": "send"}, "/mcpServers/a/hold"),
        ({"command": "x", "max_result_bytes": 10}, "/mcpServers/a/max_result_bytes"),
    ],
)
@pytest.mark.spec("BIND-5")
def test_bad_server_entries_are_refused_at_their_location(entry: Any, location: str) -> None:
    """A missing command or URL, or a wrong value, is refused and located."""
    assert _refused({"mcpServers": {"a": entry}}).location == location


@pytest.mark.spec("BIND-5")
def test_missing_mcp_servers_and_wrong_types_are_refused() -> None:
    """The document must be an object with an mcpServers object."""
    assert "mcpServers" in _refused({}).message
    assert _refused([]).location == ""
    assert _refused({"mcpServers": []}).location == "/mcpServers"
    bad_setting = {"mcpServers": {}, "gateway": {"safe_mode": 1}}
    assert _refused(bad_setting).location == "/gateway/safe_mode"


def test_unset_environment_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A $VAR that is not set is refused rather than sent as an empty value."""
    monkeypatch.delenv("AWL_TEST_UNSET", raising=False)
    headers = {"Authorization": "Bearer $AWL_TEST_UNSET"}
    error = _refused({"mcpServers": {"a": {"url": "http://h/mcp", "headers": headers}}})
    assert error.location == "/mcpServers/a/headers/Authorization"
    assert "AWL_TEST_UNSET" in error.message


@pytest.mark.spec("BIND-5")
def test_config_file_is_read_and_cwd_is_relative_to_it(tmp_path: Path) -> None:
    """A file loads; a relative cwd is resolved against the file's folder."""
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "cwd": "work"}}}))
    config = load_config(path)
    transport = config.server("a").transport
    assert isinstance(transport, StdioTransport)
    assert transport.cwd == str(tmp_path / "work")
    assert config.source == str(path)


def test_unreadable_or_broken_files_are_refused_in_one_line(tmp_path: Path) -> None:
    """A missing file or invalid JSON gives one line naming the file and the place."""
    missing = _refused(str(tmp_path / "nope.json"))
    assert "nope.json" in missing.message and "\n" not in missing.message
    broken = tmp_path / "broken.json"
    broken.write_text('{"mcpServers": {\n  "a": }')
    error = _refused(broken)
    assert "line 2" in error.message and "\n" not in error.message
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "cmd": "y"}}}))
    error = _refused(wrong)
    assert error.message.startswith(str(wrong))
    assert error.location == "/mcpServers/a"


@pytest.mark.spec("DOC-11", "DOC-12", "DOC-17", "SEC-4")
@pytest.mark.parametrize(("text", "says"), [
    ('{"mcpServers":' + "[" * 2000 + "]" * 2000 + "}", "nests deeper than 64 levels"),
    ('{"mcpServers": {"a": {"command": "x", "timeout": ' + "1" * 4301 + "}}}",
     "an integer of 4301 digits"),
    ('{"mcpServers": {"a": {"command": "x", "timeout": 1' + "0" * 400 + "}}}",
     "timeout: must be more than 0 and at most 31536000 seconds"),
    ('{"mcpServers": {"a": {"command": "x", "connect_timeout": 1e308}}}',
     "connect_timeout: must be more than 0 and at most"),
    ('{"mcpServers": {"a": {"command": "x", "timeout": 1e400}}}', "too large to hold"),
    ('{"mcpServers": {"a": {"command": "x", "costs": {"t": 1' + "0" * 400 + "}}}}",
     "t: must be from 0 to"),
    ('{"mcpServers": {"a": {"command": "x", "max_result_bytes": 1' + "0" * 400 + "}}}",
     "max_result_bytes: must be a whole number of bytes, at least 1024, not an integer of"),
    ('{"mcpServers": {"\\ud800": {"command": "x"}}}', "lone surrogate"),
])
def test_extreme_but_valid_json_configs_are_one_line(tmp_path: Path, text: str,
                                                    says: str) -> None:
    """Issue 23 item 9: nesting, long integers, huge numbers give one line, no traceback."""
    path = tmp_path / "gateway.json"
    path.write_text(text)
    error = _refused(path)
    assert says in error.message and "\n" not in error.message
    assert error.message.startswith(str(path))


@pytest.mark.spec("DOC-17")
def test_a_fifo_config_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "gateway.json"
    os.mkfifo(fifo)
    error = _refused(fifo)
    assert "it is a FIFO, not a regular file" in error.message


@pytest.mark.spec("DOC-11")
def test_a_config_given_as_data_is_held_to_the_same_limits() -> None:
    error = _refused({"mcpServers": {"a": {"command": "x", "timeout": float("nan")}}})
    assert "not a finite JSON number" in error.message


@pytest.mark.spec("BIND-5")
def test_every_unknown_key_is_named_at_once() -> None:
    """A config with several unknown keys, at several places, names every one of them."""
    error = _refused({"mcpServres": {}, "mcpServers": {
        "a": {"command": "x", "timout": 3, "costs_usd": {}},
        "b": {"url": "http://127.0.0.1:9/mcp", "env": {}}},
        "gateway": {"safe": True}})
    assert error.location == ""
    for key in ("'mcpServres'", "'timout', 'costs_usd'", "'env'", "'safe'"):
        assert key in error.message
    for place in ("/mcpServers/a: unknown keys", "/mcpServers/b: unknown key", "/gateway:"):
        assert place in error.message


@pytest.mark.spec("BIND-5")
def test_a_config_with_thousands_of_unknown_keys_is_still_one_short_line() -> None:
    """Every unknown key was named: a config holding 300 of them (a list read as an object,
    say), in 50 entries, made a line of tens of kilobytes. Now eight keys a place, five
    places, and counts for the rest."""
    many = {str(i): i for i in range(300)}
    error = _refused({"gateway": many, "mcpServers": {
        f"s{i}": {"command": "x", **many} for i in range(50)}})
    assert len(error.message) < 2000 and "\n" not in error.message
    assert "/gateway: unknown keys '0', '1'" in error.message
    assert "and 292 more; allowed here" in error.message
    assert "and unknown keys in 46 more places" in error.message


@pytest.mark.parametrize(
    ("entry", "location"),
    [
        ({"command": "x", "env": {"A=B": "1"}}, "/mcpServers/a/env/A=B"),
        ({"command": "x", "env": {"": "1"}}, "/mcpServers/a/env/"),
        ({"command": "x", "env": {"A\0": "1"}}, "/mcpServers/a/env/A\0"),
        ({"command": "x", "env": {"A": "1\0"}}, "/mcpServers/a/env/A"),
        ({"command": "x", "args": ["a\0b"]}, "/mcpServers/a/args/0"),
        ({"command": "py\0thon"}, "/mcpServers/a/command"),
        ({"url": "http://"}, "/mcpServers/a/url"),
        ({"url": "https:///mcp"}, "/mcpServers/a/url"),
        ({"url": "http://h:99999/mcp"}, "/mcpServers/a/url"),
        ({"url": "http://h/mcp", "headers": {"Bad Name": "x"}}, "/mcpServers/a/headers/Bad Name"),
        ({"url": "http://h/mcp", "headers": {"X": "caf\u00e9"}}, "/mcpServers/a/headers/X"),
    ],
)
@pytest.mark.spec("BIND-5")
def test_what_the_os_or_http_cannot_carry_is_refused_on_load(entry: Any, location: str) -> None:
    """An environment name, NUL byte, URL without a host or header no process or HTTP request
    can carry is refused where it is, on load, not when the server is first started."""
    assert _refused({"mcpServers": {"a": entry}}).location == location


@pytest.mark.spec("BIND-5")
@pytest.mark.parametrize("value", ["s3cret\n", "s3cret\r\nX-Evil: 1", "s3cret "])
def test_a_header_value_http_cannot_send_is_refused_without_showing_it(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """A token read from $VAR with a line break or a space at its end is refused on load,
    naming the header but never its value (the HTTP client's own error quotes it, and that
    reached the log and the worker as the tool's error)."""
    monkeypatch.setenv("AWL_TEST_TOKEN", value)
    headers = {"Authorization": "Bearer $AWL_TEST_TOKEN"}
    error = _refused({"mcpServers": {"a": {"url": "http://h/mcp", "headers": headers}}})
    assert error.location == "/mcpServers/a/headers/Authorization"
    assert "s3cret" not in error.message and "\n" not in error.message
    assert "cannot be sent as an HTTP header" in error.message
