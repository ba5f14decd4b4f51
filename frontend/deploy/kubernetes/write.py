"""Writing the overlay safely: the bases it uses copied under ``OUT/base`` (so
``kubectl kustomize OUT`` reads nothing outside ``OUT``) and checked complete, everything
written beside ``OUT`` and renamed into place, ``--force`` replacing only what an earlier
run wrote, and every :class:`OSError` told as the refusal that says the fix."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import tempfile
from pathlib import Path

import yaml

from ...config.schema import ConfigError, parse_config
from .errors import TargetError
from .overlay import ClusterOverlay

HEADER = "# Written by vllm-sr serve --target kubernetes"
"""The first words of every ``kustomization.yaml`` the command writes: ``--force``
replaces an overlay only when its ``kustomization.yaml`` starts with them."""

WRITTEN = ("kustomization.yaml", "namespace.yaml", "config.yaml", "base")
"""What the overlay consists of in its directory (``--force`` replaces exactly these and
leaves every other file there)."""


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the patches, the config) as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def shipped_manifests() -> Path:
    """The kustomize bases and overlays shipped with ``vllm-sr``: the package's
    ``manifests`` folder when installed from a wheel, else the source tree's
    ``deploy/kubernetes`` (an editable install; pyproject maps it into the wheel)."""
    packaged = Path(__file__).resolve().with_name("manifests")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"


def check_bases(root: Path, folders: list[str]) -> None:
    """Every file and folder each ``kustomization.yaml`` under ``root/folder`` lists
    (``resources``, the ConfigMap generators' ``files``, ``patches`` by ``path``) is
    there, each listed folder checked the same way.

    Raises:
        TargetError: ``incomplete_manifests``, naming what is missing.
    """
    seen: set[Path] = set()
    pending = [root / folder for folder in folders]
    while pending:
        folder = pending.pop()
        if folder in seen:
            continue
        seen.add(folder)
        where = folder / "kustomization.yaml"
        shown = where.relative_to(root)
        try:
            document = yaml.safe_load(where.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise TargetError(
                f"the bases are incomplete: {shown} cannot be read ({err}); pass --manifests "
                "DIR with complete bases (a vllm-srun checkout's deploy/kubernetes), or "
                "reinstall vllm-sr",
                "incomplete_manifests",
            ) from None
        listed: list[str] = []
        if isinstance(document, dict):
            listed += [r for r in document.get("resources") or [] if isinstance(r, str)]
            for generator in document.get("configMapGenerator") or []:
                for entry in (generator or {}).get("files") or []:
                    listed.append(str(entry).rpartition("=")[2])
            listed += [p["path"] for p in document.get("patches") or [] if "path" in (p or {})]
        for entry in listed:
            if "://" in entry:
                continue
            path = (folder / entry).resolve()
            if not path.is_relative_to(root.resolve()) or not path.exists():
                raise TargetError(
                    f"the bases are incomplete: {shown} lists {entry}, which is missing; pass "
                    "--manifests DIR with complete bases (a vllm-srun checkout's "
                    "deploy/kubernetes), or reinstall vllm-sr",
                    "incomplete_manifests",
                )
            if path.is_dir():
                pending.append(path)


def _os_error(err: OSError, output: str) -> TargetError:
    """An :class:`OSError` of writing ``output`` as the refusal that says the fix."""
    if err.errno == errno.ENAMETOOLONG:
        return TargetError(
            f"--output {output}: a file name is too long for this file system; give a "
            "shorter --output",
            "file_name_too_long",
        )
    if err.errno == errno.ENOTDIR:
        return TargetError(
            f"--output {output} is under a file, not a directory; give a directory path",
            "output_under_file",
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return TargetError(
            f"--output {output} cannot be written ({err.strerror}); give a directory you may "
            "write to",
            "unwritable_output",
        )
    return TargetError(
        f"--output {output} could not be written ({err.strerror or err}); fix that and run again",
        "write_failed",
    )


def write_overlay(
    overlay: ClusterOverlay,
    output: Path,
    manifests: Path | None = None,
    force: bool = False,
    shown: str | None = None,
) -> Path:
    """Write the overlay into ``output``: ``kustomization.yaml``, ``namespace.yaml`` (when
    it creates the namespace), the frontend's ``config.yaml`` and a copy of the bases it
    uses under ``base/`` (from ``manifests``, default :func:`shipped_manifests`); the
    ``kustomization.yaml`` written.

    Everything is written into a temporary directory beside ``output`` and renamed into
    place, so a failure leaves ``output`` as it was. ``force`` replaces only what an
    earlier run wrote there (:data:`WRITTEN`), and only when its ``kustomization.yaml``
    carries :data:`HEADER`.

    Args:
        shown: ``output`` as the user wrote it, for messages (default ``str(output)``).

    Raises:
        TargetError: see :meth:`TargetError.code`: ``overlay_exists``,
            ``not_our_overlay``, ``overlap``, ``no_manifests``, ``incomplete_manifests``
            and the write failures.
    """
    written_as = shown if shown is not None else str(output)
    source = manifests if manifests is not None else shipped_manifests()
    needed = (
        ["runtime", "frontend", f"overlays/{overlay.platform}"]
        if overlay.shared_runtime
        else ["frontend"]
    )
    for folder in needed:
        if not (source / folder / "kustomization.yaml").is_file():
            raise TargetError(
                f"no kustomize base at {source / folder}; pass --manifests DIR, a folder "
                "holding runtime/, frontend/ and overlays/<platform>/ (a vllm-srun "
                "checkout's deploy/kubernetes), or reinstall vllm-sr, which ships them",
                "no_manifests",
            )
    try:
        if output.is_symlink() and not output.exists():
            raise TargetError(
                f"--output {written_as} is a symbolic link to nothing; remove it or give "
                "another --output",
                "dangling_symlink",
            )
        target = Path(os.path.realpath(output))
        if manifests is not None:
            bases = Path(os.path.realpath(manifests))
            if target.is_relative_to(bases) or bases.is_relative_to(target):
                raise TargetError(
                    f"--output {written_as} and --manifests {manifests} overlap; write the "
                    "overlay outside the bases it copies",
                    "overlap",
                )
        above = next((p for p in target.parents if os.path.lexists(p)), None)
        if above is not None and not above.is_dir():
            raise _os_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), written_as)
        if target.exists() and not target.is_dir():
            raise TargetError(
                f"--output {written_as} is a file; give a directory", "overlay_exists"
            )
        existing = target.is_dir() and any(target.iterdir())
        if existing:
            if not force:
                raise TargetError(
                    f"{written_as} is not empty (an overlay written before?); pass --force to "
                    "replace the overlay there, or --output DIR for another directory",
                    "overlay_exists",
                )
            ours = target / "kustomization.yaml"
            if not ours.is_file() or not ours.read_text(errors="replace").startswith(HEADER):
                raise TargetError(
                    f"{written_as} holds files vllm-sr did not write (its kustomization.yaml "
                    "does not start with 'Written by vllm-sr'), so --force leaves it alone; "
                    "give an empty or new --output DIR",
                    "not_our_overlay",
                )
        config = overlay.frontend_config()
        try:
            parse_config(config, "config.yaml")
        except ConfigError as err:  # pragma: no cover - the flags are checked before
            raise TargetError(f"the frontend configuration is invalid: {err}", "bad_flag") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.", dir=target.parent))
        try:
            _write_files(overlay, fresh, source, needed, written_as)
            check_bases(fresh / "base", needed)
            if existing:
                _check_old_bases(target / "base", source, written_as)
            _move_into_place(fresh, target, existing)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    except OSError as err:
        raise _os_error(err, written_as) from None
    return output / "kustomization.yaml"


def _write_files(
    overlay: ClusterOverlay, folder: Path, source: Path, needed: list[str], shown: str
) -> None:
    for base in needed:
        shutil.copytree(source / base, folder / "base" / base)
    if overlay.create_namespace:
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": overlay.namespace},
        }
        (folder / "namespace.yaml").write_text(yaml.safe_dump(namespace, sort_keys=False))
    layout = (
        "the runtime Deployment model-runtime serves the models; the frontend attaches to it"
        if overlay.shared_runtime
        else "the router pod vllm-sr runs the models itself"
    )
    (folder / "config.yaml").write_text(
        f"# The frontend's configuration, written by vllm-sr serve --target kubernetes: "
        f"{layout}.\n" + yaml.dump(overlay.frontend_config(), Dumper=_Dumper, sort_keys=False)
    )
    images = overlay.images()
    pin_example = f"{images[-1]['name']}:TAG"
    (folder / "kustomization.yaml").write_text(
        f"{HEADER} (self-contained: the bases are under base/); render: kubectl kustomize "
        f"{shlex.quote(shown)}\n"
        + yaml.dump(overlay.kustomization(), Dumper=_Dumper, sort_keys=False)
        + "# The images the pods run. Pin a release: kustomize edit set image "
        f"{pin_example} (or change newTag here).\n"
        + yaml.dump({"images": images}, Dumper=_Dumper, sort_keys=False)
    )


def _check_old_bases(old: Path, source: Path, shown: str) -> None:
    """Refuse to replace an earlier overlay's ``base/`` holding a file that none of the
    bases has (one added by hand): ``--force`` deletes only what vllm-sr wrote.

    Raises:
        TargetError: ``not_our_overlay``, naming the file.
    """
    if not old.is_dir() or old.is_symlink():
        return
    for path in sorted(old.rglob("*")):
        relative = path.relative_to(old)
        if path.is_dir() and not path.is_symlink():
            continue
        if not (source / relative).is_file():
            raise TargetError(
                f"{os.path.join(shown, 'base', str(relative))} is not one of the bases vllm-sr "
                "writes, and --force replaces base/ whole; move it out of base/ and run again",
                "not_our_overlay",
            )


def _move_into_place(fresh: Path, target: Path, existing: bool) -> None:
    """Rename the overlay written in ``fresh`` into ``target``; an earlier overlay's files
    there (:data:`WRITTEN`) are moved aside first and put back if a rename fails."""
    if not existing:
        if target.is_dir():
            target.rmdir()
        os.rename(fresh, target)
        fresh.mkdir()  # for the caller's cleanup
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.old.", dir=target.parent))
    moved: list[str] = []
    placed: list[str] = []
    try:
        for name in WRITTEN:
            if os.path.lexists(target / name):
                os.rename(target / name, aside / name)
                moved.append(name)
        for name in WRITTEN:
            if os.path.lexists(fresh / name):
                os.rename(fresh / name, target / name)
                placed.append(name)
    except OSError:
        for name in placed:
            os.rename(target / name, fresh / name)
        for name in moved:
            os.rename(aside / name, target / name)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
