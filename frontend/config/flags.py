"""What ``vllm-sr serve`` flags write into the configuration (upstream's
``apply_instance_options``).

The flags never keep a state of their own: ``MODEL`` replaces the artifact of the
default decision deployment (``primary`` unless ``system.decision_model`` names
another), ``-dp`` and ``--device-ids`` write its ``replicas``, the engine flags its
engine arguments, ``--runtime-profile`` and ``--systemone-schema`` its ``profile`` and
``systemone_schema``, and a fresh Engine-mode setup gets a listener that publishes it.
:func:`apply_serve_options` returns the new document; :func:`~.schema.parse_config`
then checks it like any other.

Why one module of 400-odd lines: it is one translation, the serve flags (and
``VLLM_SR_PORT_OFFSET``) into the document, each flag's check beside the write it guards
and every refusal a :class:`FlagError` in upstream's words before the schema sees the
result; apart, a check and its write could disagree about a flag.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .schema import (
    DEFAULT_DECISION_DEPLOYMENT,
    DEFAULT_MODEL,
    DEVICE,
    DEVICE_MESSAGE,
    HUB_ID,
    SYSTEMONE_SCHEMAS,
    is_local_artifact,
)

PLATFORMS = {"cpu": "cpu", "amd": "rocm", "rocm": "rocm", "nvidia": "cuda", "cuda": "cuda"}
"""``--platform`` spellings and the accelerator each means (the deployment guide says
``rocm|cuda``, the command reference ``amd|nvidia``: both are accepted)."""

GPU_VENDORS = {"rocm": ("amd", "AMD"), "cuda": ("nvidia", "NVIDIA")}
"""Per GPU accelerator: its ``--platform`` name and its vendor, as messages name them."""

BOOTSTRAP_ADDRESS = "127.0.0.1"
"""Where the listener a fresh setup gets binds: this machine only (a config may say
``0.0.0.0``)."""

BOOTSTRAP_PORT = 8899
"""Its port before ``VLLM_SR_PORT_OFFSET``."""


def bootstrap_listener(port: int) -> str:
    """The name of the listener a fresh setup gets on ``port``: ``http-8899``, or with
    ``VLLM_SR_PORT_OFFSET`` the port it binds (``http-8999`` with an offset of 100)."""
    return f"http-{port}"


ENGINE_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "batch_window_ms",
    "dtype",
    "enable_shared_context",
)
"""Serve flags that are engine arguments of the default deployment."""


class FlagError(Exception):
    """Serve flags that cannot be applied; the message says which and what to do."""


@dataclass
class ServeOptions:
    """The ``vllm-sr serve`` flags that change the configuration.

    Attributes:
        model: ``MODEL``: a Hub repository, or a local package directory.
        engine: ``-e``: start Engine mode.
        replicas: ``-dp N``.
        device_ids: ``--device-ids`` as given (``"0,1"``).
        platform: ``--platform`` (``cpu``, ``amd``/``rocm``, ``nvidia``/``cuda``).
        device: ``--device``.
        revision: ``--revision``.
        profile: ``--runtime-profile``.
        systemone_schema: ``--systemone-schema`` (one of
            :data:`~.schema.SYSTEMONE_SCHEMAS`).
        engine_args: the engine flags given (``max_num_seqs`` ...), by models-file key.
    """

    model: str | None = None
    engine: bool = True
    replicas: int | None = None
    device_ids: str | None = None
    platform: str = "cpu"
    device: str | None = None
    revision: str | None = None
    profile: str | None = None
    systemone_schema: str | None = None
    engine_args: dict[str, Any] | None = None

    @property
    def accelerator(self) -> str:
        """The platform as an accelerator name (``cpu``, ``rocm`` or ``cuda``)."""
        return PLATFORMS[self.platform]

    def model_options(self) -> bool:
        """Whether any flag changes the default deployment's model or engine."""
        return bool(
            self.model is not None
            or self.revision is not None
            or self.profile is not None
            or self.systemone_schema is not None
            or self.device is not None
            or self.engine_args
        )


def host_has_gpu(accelerator: str) -> bool:
    """Whether this host shows devices of ``accelerator``: ``/dev/kfd`` and ``/dev/dri``
    (AMD), ``/dev/nvidiactl`` or ``nvidia-smi`` (NVIDIA)."""
    if accelerator == "rocm":
        return Path("/dev/kfd").exists() and Path("/dev/dri").exists()
    if accelerator == "cuda":
        return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None
    return True


