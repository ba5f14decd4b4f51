"""The one refusal of ``--target kubernetes``: :class:`TargetError`, with a code."""

from __future__ import annotations


class TargetError(Exception):
    """The overlay cannot be written as asked; the message says why and what to do.

    Attributes:
        code: ``bad_flag``, ``bad_model``, ``unknown_model`` (a built-in model
            misspelt), ``unpinned_model``, ``local_model``, ``model_not_found``,
            ``overlay_exists``, ``not_our_overlay``, ``overlap``, ``no_manifests``,
            ``incomplete_manifests``, ``bad_output``, ``file_name_too_long``,
            ``output_under_file``, ``dangling_symlink``, ``unwritable_output``,
            ``write_failed``; every one exits 1.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
