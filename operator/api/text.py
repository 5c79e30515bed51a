"""Strings that end up in commands, labels, logs and mount paths: printable text, confined paths, image references, bounded durations.

A PDDeployment's free-text fields are copied into engine commands (``--served-model-name``,
extra flags), environments, log lines and mount paths. This module holds the rules that
keep a hostile value out, written once as patterns that mean the same in the three
places they run: the API server (Go's RE2, the CRD's ``pattern``), pydantic (Rust's regex
crate) and ``api/structural.py`` (google-re2). So they use only what the three share:
``\\x{...}`` escapes, explicit ASCII classes (``[A-Za-z0-9_]``, never ``\\w`` or ``\\d``,
which are Unicode classes in Rust), no look-around.

- printable text: no C0 controls (NUL, ESC, newline ...), no DEL or C1 controls, no
  bidirectional overrides/isolates/marks (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
  U+061C) that make a log line or a command read differently from what runs (Trojan
  Source, CVE-2021-42574), no line/paragraph separators (U+2028, U+2029);
- a path inside a volume: absolute, normalised (no empty, ``.`` or ``..`` segment), so it
  cannot leave the volume it is mounted from;
- an image reference: the OCI/Docker reference grammar of github.com/distribution/reference
  (the grammar kubelet and container runtimes parse images with), taken from
  docker-image-py's regexp module, a maintained port of it;
- a duration: at most ``MAX_DURATION`` (2^31-1 seconds), the largest value Kubernetes'
  int32 seconds fields take (a Deployment's ``progressDeadlineSeconds``).
"""

from __future__ import annotations

from docker_image import reference as docker_reference
from docker_image import regexp as docker_regexp

#: The characters printable text refuses, as the body of a regex character class.
_CONTROLS = r"\x{0000}-\x{001f}\x{007f}-\x{009f}"
_BIDI_AND_SEPARATORS = r"\x{061c}\x{200e}\x{200f}\x{2028}\x{2029}\x{202a}-\x{202e}\x{2066}-\x{2069}"
#: One line of printable text (names, flags, image-like values).
PRINTABLE_PATTERN = rf"^[^{_CONTROLS}{_BIDI_AND_SEPARATORS}]*$"
#: Printable text that may span lines (environment values such as a PEM block): tab and
#: newline allowed, every other control refused (a carriage return rewrites a log line).
PRINTABLE_LINES_PATTERN = rf"^[^\x{{0000}}-\x{{0008}}\x{{000b}}-\x{{001f}}\x{{007f}}-\x{{009f}}{_BIDI_AND_SEPARATORS}]*$"

PRINTABLE_FORM = ("printable text: no control characters (NUL, ESC, newline, DEL, C1), no bidirectional "
                  "overrides, isolates or marks (U+202A-U+202E, U+2066-U+2069, U+200E/F, U+061C) and no "
                  "U+2028/U+2029")
PRINTABLE_LINES_FORM = ("printable text (tab and newline allowed): no other control characters (NUL, ESC, "
                        "carriage return, DEL, C1), no bidirectional overrides, isolates or marks")

#: One path segment that is neither ``.`` nor ``..`` (``...`` is a name), of printable characters.
_SEGMENT_CHAR = rf"[^/{_CONTROLS}{_BIDI_AND_SEPARATORS}]"
_NOT_DOT = rf"[^./{_CONTROLS}{_BIDI_AND_SEPARATORS}]"
_SEGMENT = rf"(?:{_SEGMENT_CHAR}*{_NOT_DOT}{_SEGMENT_CHAR}*|\.\.\.+)"
#: An absolute, normalised path inside a volume: ``/`` or ``/a/b`` (a final ``/`` allowed).
VOLUME_PATH_PATTERN = rf"^(?:/|(?:/{_SEGMENT})+/?)$"
VOLUME_PATH_FORM = ("an absolute path inside the volume, e.g. /DeepSeek-V4.1-Flash: starts with '/', no '..' "
                    "or '.' segment and no '//' (it cannot leave the volume), printable characters only")
VOLUME_PATH_MAX = 1024


def _portable(pattern: str) -> str:
    """A docker-image-py (Python ``regex``, ASCII mode) pattern in the dialect RE2, Go and
    Rust share: ``\\w`` spelled as its ASCII class (Go's and ASCII-mode ``regex``'s
    meaning), inside a bracket expression as its ranges."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        two = pattern[i:i + 2]
        if two == r"\w":
            out.append("A-Za-z0-9_" if in_class else "[A-Za-z0-9_]")
            i += 2
            continue
        if pattern[i] == "\\":
            out.append(two)
            i += 2
            continue
        if pattern.startswith("[[:", i):  # a POSIX class inside a bracket expression
            end = pattern.index(":]", i) + 2
            out.append(pattern[i:end])
            in_class = True
            i = end
            continue
        if pattern[i] == "[" and not in_class:
            in_class = True
        elif pattern[i] == "]" and in_class:
            in_class = False
        out.append(pattern[i])
        i += 1
    return "".join(out)


#: The whole reference grammar (name[:tag][@digest]), anchored; reference.ReferenceRegexp.
IMAGE_PATTERN = _portable(docker_regexp.REFERENCE_PAT)
IMAGE_FORM = ("an image reference [registry[:port]/]name[:tag][@digest], e.g. lmsysorg/sglang:v0.5.23-cu130: "
              "lower-case path components, no spaces")
#: Longest image reference: a 255-character name (NameTotalLengthMax) with a registry,
#: a 128-character tag and a sha512 digest fit well under it.
IMAGE_MAX = 512


def image_reference_problem(image: str) -> str | None:
    """Why ``image`` is not an image reference kubelet can pull, or None when it is.

    Parsed as kubelet does (github.com/distribution/reference ``ParseNormalizedNamed``,
    here docker-image-py's port ``Reference.parse_normalized_named``): the grammar, lower-case
    repository, a name of at most 255 characters, not a bare 64-hex identifier, a valid digest.
    """
    try:
        docker_reference.Reference.parse_normalized_named(image)
    except Exception as e:  # InvalidReference and its subclasses; the library raises plain ones too
        return str(e) or type(e).__name__
    return None


def check_image(image: str) -> str:
    """``image`` unchanged when it parses (:func:`image_reference_problem`); raises ValueError saying why not."""
    why = image_reference_problem(image)
    if why is not None:
        raise ValueError(f"{image!r} is not an image reference ({why}); write {IMAGE_FORM}")
    return image


def confined_path_problem(path: str) -> str | None:
    """Why ``path`` could leave its volume or is not normalised, or None when it is fine
    (the same rule as :data:`VOLUME_PATH_PATTERN`, in words)."""
    if not path.startswith("/"):
        return "it is not absolute (start it with '/')"
    if path == "/":
        return None
    parts = path[1:].split("/")
    if len(parts) > 1 and parts[-1] == "":  # one final '/' is allowed
        parts.pop()
    if ".." in parts:
        return "a '..' segment would leave the volume"
    if "." in parts or "" in parts:
        return "it is not normalised (no '.' segment, no '//')"
    return None


#: 2^31-1 seconds, the largest value of Kubernetes' int32 seconds fields (a Deployment's
#: progressDeadlineSeconds, the one a duration of ours is rendered into), as a Go duration.
MAX_DURATION_SECONDS = 2**31 - 1
MAX_DURATION = "596523h14m7s"
DURATION_MAX_LENGTH = 64
