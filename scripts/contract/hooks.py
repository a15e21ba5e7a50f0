"""Checks of the contract run (scripts/contract.sh) beside schemathesis' own.

`positive_data_acceptance` is told to take `422` from a valid request (schemathesis.toml),
because four refusals depend on what no schema can state (state, the network, a pair
of headers), a fork's two on the original's definition, and a limit's change on the limit's
kind. This check takes back the rest: a valid request answered `422` fails unless the error's
code is one of those, or a bulk action's refusal of an empty filter outside a dry run (a rule
over the body as a whole).
"""

import json
import re

import schemathesis
from schemathesis.core.failures import Failure

# The `422` codes of a request the document calls valid: each depends on more than the request.
STATE_REFUSALS = {
    # The same key came before with another request (SPEC §4).
    "idempotency_key_reused",
    # Saga-Start-At is a valid time, but one already past.
    "start_in_past",
    # Saga-Callback-Url is a valid URL whose host is or resolves to an internal address, or
    # does not resolve.
    "callback_url_not_allowed",
    # Saga-Callback-Secret without Saga-Callback-Url: each header is valid, the pair is not,
    # and a document states each header on its own.
    "callback_secret_without_url",
}


# A fork's new saga is of the original's definition, which the route's document cannot name:
# its input is checked against that definition's schema (`invalid_input`), and `from_stage`
# must be one of its stages (`unprocessable`).
FORK_REFUSALS = {"invalid_input", "unprocessable"}

# A limit is a concurrency limit or a rate limiter, which its name, not the route's document,
# says: a `limit` for a rate limiter, or a `rate` for a concurrency limit, is `unprocessable`.
LIMIT_REFUSALS = {"unprocessable"}

# A schedule names a saga the server must have, an input that must fit it, a cron expression,
# an IANA time zone and durations whose grammars no schema states, and exactly one of `cron`
# and `every` (a rule over the body as a whole).
SCHEDULE_REFUSALS = {
    "unknown_saga",
    "invalid_input",
    "invalid_cron",
    "invalid_timezone",
    "invalid_interval",
    "invalid_duration",
    "invalid_schedule",
}


def empty_bulk_filter(case):
    """Whether `case` asks `POST /v1/bulk` to act, not as a dry run, with a filter that sets
    nothing: a filter field left out, `null`, or an empty `ids`/`attr` sets nothing. The
    server refuses it (`invalid_filter`) so that an action over every saga is never an
    accident; the document says so, but "at least one field, unless dry_run" over fields that
    may each be null is not a schema a generator honours."""
    if case.operation.path != "/v1/bulk" or case.method.upper() != "POST":
        return False
    body = case.body if isinstance(case.body, dict) else {}
    if body.get("dry_run") is True:
        return False
    fields = body.get("filter") or {}
    if not isinstance(fields, dict):
        return False
    return all(v in (None, [], {}) or (k == "needs_attention" and v is False)
               for k, v in fields.items())


@schemathesis.check
def refused_only_for_state(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    try:
        code = json.loads(response.content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if code in STATE_REFUSALS:
        return None
    if case.operation.path == "/v1/sagas/{saga}/fork" and code in FORK_REFUSALS:
        return None
    if case.operation.path == "/v1/limits/{name}" and code in LIMIT_REFUSALS:
        return None
    if case.operation.path == "/v1/schedules" and code in SCHEDULE_REFUSALS:
        return None
    if code == "invalid_filter" and empty_bulk_filter(case):
        return None
    raise Failure(
        operation=case.operation.label,
        title="Schema-valid request refused 422",
        message=(
            f"A request the document calls valid was refused 422 with code {code!r}; only "
            f"{', '.join(sorted(STATE_REFUSALS))} may refuse one"
        ),
    )


UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


def uuid_path_parameters_are_uuids(case):
    """Whether every path parameter the document types `format: uuid` holds a UUID.

    schemathesis does not enforce the `uuid` format on the path parameters it generates, and
    sends a case with the text `null` as a bulk job's id as part of one it calls valid; the
    server refuses such an id `400`, as the document says it does."""
    values = case.path_parameters or {}
    for param in case.operation.definition.raw.get("parameters", []):
        if param.get("in") != "path" or param.get("name") not in values:
            continue
        if param.get("schema", {}).get("format") != "uuid":
            continue
        if not UUID.match(str(values[param["name"]])):
            return False
    return True


@schemathesis.hook
def filter_case(ctx, case):
    """Drops the cases schemathesis calls valid whose headers are not.

    The coverage phase gives no valid value to a header whose pattern needs characters other
    than letters and digits (`Saga-Callback-Url`: `:` and `/`), then sends it all the same,
    filled with a value outside its pattern (an empty text, or a run of zeros longer than its
    `maxLength`), as part of a case it calls valid. The server refuses such a header, as the
    document says it does; the case says nothing about the contract.
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return True
    if not uuid_path_parameters_are_uuids(case):
        return False
    if meta.phase.name != "coverage":
        return True
    headers = case.headers or {}
    for param in case.operation.definition.raw.get("parameters", []):
        if param.get("in") != "header" or param.get("name") not in headers:
            continue
        schema = param.get("schema", {})
        value = headers[param["name"]]
        if not isinstance(value, str):
            continue
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return False
        if len(value) > schema.get("maxLength", len(value)):
            return False
    return True


# The optional headers of a start that make it `422` for reasons of time or network (a
# Saga-Start-At already past, a callback host that does not resolve) or hold it (`Prefer:
# wait`): the other phases send them; the stateful phase leaves them out, so that its starts
# succeed and it goes on along the links to the saga they started.
STATEFUL_LEFT_OUT = ("Saga-Start-At", "Saga-Callback-Url", "Saga-Callback-Secret", "Prefer")


@schemathesis.hook
def map_case(ctx, case):
    meta = case.meta
    if meta is not None and meta.phase.name == "stateful" and case.headers:
        for name in STATEFUL_LEFT_OUT:
            case.headers.pop(name, None)
    return case
