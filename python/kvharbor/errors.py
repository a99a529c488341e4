"""Exceptions of the kvharbor Python client.

Every failure is a KvHarborError carrying the daemon's (or the SDK's) status
code, the gRPC / absl.StatusCode number, and its message, which for bad input
names the offending field. Subclasses per code also derive from the matching
built-in exception, so ``except ValueError`` catches INVALID_ARGUMENT.
"""

import enum


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class KvHarborError(Exception):
    """A failed call: ``code`` (StatusCode) and ``message``."""

    code = StatusCode.UNKNOWN

    def __init__(self, code, message):
        try:
            code = StatusCode(code)
        except ValueError:
            code = StatusCode.UNKNOWN
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgumentError(KvHarborError, ValueError):
    pass


class DeadlineExceededError(KvHarborError, TimeoutError):
    pass


class NotFoundError(KvHarborError, LookupError):
    pass


class AlreadyExistsError(KvHarborError):
    pass


class ResourceExhaustedError(KvHarborError):
    pass


class FailedPreconditionError(KvHarborError):
    pass


class OutOfRangeError(KvHarborError, IndexError):
    pass


class UnimplementedError(KvHarborError, NotImplementedError):
    pass


class UnavailableError(KvHarborError, ConnectionError):
    pass


class DataLossError(KvHarborError):
    pass


class PermissionDeniedError(KvHarborError, PermissionError):
    """The token's role may not make this call (docs/operations.md)."""


class UnauthenticatedError(KvHarborError):
    """No bearer token, a malformed one, or one the daemon does not know."""


_BY_CODE = {
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.OUT_OF_RANGE: OutOfRangeError,
    StatusCode.UNIMPLEMENTED: UnimplementedError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.DATA_LOSS: DataLossError,
    StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def error_for(code, message):
    """The KvHarborError subclass instance for ``code``."""
    try:
        cls = _BY_CODE.get(StatusCode(code), KvHarborError)
    except ValueError:
        cls = KvHarborError
    return cls(code, message)


def invalid(field, what):
    """INVALID_ARGUMENT raised by the Python side, naming ``field``."""
    return InvalidArgumentError(StatusCode.INVALID_ARGUMENT, f"{field}: {what}")
