"""The bounded document loader, where the package code has always imported it from.

It lives in `installer.node.documents` (files through `installer.node.files`), below every
room that reads a document: compat (check-pod's manifests) as much as packages and stages.
"""

from installer.node.documents import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    MAX_STRING_CHARS,
    DocumentError,
    read_document,
    read_file,
    read_yaml,
    show,
)

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "MAX_STRING_CHARS", "DocumentError",
           "read_document", "read_file", "read_yaml", "show"]
