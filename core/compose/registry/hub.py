"""The Hugging Face Hub and its cache, through ``huggingface_hub``.

Only allow-listed files are fetched, always at a 40-hex commit, into the
cache directory (``--cache-dir``, default ``HF_HUB_CACHE``). The token is
whatever ``huggingface_hub`` finds itself (``HF_TOKEN`` or the token file):
it is never passed here, never taken from the command line and never
written to a message. Failures become :class:`~vllm_srun.errors.LoadError`
with the operator phrase first: ``access denied, gated or private`` (401,
403, gated or private repositories; final), an interrupted download or an
unreachable Hub (``retryable``), an offline start without the files in the
cache (final).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vllm_srun.errors import LoadError

DEFAULT_ALLOW_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.onnx",
    "*.onnx_data",
    "*.onnx.data",
    "vocab.txt",
    "merges.txt",
    "*.model",
)
"""What a Hub repository that is not built in may download: configuration, tokenizer,
safetensors weights and ONNX graphs. Never pickles (``*.bin``, ``*.pt``) or code."""

OFFLINE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})
"""``HF_HUB_OFFLINE`` values that turn downloads off (as ``huggingface_hub`` reads them)."""


def offline_reason(offline: bool) -> str | None:
    """Why downloads are off (``--offline`` or ``HF_HUB_OFFLINE=1``), or ``None`` when on.

    The environment is read at call time, so a variable set after import counts.
    """
    if offline:
        return "--offline"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in OFFLINE_VALUES:
        return "HF_HUB_OFFLINE=1"
    return None


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The Hugging Face cache directory: ``cache_dir``, else ``HF_HUB_CACHE``'s value."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def repo_folder(cache_dir: str | os.PathLike[str] | None, repo: str) -> Path:
    """A model repository's folder in the cache: ``<cache>/models--owner--name``."""
    return cache_root(cache_dir) / ("models--" + repo.replace("/", "--"))


def cached_files(
    repo: str, revision: str, files: Sequence[str], cache_dir: str | os.PathLike[str] | None
) -> Path | None:
    """The cached snapshot folder of ``repo`` at ``revision`` when it holds every file in
    ``files``; ``None`` when any is missing (no network is used)."""
    from huggingface_hub import try_to_load_from_cache

    snapshot = repo_folder(cache_dir, repo) / "snapshots" / revision
    for name in files:
        found = try_to_load_from_cache(
            repo, name, cache_dir=str(cache_root(cache_dir)), revision=revision
        )
        if not isinstance(found, str):
            return None
    return snapshot if snapshot.is_dir() else None


def download(
    repo: str,
    revision: str,
    *,
    allow_patterns: Sequence[str],
    cache_dir: str | os.PathLike[str] | None,
    offline: bool = False,
) -> Path:
    """Fetch the allow-listed files of ``repo`` at ``revision`` into the cache.

    Args:
        repo: ``owner/name``.
        revision: a 40-hex commit.
        allow_patterns: file names or glob patterns to fetch (nothing else is).
        cache_dir: the cache directory (``None``: ``HF_HUB_CACHE``).
        offline: ``--offline``; ``HF_HUB_OFFLINE=1`` counts too.

    Returns:
        The snapshot folder (``<cache>/models--owner--name/snapshots/<revision>``).

    Raises:
        LoadError: see :func:`hub_error`.
    """
    from huggingface_hub import snapshot_download

    reason = offline_reason(offline)
    try:
        folder = snapshot_download(
            repo,
            revision=revision,
            cache_dir=str(cache_root(cache_dir)),
            allow_patterns=list(allow_patterns),
            local_files_only=reason is not None,
        )
    except Exception as err:
        raise hub_error(err, repo, revision, cache_dir, reason) from err
    return Path(folder)


def hub_error(
    err: BaseException,
    repo: str,
    revision: str,
    cache_dir: str | os.PathLike[str] | None,
    offline: str | None,
) -> LoadError:
    """The :class:`LoadError` of a ``huggingface_hub`` failure.

    - 401/403, ``GatedRepoError``, ``RepositoryNotFoundError`` (the Hub answers
      401 for private repositories): ``access denied, gated or private`` (final);
    - ``RevisionNotFoundError``: the commit does not exist (final);
    - offline (``offline`` names why) and not cached: final, with the command
      that fills the cache;
    - a connection error, a timeout, a 5xx or 429 answer, a broken transfer or
      a disk error: ``download interrupted`` (``retryable=True``).
    """
    from huggingface_hub import errors

    cache = cache_root(cache_dir)
    label = f"{repo} at {revision}"
    status = _status(err)
    if isinstance(err, errors.GatedRepoError | errors.RepositoryNotFoundError) or status in (
        401,
        403,
    ):
        return LoadError(
            f"access denied, gated or private: the Hub refused {repo}"
            f"{f' (HTTP {status})' if status else ''}. Log in with `hf auth login` or set "
            "HF_TOKEN for an account that has access (for a gated model, accept its terms on "
            "its Hub page first); the token is read from HF_TOKEN or the token file, never "
            "from the command line"
        )
    if isinstance(err, errors.RevisionNotFoundError):
        return LoadError(
            f"revision {revision} of {repo} does not exist on the Hub: use a full commit "
            "hash from the repository's history"
        )
    if offline is not None and isinstance(
        err, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled
    ):
        return LoadError(
            f"{label} is not in the Hugging Face cache at {cache}, and downloads are off "
            f"({offline}). Fill the cache first (hf download {repo} --revision {revision} "
            f"--cache-dir {cache}), point --cache-dir at a cache that holds it, or start "
            "without --offline and HF_HUB_OFFLINE"
        )
    if isinstance(err, errors.EntryNotFoundError) and not isinstance(
        err, errors.LocalEntryNotFoundError
    ):
        return LoadError(f"{label} lacks a file the model needs: {_summary(err)}")
    if status is not None and 400 <= status < 500 and status != 429:
        return LoadError(f"the Hub refused {label} (HTTP {status}): {_summary(err)}")
    return LoadError(
        f"download interrupted: {label} could not be fetched from the Hub ({_summary(err)}). "
        "The next attempt resumes from the cache; check the network and HF_ENDPOINT, or copy "
        f"the model into {cache} and start with --offline",
        retryable=True,
    )


def _status(err: BaseException) -> int | None:
    """The HTTP status of ``err`` or of the error it was raised from (huggingface_hub
    turns a 403 into ``LocalEntryNotFoundError`` raised from the HTTP error)."""
    seen = 0
    current: BaseException | None = err
    while current is not None and seen < 5:
        response = getattr(current, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            return code
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _summary(err: BaseException) -> str:
    """``Type: first line`` of an error, at most 200 characters (no headers, no token)."""
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__
