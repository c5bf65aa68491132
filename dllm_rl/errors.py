"""Errors every layer may raise: a config problem names its key."""

from __future__ import annotations

import errno
import re


class ConfigError(ValueError):
  """A config problem; the message starts with the offending key (``config.<key>``), or with
  the command-line flag or argument (a ``key`` such as ``--workdir`` or ``RUN_DIR``)."""

  def __init__(self, key: str, message: str):
    self.key, self.message = key, message
    flag = key.startswith("--") or key.isupper()
    super().__init__(f"{key if flag else f'config.{key}'}: {message}")


class ConfigErrors(ConfigError):
  """Several config problems at once; ``errors`` lists them, ``key`` is the first one's."""

  def __init__(self, errors: list[ConfigError]):
    self.errors = list(errors)
    self.key = errors[0].key
    self.message = "\n".join(str(e) for e in errors)
    ValueError.__init__(self, self.message)


def each(err: ConfigError) -> list[ConfigError]:
  """The problems ``err`` stands for: a ConfigErrors' list, else ``err`` alone (the inverse of
  :func:`raise_all`)."""
  return getattr(err, "errors", None) or [err]


def raise_all(errors: list[ConfigError]) -> None:
  """Raise the one error, or a ConfigErrors listing them all; nothing when empty."""
  if len(errors) == 1:
    raise errors[0]
  if errors:
    raise ConfigErrors(errors)


# Orbax's wrapper of a failed array read: its spec (kilobytes) follows, tensorstore's own
# error (the file and what is wrong with it) is the exception's cause.
_TENSORSTORE_SPEC = " See full TensorStore details"


def short_reason(err: BaseException, limit: int = 200) -> str:
  """``err`` in one short line: its type and the start of its first line (a tensorstore
  error's first line carries kilobytes of JSON spec; a network stack's, a page). Orbax's
  "Encountered error while reading array index" is cut before its spec and followed by its
  cause's reason, which names the file and the damage."""
  text = str(err).splitlines()[0] if str(err) else ""
  cause = ""
  if _TENSORSTORE_SPEC in text:
    text = text[:text.index(_TENSORSTORE_SPEC)]
    if err.__cause__ is not None and err.__cause__ is not err:
      cause = f" ({short_reason(err.__cause__, limit)})"
  return f"{type(err).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}{cause}"


# What a write the disk or the folder refused raises: full, over quota, a file-size limit,
# a folder remounted read-only; no rights.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
RIGHTS_ERRNOS = (errno.EACCES, errno.EPERM)
REFUSED_WRITE_ERRNOS = DISK_ERRNOS + RIGHTS_ERRNOS
# tensorstore's errors end with the OS error's number: "... No space left on device
# [os_error_code='28']"
_TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")


def refused_errno(err: BaseException) -> int | None:
  """The errno of a write the disk or the folder refused (`REFUSED_WRITE_ERRNOS`) that ``err``
  itself is, not its cause or context: an OSError, or tensorstore's ValueError naming the OS
  error; None for anything else."""
  code = err.errno if isinstance(err, OSError) else None
  if code is None and isinstance(err, ValueError):
    found = _TENSORSTORE_ERRNO.search(str(err))
    code = int(found.group(1)) if found else None
  return code if code in REFUSED_WRITE_ERRNOS else None


def refused_write(err: BaseException | None) -> int | None:
  """:func:`refused_errno` of ``err``, else of its cause or its context (the first that is a
  refused write, down the chain); None for anything else."""
  seen: set[int] = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if (code := refused_errno(err)) is not None:
      return code
    err = err.__cause__ or err.__context__
  return None
