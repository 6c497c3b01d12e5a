"""Documents and the checks on them: models, schemas, numbered checks, the order lifecycle.

The bottom layer: pure functions and immutable values, no files, no network, no MCP. Every
other layer may import it; it imports none of them.

What the gateway uses of it is re-exported here, and the gateway imports only these names:
the errors it raises and maps to tool results, the models of orders, reports and call
records (and RFC 3339 time reading and writing), tool-name patterns and refs, the bounds on
untrusted input (:mod:`~awl.documents.limits`), the bounded JSON Schema validation it checks
upstream arguments and results with (:mod:`~awl.documents.bounded`), the terminal order
states and those work happens in, ``json_equal`` (JSON's equality, which the commit's report
check needs), JSON pointers (naming where a problem is; reading a ``$ref``'s value), and
``lazy_exports``, with which the gateway's package, like this one, loads a name's module on
first use.

The bounded validation loads the JSON Schema stack, so its names load on first use
(:mod:`~awl.documents.lazy`): a gateway whose upstream tools have no schemas never loads it.
"""

import typing

from awl._version import __version__ as RELEASE
from awl.documents.checks import json_equal
from awl.documents.errors import (
    AWLError,
    BadRequest,
    Conflict,
    DocumentError,
    InvalidTransition,
    NotFound,
    PassError,
    StoreUnavailable,
    debugging,
    print_debug,
)
from awl.documents.lazy import lazy_exports
from awl.documents.lifecycle import TERMINAL, WORKING
from awl.documents.limits import (
    INT64_MAX,
    MAX_CONTENT_BLOCKS,
    check_integer,
    check_json_value,
    escapes_nothing,
    is_finite_number,
    loads,
    read_regular_file,
    show_value,
)
from awl.documents.models import (
    CallOutcome,
    CallRecord,
    Grant,
    WorkOrder,
    WorkReport,
    format_time,
    parse_time,
    utc_now,
)
from awl.documents.patterns import (
    TOOL_NAME_RE,
    canonical_ref,
    covered_by_any,
    is_tool_name,
    matches_any,
    parse_ref,
)
from awl.documents.pointers import pointer, resolve_pointer

if typing.TYPE_CHECKING:
    from awl.documents.bounded import (
        PatternError,
        SchemaTooCostly,
        bounded_errors,
        bounded_validator,
        meta_errors,
    )

_BOUNDED = "awl.documents.bounded"
__getattr__, __dir__ = lazy_exports(__name__, {
    "PatternError": _BOUNDED, "SchemaTooCostly": _BOUNDED, "bounded_errors": _BOUNDED,
    "bounded_validator": _BOUNDED, "meta_errors": _BOUNDED})

__all__ = [
    "INT64_MAX",
    "MAX_CONTENT_BLOCKS",
    "RELEASE",
    "TERMINAL",
    "TOOL_NAME_RE",
    "WORKING",
    "AWLError",
    "BadRequest",
    "CallOutcome",
    "CallRecord",
    "Conflict",
    "DocumentError",
    "Grant",
    "InvalidTransition",
    "NotFound",
    "PassError",
    "PatternError",
    "SchemaTooCostly",
    "StoreUnavailable",
    "WorkOrder",
    "WorkReport",
    "bounded_errors",
    "bounded_validator",
    "canonical_ref",
    "check_integer",
    "check_json_value",
    "covered_by_any",
    "debugging",
    "escapes_nothing",
    "format_time",
    "is_finite_number",
    "is_tool_name",
    "json_equal",
    "lazy_exports",
    "loads",
    "matches_any",
    "meta_errors",
    "parse_ref",
    "parse_time",
    "pointer",
    "print_debug",
    "read_regular_file",
    "resolve_pointer",
    "show_value",
    "utc_now",
]
