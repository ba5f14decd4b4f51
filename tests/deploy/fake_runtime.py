"""A fake ``docker``/``podman`` CLI: it records each call and plays the daemon's answers.

Installed under both names in a directory put first on ``PATH``. Every call appends
one JSON line ``{"argv": [...]}`` (the name called as first word) to
``$FAKE_RUNTIME_LOG``. The answers, set by the environment:

- ``--version``: ``Docker version 27.3.1`` (``podman version 5.2.2`` when called as
  podman, or when ``FAKE_DOCKER_IS_PODMAN=1``);
- with ``FAKE_DAEMON_ERROR=TEXT``, every other call prints TEXT on stderr and exits 1
  (125 as podman), as the CLI does when its daemon or service is down;
- ``version --format {{.Server.Version}}``: ``27.3.1`` (``5.2.2``);
- ``image inspect IMAGE``: exit 0 when ``FAKE_IMAGE_PRESENT=1``, else 1 with
  ``Error: No such image: IMAGE``;
- ``pull IMAGE``: with ``FAKE_PULL_ERROR=TEXT`` prints TEXT on stderr and exits 1, else
  exits ``FAKE_PULL_EXIT`` (0);
- ``container inspect ... NAME``: ``FAKE_CONTAINER`` = ``none`` (exit 1, default),
  ``running`` (prints ``true``) or ``exited`` (prints ``false``);
- ``rm``: exit 0;
- ``kill NAME``: SIGKILL to the running ``run`` (its pid is kept beside the log);
- ``run``: records the content of a mounted models file as ``{"models_yaml": TEXT}``;
  with ``FAKE_RUN_EXIT=N`` exits N at once; else prints
  ``fake-container: running`` and waits (60 s at most) for SIGINT or SIGTERM, records
  ``{"stopped": "SIGTERM"}`` and exits 128 + the signal, as ``docker run`` does; with
  ``FAKE_RUN_STUBBORN=1`` the first signal is recorded as ``{"ignored": "SIGTERM"}`` and
  the wait goes on (a container slow to stop).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def record(entry: dict[str, object]) -> None:
    with open(os.environ["FAKE_RUNTIME_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def main() -> int:
    name = Path(sys.argv[0]).name
    argv = [name, *sys.argv[1:]]
    # Block the stop signals before anything else: none is lost before the wait.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    record({"argv": argv})
    words = argv[1:]
    podman = name == "podman" or os.environ.get("FAKE_DOCKER_IS_PODMAN") == "1"
    if words == ["--version"]:
        print("podman version 5.2.2" if podman else "Docker version 27.3.1, build fake")
        return 0
    if os.environ.get("FAKE_DAEMON_ERROR"):
        print(os.environ["FAKE_DAEMON_ERROR"], file=sys.stderr)
        return 125 if podman else 1
    if words == ["version", "--format", "{{.Server.Version}}"]:
        print("5.2.2" if podman else "27.3.1")
        return 0
    if words[:2] == ["image", "inspect"]:
        if os.environ.get("FAKE_IMAGE_PRESENT") == "1":
            return 0
        print(f"Error: No such image: {words[-1]}", file=sys.stderr)
        return 1
    if words[:1] == ["pull"]:
        if os.environ.get("FAKE_PULL_ERROR"):
            print(os.environ["FAKE_PULL_ERROR"], file=sys.stderr)
            return 1
        return int(os.environ.get("FAKE_PULL_EXIT", "0"))
    if words[:2] == ["container", "inspect"]:
        state = os.environ.get("FAKE_CONTAINER", "none")
        if state == "none":
            print(f"Error: no such container: {words[-1]}", file=sys.stderr)
            return 1
        print("true" if state == "running" else "false")
        return 0
    if words[:1] == ["rm"]:
        return 0
    if words[:1] == ["kill"]:
        pid = Path(os.environ["FAKE_RUNTIME_LOG"] + ".run-pid").read_text()
        os.kill(int(pid), signal.SIGKILL)
        return 0
    if words[:1] == ["run"]:
        for index, word in enumerate(words[:-1]):
            host, _, inside = words[index + 1].partition(":")
            if word == "-v" and inside.startswith("/app/packages/models.yaml:"):
                record({"models_yaml": Path(host).read_text(encoding="utf-8")})
        if "FAKE_RUN_EXIT" in os.environ:
            return int(os.environ["FAKE_RUN_EXIT"])
        Path(os.environ["FAKE_RUNTIME_LOG"] + ".run-pid").write_text(str(os.getpid()))
        print("fake-container: running", flush=True)
        got = signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 60)
        if got is not None and os.environ.get("FAKE_RUN_STUBBORN") == "1":
            record({"ignored": signal.Signals(got.si_signo).name})
            got = signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 60)
        if got is None:
            record({"stopped": None})
            return 1
        record({"stopped": signal.Signals(got.si_signo).name})
        return 128 + got.si_signo
    print(f"fake runtime: unexpected call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