def check_model(model: str) -> str:
    """``MODEL`` as the artifact it names: an existing directory becomes its absolute path.

    Raises:
        FlagError: a blank or untrimmed MODEL.
    """
    if not model or model != model.strip():
        raise FlagError("MODEL must be a non-empty, trimmed artifact")
    local = model.startswith(("/", ".", "~")) or not HUB_ID.match(model)
    if local and Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    return model


def check_device(device: str, platform: str) -> None:
    """Refuse a ``--device`` the platform does not run.

    Raises:
        FlagError: upstream's messages: ``--device rocm:0 needs --platform amd, whose
            image runs rocm``, the mps and xpu refusals, or a malformed device.
    """
    if not DEVICE.match(device):
        raise FlagError(f"--device {device}: {DEVICE_MESSAGE}")
    name = device.split(":", 1)[0]
    accelerator = PLATFORMS[platform]
    if name in GPU_VENDORS and accelerator != name:
        raise FlagError(
            f"--device {device} needs --platform {GPU_VENDORS[name][0]}, whose image runs {name}"
        )
    if name == "mps":
        raise FlagError(
            "mps needs macOS's Metal, which no Linux container gets; engine mode runs on the "
            "CPU there"
        )
    if name == "xpu":
        raise FlagError(
            "no router image runs xpu; use cpu, or rocm or cuda with --platform amd or nvidia"
        )


def parse_device_ids(text: str, replicas: int | None, platform: str) -> list[int]:
    """``--device-ids`` as GPU indices, checked against ``-dp`` and the platform.

    Raises:
        FlagError: upstream's messages for a malformed, repeated or miscounted list,
            or a platform without GPUs.
    """
    parts = text.split(",")
    if not all(re.fullmatch(r"[0-9]+", p.strip()) for p in parts):
        raise FlagError("--device-ids must be comma-separated non-negative GPU indices")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise FlagError("--device-ids must be unique; use -dp to repeat workers on one GPU")
    if replicas is not None and len(ids) not in (1, replicas):
        raise FlagError(
            "--device-ids needs one GPU index or one index per replica; set -dp explicitly"
        )
    if PLATFORMS[platform] not in GPU_VENDORS:
        raise FlagError("--device-ids requires a cuda or rocm execution platform")
    return ids


