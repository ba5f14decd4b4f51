"""``vllm-sr config apply|get|plan``: a running frontend's configuration API, from the
command line (ROUTER-SPEC §3.2).

``apply`` plans first; an unchanged configuration prints ``{"applied": false, "reason":
"unchanged", "plan"}``, otherwise it sends ``PUT`` (``--mode replace``) or ``PATCH``
(``--mode merge``) with ``If-Match`` set to the plan's ``current_etag`` and prints
``{"applied": true, "plan", "result"}``. Output is indented JSON with sorted keys. An error
answer exits 1 with ``Router management API returned HTTP <status>: <code>: <message>``;
no answer exits 1 with ``Router management API is not reachable at <url>``. With the
``--token-env`` variable set (default ``VSR_MGMT_TOKEN``), its value goes as
``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_ENDPOINT = "http://localhost:8080"
DEFAULT_TIMEOUT = 15.0
TOKEN_ENV = "VSR_MGMT_TOKEN"


class ManagementError(Exception):
    """The management API answered an error, or did not answer (the message says)."""


def default_endpoint(environ: dict[str, str] | None = None) -> str:
    """``http://localhost:<8080 + VLLM_SR_PORT_OFFSET>``."""
    from .config.flags import port_offset

    return f"http://localhost:{8080 + port_offset(environ)}"


class ManagementClient:
    """Calls to one frontend's management API.

    Args:
        endpoint: its base URL.
        timeout: seconds each call may take.
        token: the bearer token, or ``None``.
    """

    def __init__(self, endpoint: str, timeout: float, token: str | None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self.token = token

    def call(
        self,
        method: str,
        route: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """One call: its status, headers and JSON body.

        Raises:
            ManagementError: not reachable, an error status, or an answer that is not JSON.
        """
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            sent["Content-Type"] = "application/json"
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.endpoint + route, data, sent, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                status, got, raw = answer.status, dict(answer.headers.items()), answer.read()
        except urllib.error.HTTPError as err:
            status, got, raw = err.code, dict(err.headers.items()), err.read()
        except (urllib.error.URLError, OSError) as err:  # TimeoutError is an OSError
            if isinstance(err, TimeoutError) or isinstance(
                getattr(err, "reason", None), TimeoutError
            ):
                raise ManagementError(
                    f"Router management API at {self.endpoint} did not answer within "
                    f"{self.timeout:g} s (raise --timeout)"
                ) from err
            raise ManagementError(
                f"Router management API is not reachable at {self.endpoint}"
            ) from err
        try:
            document = json.loads(raw) if raw else {}
        except ValueError:
            raise ManagementError(
                f"Router management API returned HTTP {status}: invalid_response: "
                "the answer is not JSON"
            ) from None
        if status >= 400:
            raise ManagementError(_error_line(status, document))
        return status, got, document


def _error_line(status: int, document: Any) -> str:
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        code, message = error.get("code", "error"), error.get("message", "")
    elif isinstance(document, dict) and "status" in document:
        code, message = document.get("status"), document.get("message", "")
        rejection = document.get("last_rejection")
        if isinstance(rejection, dict) and rejection.get("error"):
            message = f"{message}: {rejection['error']}"
    else:
        code, message = "error", ""
    return f"Router management API returned HTTP {status}: {code}: {message}"


def _print(document: Any) -> None:
    print(json.dumps(document, indent=2, sort_keys=True))


def _client(args: Any) -> ManagementClient:
    token = (os.environ.get(args.token_env) or "").strip() if args.token_env else None
    return ManagementClient(args.endpoint or default_endpoint(), args.timeout, token or None)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ManagementError(f"{path}: cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ManagementError(f"{path}: is not UTF-8 text: save it as UTF-8 YAML") from None


def run(args: Any) -> int:
    """``vllm-sr config apply|get|plan``: 0, or 1 with the error line on stderr."""
    try:
        client = _client(args)
        if args.config_command == "get":
            _, headers, document = client.call("GET", "/api/v1/config")
            print(f"ETag: {headers.get('ETag') or headers.get('etag', '')}", file=sys.stderr)
            _print(document)
            return 0
        text = _read(args.config)
        _, _, plan = client.call("POST", "/api/v1/config/plan", {"yaml": text, "mode": args.mode})
        if args.config_command == "plan":
            _print(plan)
            return 0
        for warning in plan.get("warnings") or []:
            print(f"warning: {warning}", file=sys.stderr)
        if not plan.get("changed"):
            _print({"applied": False, "reason": "unchanged", "plan": plan})
            return 0
        method = "PATCH" if args.mode == "merge" else "PUT"
        _, _, result = client.call(
            method,
            "/api/v1/config",
            {"yaml": text},
            {"If-Match": str(plan.get("current_etag", ""))},
        )
        _print({"applied": True, "plan": plan, "result": result})
        return 0
    except ManagementError as err:
        print(str(err), file=sys.stderr, flush=True)
        return 1


def add_commands(config_commands: Any) -> None:
    """``apply``, ``get`` and ``plan`` under ``vllm-sr config``."""

    def common(parser: Any) -> None:
        parser.add_argument(
            "--endpoint",
            default=None,
            help=f"the management API (default: {DEFAULT_ENDPOINT}, port plus VLLM_SR_PORT_OFFSET)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help="seconds each call may take (default: 15)",
        )
        parser.add_argument(
            "--token-env",
            default=TOKEN_ENV,
            help="the variable holding the management token, sent as Authorization: Bearer "
            f"(default: {TOKEN_ENV})",
        )

    def document(parser: Any) -> None:
        parser.add_argument(
            "--config", default="config.yaml", help="the document (default: config.yaml)"
        )
        parser.add_argument(
            "--mode",
            choices=("replace", "merge"),
            default="replace",
            help="replace the configuration, or merge the document into it (default: replace)",
        )

    apply = config_commands.add_parser(
        "apply",
        help="apply a config.yaml to a running frontend without a restart; the old "
        "configuration serves until the new one is ready",
    )
    document(apply)
    common(apply)
    plan = config_commands.add_parser(
        "plan", help="check a config.yaml against a running frontend: valid, changed"
    )
    document(plan)
    common(plan)
    get = config_commands.add_parser(
        "get", help="print a running frontend's configuration (keys redacted)"
    )
    common(get)
