"""A stdio relay that holds back chosen tool results.

Run as `python tests/mcp_slow_proxy.py -- CMD ARGS...`.

It starts CMD as its child and relays newline-delimited JSON-RPC both ways,
byte for byte. For each `tools/call` request whose tool is named in
`MCP_PROXY_SLOW_TOOLS` (comma separated) it appends
`{"name", "operation_id", "arguments"}` to the file `MCP_PROXY_LOG` as the
request passes through to the server, and relays that request's response back
to the client only `MCP_PROXY_DELAY` seconds (default 3) after the server sent it.

So a test can put a real server behind it (the reference filesystem server), wait
until a write is on disk or a read reached the server, and SIGKILL the worker
before the result arrives. The relay exits when its stdin closes (the client
went away) and kills the server then; when the server exits, the relay closes
its stdout and exits with the server's code.

Standard library only, so it starts fast and needs no virtualenv.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

OPERATION_ID_KEY = "io.durably/operation_id"


class Relay:
    def __init__(self, command: list[str]) -> None:
        self.slow_tools = {
            name.strip()
            for name in os.environ.get("MCP_PROXY_SLOW_TOOLS", "").split(",")
            if name.strip()
        }
        self.delay = float(os.environ.get("MCP_PROXY_DELAY") or 3)
        self.log_path = os.environ.get("MCP_PROXY_LOG")
        self.slow_ids: set[Any] = set()
        self.lock = threading.Lock()
        self.out = sys.stdout.buffer
        self.child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def to_server(self) -> None:
        """Relay the client's lines to the server until the client closes stdin."""
        assert self.child.stdin is not None
        for line in sys.stdin.buffer:
            self.note_request(line)
            try:
                self.child.stdin.write(line)
                self.child.stdin.flush()
            except (BrokenPipeError, ValueError):
                break

    def to_client(self) -> None:
        """Relay the server's lines to the client, holding back slow results."""
        assert self.child.stdout is not None
        for line in self.child.stdout:
            if self.is_slow_response(line):
                timer = threading.Timer(self.delay, self.write, (line,))
                timer.daemon = True
                timer.start()
            else:
                self.write(line)
        code = self.child.wait()
        with self.lock:
            self.out.close()
        os._exit(code if code >= 0 else 1)

    def note_request(self, line: bytes) -> None:
        message = parse(line)
        if message is None or message.get("method") != "tools/call" or "id" not in message:
            return
        params = message.get("params") or {}
        name = params.get("name")
        if name not in self.slow_tools:
            return
        with self.lock:
            self.slow_ids.add(message["id"])
        if self.log_path:
            meta = params.get("_meta") or {}
            entry = {
                "name": name,
                "operation_id": meta.get(OPERATION_ID_KEY),
                "arguments": params.get("arguments"),
            }
            with open(self.log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def is_slow_response(self, line: bytes) -> bool:
        message = parse(line)
        if message is None or "method" in message or "id" not in message:
            return False
        with self.lock:
            if message["id"] in self.slow_ids:
                self.slow_ids.discard(message["id"])
                return True
        return False

    def write(self, line: bytes) -> None:
        with self.lock:
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, ValueError):
                pass

    def stop(self) -> None:
        """Kill the server and exit."""
        self.child.kill()
        self.child.wait()
        os._exit(0)


def parse(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: mcp_slow_proxy.py -- COMMAND [ARGS...]", file=sys.stderr)
        sys.exit(2)
    relay = Relay(argv[argv.index("--") + 1 :])
    signal.signal(signal.SIGTERM, lambda *_: relay.stop())
    threading.Thread(target=relay.to_client, daemon=True).start()
    relay.to_server()
    relay.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