def _mapping(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]`` as a mapping, created when missing (a non-mapping is left for the
    schema to refuse, and a fresh mapping is used here)."""
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _attached(resource: dict[str, Any]) -> bool:
    replicas = resource.get("replicas")
    listed = replicas if isinstance(replicas, list) else []
    return bool(resource.get("endpoint")) or any(
        isinstance(r, dict) and r.get("endpoint") for r in listed
    )


def apply_serve_options(
    document: dict[str, Any] | None,
    options: ServeOptions,
    *,
    bootstrap: bool,
    listener_port: int = BOOTSTRAP_PORT,
    gpu_count: Callable[[str], int] | None = None,
    host_gpu: Callable[[str], bool] = host_has_gpu,
) -> dict[str, Any]:
    """The configuration document ``options`` make of ``document`` (which is not changed).

    Args:
        document: the ``--config`` document, or ``None`` without one.
        options: the serve flags.
        bootstrap: a fresh setup (no ``--config`` listeners): in Engine mode it gets the
            ``http-8899`` listener publishing the default deployment, on 127.0.0.1.
        listener_port: that listener's port (8899 plus ``VLLM_SR_PORT_OFFSET``; the
            listener is named after it).
        gpu_count: how many GPUs of an accelerator this host has (for ``-dp N`` without
            ``--device-ids`` on a GPU platform); ``None`` counts none.
        host_gpu: whether the host shows devices of an accelerator (the decision
            deployment's GPU check).

    Raises:
        FlagError: a flag that cannot apply, with upstream's message.
    """
    doc: dict[str, Any] = copy.deepcopy(document) if document else {}
    platform = options.platform
    if platform not in PLATFORMS:
        raise FlagError(f"--platform must be one of {', '.join(PLATFORMS)}")
    accelerator = PLATFORMS[platform]
    ids = (
        parse_device_ids(options.device_ids, options.replicas, platform)
        if options.device_ids is not None
        else None
    )
    if options.replicas is not None and options.replicas < 1:
        raise FlagError("-dp must be a positive number of workers")
    if options.device is not None:
        check_device(options.device, platform)
        if ids is not None:
            raise FlagError("--device and --device-ids both place the workers; give one of them")
    model = check_model(options.model) if options.model is not None else None
    if options.systemone_schema is not None and options.systemone_schema not in SYSTEMONE_SCHEMAS:
        raise FlagError(
            f"--systemone-schema must be one of {', '.join(SYSTEMONE_SCHEMAS)}, "
            f"not {options.systemone_schema!r}"
        )

    glob = _mapping(doc, "global")
    router = glob.get("router")
    if options.engine or (isinstance(router, dict) and router.get("enabled") is False):
        _mapping(glob, "router")["enabled"] = not options.engine

    catalog = _mapping(glob, "model_catalog")
    system = catalog.get("system")
    chosen = system.get("decision_model") if isinstance(system, dict) else None
    key = DEFAULT_DECISION_DEPLOYMENT
    if isinstance(chosen, dict) and isinstance(chosen.get("deployment"), str):
        key = chosen["deployment"]
    deployments = _mapping(catalog, "deployments")
    authored = isinstance(deployments.get(key), dict)
    resize = options.replicas is not None or ids is not None
    if options.model_options() or resize or not authored:
        resource: dict[str, Any] = (
            deployments[key]
            if authored
            else {"provider": "model_runtime", "artifact": DEFAULT_MODEL, "device": "auto"}
        )
        if authored and _attached(resource):
            if resize:
                raise FlagError(
                    "Attached deployments cannot be resized with serve flags; edit their "
                    "endpoints in --config"
                )
            if options.model_options():
                raise FlagError(
                    "serve model overrides require a managed default deployment; attached "
                    "endpoints belong in --config"
                )
        _apply_model(resource, options, model)
        if resize:
            _apply_placements(resource, options, ids, authored, accelerator, gpu_count)
        deployments[key] = resource
    system = _mapping(catalog, "system")
    system["decision_model"] = {"deployment": key}

    if bootstrap and options.engine and "listeners" not in doc:
        resource = deployments[key]
        public = resource.get("public_name") or (
            resource.get("artifact")
            if isinstance(resource.get("artifact"), str)
            and not is_local_artifact(resource["artifact"])
            else None
        )
        if not public:
            raise FlagError("A local MODEL needs an explicit public_name in --config")
        doc["listeners"] = [
            {
                "name": bootstrap_listener(listener_port),
                "address": BOOTSTRAP_ADDRESS,
                "port": listener_port,
                "systemone": {"models": [public]},
            }
        ]
    _check_decision_gpu(deployments.get(key), accelerator, host_gpu)
    return doc


def _apply_model(resource: dict[str, Any], options: ServeOptions, model: str | None) -> None:
    if model is not None:
        if resource.get("artifact") != model:
            resource.pop("revision", None)
        resource["artifact"] = model
    if options.revision is not None:
        resource["revision"] = options.revision
    if options.profile is not None:
        resource["profile"] = options.profile
    if options.systemone_schema is not None:
        resource["systemone_schema"] = options.systemone_schema
    if options.device is not None:
        replicas = resource.get("replicas")
        if isinstance(replicas, list) and replicas:
            for replica in replicas:
                if isinstance(replica, dict) and not replica.get("endpoint"):
                    replica["device"] = options.device
        else:
            resource["device"] = options.device
    for name, value in (options.engine_args or {}).items():
        resource[name] = value


def _apply_placements(
    resource: dict[str, Any],
    options: ServeOptions,
    ids: list[int] | None,
    authored: bool,
    accelerator: str,
    gpu_count: Callable[[str], int] | None,
) -> None:
    count = options.replicas if options.replicas is not None else len(ids or [1])
    placements: list[dict[str, Any]]
    if ids is not None:
        placements = [{"device": f"{accelerator}:{ids[i % len(ids)]}"} for i in range(count)]
    else:
        replicas = resource.get("replicas")
        existing: list[dict[str, Any]] = []
        if authored and isinstance(replicas, list) and replicas:
            existing = [dict(r) if isinstance(r, dict) else {} for r in replicas]
        elif authored and resource.get("device") and options.device is None:
            existing = [{"device": resource["device"]}]
        if existing:
            placements = [dict(existing[i % len(existing)]) for i in range(count)]
        else:
            device = options.device or resource.get("device") or "auto"
            gpu = accelerator if accelerator in GPU_VENDORS else device.split(":", 1)[0]
            if gpu in GPU_VENDORS and count > 1:
                available = gpu_count(gpu) if gpu_count is not None else 0
                if available < count:
                    raise FlagError(
                        f"-dp {count} requires {count} available GPUs; use --device-ids "
                        "explicitly to share a GPU"
                    )
                placements = [{"device": f"{gpu}:{i}"} for i in range(count)]
            else:
                placements = [{"device": device} for _ in range(count)]
    resource["replicas"] = placements
    for key in ("device", "endpoint", "served_name"):
        resource.pop(key, None)


def _check_decision_gpu(resource: Any, accelerator: str, host_gpu: Callable[[str], bool]) -> None:
    """A decision deployment placed on a GPU needs that platform, and the host its devices."""
    if not isinstance(resource, dict):
        return
    devices = []
    if isinstance(resource.get("device"), str):
        devices.append(resource["device"])
    for replica in resource.get("replicas") or ():
        if isinstance(replica, dict) and isinstance(replica.get("device"), str):
            devices.append(replica["device"])
    for device in devices:
        name = device.split(":", 1)[0]
        if name not in GPU_VENDORS:
            continue
        platform, vendor = GPU_VENDORS[name]
        if accelerator != name:
            raise FlagError(f"the decision deployment device {name} requires --platform {platform}")
        if not host_gpu(name):
            raise FlagError(
                f"the decision deployment device {name} requires a GPU, and this host shows no "
                f"{vendor} GPU devices"
            )


MAX_PORT_OFFSET = 65535 - 9190
"""The largest ``VLLM_SR_PORT_OFFSET``: the metrics port (9190, the highest default)
plus the offset must stay a TCP port."""


def port_offset(environ: dict[str, str] | None = None) -> int:
    """``VLLM_SR_PORT_OFFSET``: added to every port of the frontend: the management API
    (8080), the metrics (9190), the default listener (8899) and each configured listener
    (:func:`shift_listener_ports`); 0 when unset.

    Raises:
        FlagError: not a non-negative integer of ASCII digits, or one that moves the
            highest default port (the metrics' 9190) past 65535.
    """
    env = os.environ if environ is None else environ
    text = env.get("VLLM_SR_PORT_OFFSET", "").strip()
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()):
        raise FlagError(f"VLLM_SR_PORT_OFFSET must be a non-negative integer, not {text!r}")
    offset = int(text)
    if offset > MAX_PORT_OFFSET:
        raise FlagError(
            f"VLLM_SR_PORT_OFFSET {offset} moves the default ports past 65535 (9190 + offset); "
            f"give at most {MAX_PORT_OFFSET}"
        )
    return offset


def shift_listener_ports(document: dict[str, Any] | None, offset: int) -> dict[str, Any] | None:
    """``document`` (a copy) with ``offset`` (``VLLM_SR_PORT_OFFSET``) added to each
    listener's ``port``, so that one offset moves a whole frontend, as upstream's moves its
    stack's published ports; a port that is not a whole number is left for the schema to
    refuse.

    Raises:
        FlagError: the offset moves a listener's port past 65535.
    """
    if not document or not offset or not isinstance(document.get("listeners"), list):
        return document
    doc = copy.deepcopy(document)
    for index, listener in enumerate(doc["listeners"]):
        if not isinstance(listener, dict):
            continue
        port = listener.get("port")
        if not isinstance(port, int) or isinstance(port, bool):
            continue
        if port + offset > 65535:
            name = listener.get("name")
            where = f"listener {name}" if isinstance(name, str) else f"listeners[{index}]"
            raise FlagError(
                f"VLLM_SR_PORT_OFFSET {offset} moves {where} from port {port} to "
                f"{port + offset}, past 65535; give a smaller offset or a lower port"
            )
        listener["port"] = port + offset
    return doc
