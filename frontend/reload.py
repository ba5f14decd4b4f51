"""Configuration changes without a restart (ROUTER-SPEC §3.2): the persisted file
(:class:`ConfigSource`) and the plan, apply and activation of a new document
(:class:`Reloads`). The document's own rules (safe YAML, hashes, redaction, merge patch,
what needs a restart) are :mod:`vllm_sr.config_document`'s.

An apply validates the new document, refuses what needs a restart (the listeners' set,
address, port or timeout; the mode), backs the file up and writes it atomically, then
activates it: the next :class:`~.generation.Generation` is prepared beside the active
one (unchanged workers reused, new ones started, each managed deployment waited for
under ``VLLM_SRUN_READY_TIMEOUT``, bindings checked against the cards, in Router mode
the routes composed and their candidates embedded), then published to every listener at
once. Requests admitted before finish on the generation that admitted them; a worker
the new generation no longer has takes no new request, and is stopped once the
requests it holds and those the old generation admitted are done. A failed activation
stops what it started and leaves the old generation serving; ``last_rejection`` says why.

Hashes: ``source_config_hash`` is sha256 of the file's bytes (the ``ETag`` is its hex in
quotes); ``generated_runtime_hash`` is sha256 of the validated configuration as
canonical JSON (sorted keys, no spaces); ``active_runtime_hash`` is the generated hash of
the generation serving. Each activation bumps ``config_version``.

Why one module of nearly 700 lines: :class:`Reloads` is 445 of them and one piece of state (the
generated, active and failed hashes, the pending :class:`Activation`, the last rejection,
the generations still retiring) that plan, apply, the activation and its undoing, the
retirement, SIGHUP and :meth:`~Reloads.close` each read and write; :class:`ConfigSource`
(the file, its ``ETag`` and backups, under 100 lines) could stand alone, but is what an
apply's precondition and write act on, and without it this module would still top 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from .config.in_use import unserved_grants
from .config.schema import Config, ConfigError, parse_config
from .config_document import (
    ConfigRefused,
    RedactedUnknown,
    merge_patch,
    problem_reasons,
    redacted,
    restart_problems,
    runtime_hash,
    safe_yaml,
    sha256,
    unredacted,
    unset_credentials,
)
from .router.compose import RouterUnready, router_mode
from .startup import StartupFailed, wait_for_deployments
from .workers.environment import PlanError

if TYPE_CHECKING:
    from .generation import Generation
    from .metrics import Metrics
    from .startup import StartupStatus
    from .workers.supervisor import Clock

log = logging.getLogger("vllm_sr.reload")

RESPONSE_WAIT = 5.0
"""Seconds a ``PUT``/``PATCH`` waits for the activation before answering 202 (§3.2 [P])."""

RETIRE_WAIT = 60.0
"""Seconds a retired generation's admitted requests may take before its workers stop
anyway (twice the listeners' 30 s worker timeout)."""

BACKUPS_KEPT = 10
"""Earlier versions of the configuration file kept beside it."""


class Retiring(Protocol):
    """A listener, as a reload waits on it (:class:`~vllm_sr.api.native.Listener`)."""

    async def retired(self) -> None: ...


class Target(Protocol):
    """What a reload changes (the :class:`~vllm_sr.frontend.Frontend`)."""

    active: Generation | None
    preparing: Generation | None
    status: StartupStatus

    @property
    def listeners(self) -> Mapping[str, Retiring]: ...

    metrics: Metrics
    ready_timeout: float
    timeout_source: str
    clock: Clock

    async def compose(self, config: Config, previous: Generation | None) -> Generation: ...

    def binding_problems(self, generation: Generation) -> list[str]: ...

    async def compose_router(self, generation: Generation) -> None: ...

    def activate(self, generation: Generation) -> None: ...


class ConfigSource:
    """The configuration as persisted, and how a document becomes the one served.

    Args:
        text: the document's bytes as the frontend read them at start.
        load: a document (the YAML mapping) to the validated configuration served (the
            start's serve flags applied); raises :class:`ConfigError`.
        path: the file (``--config``), or ``None``: kept in memory only.
    """

    def __init__(
        self,
        text: bytes,
        load: Callable[[dict[str, Any]], Config],
        path: Path | None = None,
    ) -> None:
        self._text = text
        self.load = load
        self.path = path

    @classmethod
    def of(cls, config: Config) -> ConfigSource:
        """An in-memory source holding ``config`` itself."""
        document = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()
        return cls(text, lambda doc: parse_config(doc))

    @property
    def text(self) -> bytes:
        """The persisted bytes: the file's as they are now (an edit by hand counts: the
        ``ETag`` changes with it), else the in-memory copy."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                return self.path.read_bytes()
        return self._text

    @property
    def etag(self) -> str:
        return f'"{sha256(self.text)}"'

    def document(self) -> dict[str, Any]:
        """The persisted document (``{}`` for an empty one).

        Raises:
            ConfigError: the persisted text is not a YAML mapping.
        """
        text = self.text
        found = safe_yaml(text.decode()) if text.strip() else {}
        if found is None:
            return {}
        if not isinstance(found, dict):
            raise ConfigError(["the configuration must be a mapping"], str(self.path or ""))
        return found

    def write(self, text: bytes, version: str) -> None:
        """Persist ``text``: the current file backed up as ``<name>.<version>.bak`` in
        ``<name>.backups/`` (the last :data:`BACKUPS_KEPT` kept), then the new bytes
        written to a temporary file and renamed over it. Bytes equal to the file's are
        not written again (no backup either).

        Raises:
            OSError: the file or its backup cannot be written, or the file is read-only
                (no write permission bit: a rename would replace it anyway).
        """
        self._text = text
        if self.path is None:
            return
        path = self.path
        current = path.read_bytes() if path.exists() else None
        if current == text:
            return
        if current is not None and not path.stat().st_mode & 0o222:
            raise PermissionError(f"{path} is read-only")
        backups = path.with_name(path.name + ".backups")
        backups.mkdir(mode=0o700, exist_ok=True)
        if current is not None:
            (backups / f"{path.name}.{version}.bak").write_bytes(current)
        kept = sorted(backups.glob(f"{path.name}.*.bak"))
        for old in kept[:-BACKUPS_KEPT]:
            with contextlib.suppress(OSError):
                old.unlink()
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            if path.exists():
                os.chmod(temporary, path.stat().st_mode & 0o777)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


@dataclass
class Candidate:
    """A document validated for a plan or an apply."""

    text: bytes
    config: Config
    runtime_hash: str
    changed: bool
    document: dict[str, Any] = field(default_factory=dict)


@dataclass
class Activation:
    """One activation attempt (the hash document's ``activation``)."""

    config_version: int
    document_hash: str
    started_at: str
    status: str = "pending"
    finished_at: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def document(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "status": self.status,
            "config_version": self.config_version,
            "document_hash": self.document_hash,
            "started_at": self.started_at,
        }
        if self.finished_at is not None:
            found["finished_at"] = self.finished_at
        return found


def invalid(message: str, problems: list[str] | None = None) -> ConfigRefused:
    """400 ``INVALID_CONFIG`` saying ``message``, with each of ``problems`` (else the
    message itself) as a reason."""
    return ConfigRefused(
        400,
        "INVALID_CONFIG",
        message,
        reasons=problem_reasons(problems if problems is not None else [message], "INVALID_CONFIG"),
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Reloads:
    """The configuration API's state and the activations it runs, for one frontend.

    Args:
        frontend: the frontend whose generations are replaced.
        source: the persisted configuration.
        token: the bearer token the configuration routes ask for, or ``None``.
    """

    def __init__(self, frontend: Target, source: ConfigSource, token: str | None) -> None:
        self.frontend = frontend
        self.source = source
        self.token = token
        self.generated_hash: str | None = None
        self.active_hash: str | None = None
        self.failed_hash: str | None = None
        self.last_rejection: dict[str, Any] | None = None
        self.activation: Activation | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._to_stop: list[tuple[Generation, list[Any]]] = []

    # -- what is served ----------------------------------------------------------------------
    def started(self, generation: Generation) -> None:
        """The frontend serves ``generation``, its first (startup is an activation)."""
        self.active_hash = runtime_hash(generation.config)
        if self.generated_hash is None:
            self.generated_hash = self.active_hash

    @property
    def config_version(self) -> int:
        active = self.frontend.active
        return active.version if active is not None and self.active_hash else 0

    def activation_status(self) -> str:
        """``unknown`` (nothing active yet), ``active`` (active is generated), ``failed``
        (the last attempt at the generated hash failed), else ``pending``."""
        if self.active_hash is None:
            return "unknown"
        if self.active_hash == self.generated_hash:
            return "active"
        if self.failed_hash is not None and self.failed_hash == self.generated_hash:
            return "failed"
        return "pending"

    def hash_document(self) -> dict[str, Any]:
        """``GET /api/v1/config/hash``."""
        document: dict[str, Any] = {
            "source_config_hash": "sha256:" + sha256(self.source.text),
            "generated_runtime_hash": self.generated_hash,
            "activation_status": self.activation_status(),
        }
        if self.active_hash is not None:
            document["active_runtime_hash"] = self.active_hash
            document["active_version"] = self.config_version
        if self.activation is not None:
            document["activation"] = self.activation.document()
        if self.last_rejection is not None:
            document["last_rejection"] = self.last_rejection
        return document

    def current(self) -> dict[str, Any]:
        """The persisted document, credentials redacted (``GET /api/v1/config``).

        Raises:
            ConfigRefused: 500 ``INVALID_CONFIG``: the persisted text is not a mapping.
        """
        try:
            return redacted(self.source.document())  # type: ignore[no-any-return]
        except (ConfigError, yaml.YAMLError) as err:
            raise ConfigRefused(
                500, "INVALID_CONFIG", f"the persisted configuration: {err}"
            ) from None

    # -- plan --------------------------------------------------------------------------------
    def candidate(self, text: str, mode: str) -> Candidate:
        """Validate ``text`` (a whole document, or with ``mode: merge`` a merge patch of
        the persisted one) as the next configuration. A credential written as the
        ``<redacted>`` placeholder ``GET /api/v1/config`` showed is the persisted one
        (:func:`~.config_document.unredacted`).

        Raises:
            ConfigRefused: 400 ``INVALID_REQUEST`` (a mode other than replace or merge);
                400 ``INVALID_CONFIG`` with every problem (a placeholder standing for no
                persisted credential among them).
        """
        if mode not in ("replace", "merge"):
            raise ConfigRefused(400, "INVALID_REQUEST", "mode must be replace or merge")
        try:
            given = safe_yaml(text) if text.strip() else {}
        except yaml.YAMLError as err:
            raise invalid(f"the document is not YAML: {err}") from None
        given = {} if given is None else given
        if not isinstance(given, dict):
            raise invalid(
                "the configuration must be a mapping (global:, listeners:)",
                ["the configuration must be a mapping"],
            )
        try:
            persisted = self.source.document()
        except (ConfigError, yaml.YAMLError):
            persisted = {}
        try:
            restored = unredacted(given, persisted, patch=mode == "merge")
        except RedactedUnknown as err:
            raise invalid(str(err)) from None
        if mode == "merge" or restored != given:  # the text to write is not the one sent
            given = merge_patch(persisted, restored) if mode == "merge" else restored
            data = yaml.safe_dump(given, sort_keys=False, allow_unicode=True).encode()
            if given == persisted:  # the saved document itself: its file stays as written
                data = self.source.text
        else:
            data = text.encode()
        try:
            config = self.source.load(given)
        except ConfigError as err:
            raise invalid(
                f"the configuration is not valid ({len(err.problems)} problem"
                f"{'s' if len(err.problems) != 1 else ''}): " + "; ".join(err.problems),
                err.problems,
            ) from None
        except ValueError as err:  # a serve flag that cannot apply to the new document
            raise invalid(str(err)) from None
        generated = runtime_hash(config)
        changed = data != self.source.text or generated != self.active_hash
        return Candidate(data, config, generated, changed, given)

    def plan(self, text: str, mode: str) -> dict[str, Any]:
        """``POST /api/v1/config/plan``: whether ``text`` is valid and changes anything,
        whether it needs a restart (``restart_required``, the ``reasons``), and
        ``warnings`` (grants naming a model no deployment serves).

        Raises:
            ConfigRefused: as :meth:`candidate`.
        """
        candidate = self.candidate(text, mode)
        active = self.frontend.active if self.frontend is not None else None
        restart = (
            restart_problems(active.config, candidate.config, candidate.document) if active else []
        )
        plan: dict[str, Any] = {
            "valid": True,
            "mode": mode,
            "changed": candidate.changed,
            "current_etag": self.source.etag,
            "candidate_etag": f'"{sha256(candidate.text)}"',
            "restart_required": bool(restart),
            "warnings": unserved_grants(candidate.config) + unset_credentials(candidate.config),
        }
        if restart:
            plan["reasons"] = problem_reasons(restart, "RESTART_REQUIRED")
        return plan

    # -- apply -------------------------------------------------------------------------------
    def check_precondition(self, if_match: str | None) -> None:
        """Raises ConfigRefused: 428 without ``If-Match``, 412 when it is stale."""
        if if_match is None or not if_match.strip():
            raise ConfigRefused(
                428,
                "PRECONDITION_REQUIRED",
                "send If-Match with the ETag of GET /api/v1/config (or the plan's current_etag)",
            )
        tags = {tag.strip() for tag in if_match.split(",")}
        if "*" not in tags and self.source.etag not in tags:
            raise ConfigRefused(
                412,
                "CONFIG_CHANGED",
                "The router config changed since it was read; refetch and retry with the "
                "latest ETag",
                headers={"ETag": self.source.etag},
            )

    def admissible(self, if_match: str | None) -> None:
        """Whether an apply may write now: its precondition holds, the first configuration
        serves and no activation is pending.

        Raises:
            ConfigRefused: 428, 412 (:meth:`check_precondition`), 503 ``NOT_READY``, 409
                ``ACTIVATION_IN_PROGRESS``.
        """
        self.check_precondition(if_match)
        if self.active_hash is None or self.frontend.active is None:
            raise ConfigRefused(
                503,
                "NOT_READY",
                "the first configuration is still starting; wait for /ready, then retry",
                headers={"Retry-After": "5"},
            )
        if self.activation is not None and self.activation.status == "pending":
            raise ConfigRefused(
                409,
                "ACTIVATION_IN_PROGRESS",
                "another configuration is being activated; poll /api/v1/config/hash until "
                "activation_status is active or failed, then retry",
            )

    async def apply(self, text: str, mode: str, if_match: str | None) -> tuple[int, dict[str, Any]]:
        """``PUT`` (replace) or ``PATCH`` (merge) ``/api/v1/config``: validate, persist,
        activate; wait up to :data:`RESPONSE_WAIT` s for the activation.

        Returns:
            200 (active), 202 (still pending) or 503 (failed), and the body.

        Raises:
            ConfigRefused: 428, 412, 400 ``INVALID_CONFIG``, 409 ``RESTART_REQUIRED``, 409
                ``ACTIVATION_IN_PROGRESS``, 503 ``NOT_READY`` (startup not finished), 500
                ``WRITE_FAILED``.
        """
        self.admissible(if_match)
        based_on = self.source.etag
        candidate = await asyncio.to_thread(self.candidate, text, mode)  # a large one takes s
        # Checked again: another apply may have written or started meanwhile (a merge
        # would drop its change, even under If-Match: *). From here to the activation's
        # start nothing awaits, so no other apply can come between.
        self.admissible(if_match)
        if self.source.etag != based_on:
            raise ConfigRefused(
                412,
                "CONFIG_CHANGED",
                "The router config changed while this request was validated; refetch and "
                "retry with the latest ETag",
                headers={"ETag": self.source.etag},
            )
        frontend = self.frontend
        assert frontend.active is not None  # admissible: the first generation serves
        problems = restart_problems(frontend.active.config, candidate.config, candidate.document)
        if problems:
            raise ConfigRefused(
                409,
                "RESTART_REQUIRED",
                "this change needs a restart of vllm-sr: " + "; ".join(problems),
                reasons=problem_reasons(problems, "RESTART_REQUIRED"),
            )
        version = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        try:
            self.source.write(candidate.text, version)
        except OSError as err:
            raise ConfigRefused(
                500,
                "WRITE_FAILED",
                f"the configuration file cannot be written ({err.strerror or err}); nothing "
                "changed",
            ) from None
        self.generated_hash = candidate.runtime_hash
        if candidate.runtime_hash == self.active_hash:
            # Same configuration served (a comment, a key order): nothing to activate.
            return 200, self._result("success", version)
        activation = Activation(
            config_version=frontend.active.version + 1,
            document_hash=candidate.runtime_hash,
            started_at=_now(),
        )
        self.activation = activation
        activation.task = asyncio.create_task(
            self._activate(candidate, activation), name="activate configuration"
        )
        await asyncio.wait({activation.task}, timeout=RESPONSE_WAIT)
        if activation.status == "active":
            return 200, self._result("success", version)
        if activation.status == "failed":
            return 503, self._result(
                "activation_failed",
                version,
                message="the new configuration was saved but could not be activated; the "
                "previous one keeps serving (see last_rejection in /api/v1/config/hash)",
                last_rejection=self.last_rejection,
            )
        return 202, self._result(
            "accepted",
            version,
            message="The configuration was saved and is being activated while the previous "
            "one keeps serving. Poll /api/v1/config/hash until activation_status is active.",
        )

    def _result(self, status: str, version: str, **extra: Any) -> dict[str, Any]:
        """An apply's answer: its ``status``, the file's version and ETag, the activation's
        state and hashes, and ``extra`` (a message, the rejection)."""
        return {
            "status": status,
            "version": version,
            "etag": self.source.etag,
            "activation_status": self.activation_status(),
            "generated_runtime_hash": self.generated_hash,
            "config_version": self.config_version,
            **extra,
        }

    async def _activate(self, candidate: Candidate, activation: Activation) -> None:
        """Prepare the candidate's generation beside the active one, publish it, retire
        what it dropped; on failure stop what was started and record why."""
        frontend = self.frontend
        previous = frontend.active
        assert previous is not None
        generation: Generation | None = None
        try:
            if self._retiring:  # a retiring worker's socket may be the one a new plan names
                await asyncio.gather(*self._retiring, return_exceptions=True)
            generation = await frontend.compose(candidate.config, previous)
            frontend.preparing = generation
            frontend.status.preparing = (generation.version, generation.views)
            generation.start()
            await wait_for_deployments(
                generation.views,
                timeout=frontend.ready_timeout,
                source=frontend.timeout_source,
                clock=frontend.clock,
                report=lambda line: log.info("config version %d: %s", generation.version, line),
                mode="Router" if router_mode(candidate.config) else "Engine",
            )
            problems = frontend.binding_problems(generation)
            if problems:
                raise StartupFailed("; ".join(problems))
            if router_mode(candidate.config):
                await frontend.compose_router(generation)
        except (StartupFailed, RouterUnready, PlanError) as err:
            await self._rejected(activation, generation, [str(err)])
            return
        except asyncio.CancelledError:
            await self._rejected(activation, generation, ["the frontend is shutting down"])
            raise
        except Exception as err:  # never leave workers of a failed attempt running
            log.exception("activation of config version %d failed", activation.config_version)
            await self._rejected(activation, generation, [f"internal error: {err}"])
            return
        frontend.preparing = None
        frontend.status.preparing = None
        try:
            frontend.activate(generation)
        except Exception as err:  # nothing published: the old generation still serves
            log.exception("config version %d could not be published", generation.version)
            await self._rejected(activation, generation, [f"internal error: {err}"])
            return
        self.active_hash = candidate.runtime_hash
        activation.status, activation.finished_at = "active", _now()
        log.info("config version %d is active", generation.version)
        task = asyncio.create_task(self._retire(previous, generation), name="retire generation")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _rejected(
        self, activation: Activation, generation: Generation | None, problems: list[str]
    ) -> None:
        frontend = self.frontend
        if generation is not None:
            await generation.stop(generation.started)
        frontend.preparing = None
        frontend.status.preparing = None
        self.failed_hash = activation.document_hash
        activation.status, activation.finished_at = "failed", _now()
        self.last_rejection = {
            "document_hash": activation.document_hash,
            "status": "failed",
            "reasons": problem_reasons(problems, "ACTIVATION_FAILED"),
            "error": "; ".join(problems),
        }
        log.error(
            "config version %d was not activated; the previous one keeps serving: %s",
            activation.config_version,
            "; ".join(problems),
        )

    async def _retire(self, old: Generation, new: Generation) -> None:
        """Stop what ``old`` has and ``new`` does not, once the requests ``old``
        admitted are done (at most :data:`RETIRE_WAIT` s) and each retired worker holds
        none; then delete the retired replicas' and deployments' series."""
        frontend = self.frontend
        kept = {id(w) for w in new.workers()}
        retired = [
            (view.pool, worker)
            for view in old.views
            for worker in view.workers
            if id(worker) not in kept
        ]
        kept_items = {id(item) for item in new.everything()}
        dropped = [item for item in old.everything() if id(item) not in kept_items]
        self._to_stop.append((old, dropped))
        for pool, worker in retired:
            pool.retire(worker)
        waits = [pool.drained(worker) for pool, worker in retired]
        waits += [listener.retired() for listener in frontend.listeners.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETIRE_WAIT):
                    await asyncio.gather(*waits)
        self._to_stop.remove((old, dropped))
        await old.stop(dropped)
        new_names = {view.name for view in new.views}
        for view in old.views:
            if view.name not in new_names:
                frontend.metrics.forget(view.pool)
                frontend.metrics.drop(view.name)
        for pool, worker in retired:
            if pool.deployment in new_names:
                frontend.metrics.drop(pool.deployment, worker.replica_id)
        if dropped:
            log.info(
                "config version %d: %d retired worker(s) stopped after their last request",
                new.version,
                len(dropped),
            )

    # -- SIGHUP ------------------------------------------------------------------------------
    async def reread(self) -> None:
        """SIGHUP: apply the configuration file as it reads now, as ``vllm-sr config apply
        --config FILE`` would (plan; nothing to do when unchanged; else apply with the
        file's ``ETag``), and log the outcome; never more than a log line on failure.
        Without a file (Engine mode started without ``--config``) there is nothing to
        read again: a log line says so."""
        path = self.source.path
        if path is None:
            log.info(
                "SIGHUP ignored: this frontend was started without --config, so there is no "
                "configuration file to reload; start it with --config FILE to reload on SIGHUP"
            )
            return
        serving = self.config_version
        keeps = f"config version {serving} keeps serving"
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except OSError as err:
            log.error("SIGHUP: %s cannot be read (%s); %s", path, err.strerror or err, keeps)
            return
        except UnicodeDecodeError:
            log.error("SIGHUP: %s is not UTF-8 text; save it as UTF-8 YAML; %s", path, keeps)
            return
        try:
            plan = await asyncio.to_thread(self.plan, text, "replace")
            for warning in plan["warnings"]:
                log.warning("SIGHUP: %s: %s", path, warning)
            if not plan["changed"]:
                log.info("SIGHUP: %s is unchanged; %s", path, keeps)
                return
            status, body = await self.apply(text, "replace", f'"{sha256(raw)}"')
        except ConfigRefused as err:
            log.error("SIGHUP: %s was not applied: %s: %s; %s", path, err.code, err.message, keeps)
            return
        if status == 200:
            log.info("SIGHUP: %s applied: config version %d is active", path, self.config_version)
        elif status == 202:
            log.info(
                "SIGHUP: %s applied: config version %d is being activated while config "
                "version %d serves (its outcome is logged; /api/v1/config/hash shows it)",
                path,
                serving + 1,
                serving,
            )
        else:
            error = (body.get("last_rejection") or {}).get("error", "")
            log.error("SIGHUP: %s was not activated: %s; %s", path, error, keeps)

    async def close(self) -> None:
        """Cancel an activation still preparing, end the retirements now and stop the
        workers they were waiting to stop (the frontend is shutting down: its listeners
        drained already)."""
        activation = self.activation
        if activation is not None and activation.task is not None and not activation.task.done():
            activation.task.cancel()
            await asyncio.gather(activation.task, return_exceptions=True)
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for generation, dropped in self._to_stop:  # cancelled while their requests drained
            await generation.stop(dropped)
        self._to_stop.clear()
