//! Flow control over HTTP (SPEC §14): `GET /v1/limits` lists every limit with its value, what
//! holds it and what waits for it (scope `read`); `PUT /v1/limits/{name}` changes one (scope
//! `operate`) through the use case the CLI runs too ([`Operations::set_limit`]), audited in
//! `limit_changes` with the token's name as the actor and kept in the database, where every
//! process reads it.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use saga_dsl::Rate;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::auth::ClientId;
use crate::http::error::ApiError;
use crate::http::extract::JsonBody;
use crate::http::openapi::{ErrorBody, Forbidden, ForbiddenOperate, ServerErrors, Unauthorized};
use crate::http::operators::checked_reason;
use crate::http::state::AppState;
use crate::model::{LimitChange, LimitInfo};
use crate::operations::{Operations, Reason};

/// The body of `GET /v1/limits`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Limits {
    /// Every limit the definitions of the processes on this database declare, by name.
    limits: Vec<LimitInfo>,
}

/// A concurrency limit's new value (`max_running`, `per_key`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewLimit {
    /// How many sagas may run at once (per key, for `per_key`); 0 holds every saga still to
    /// start. Sagas already running keep running when it is lowered.
    #[schema(minimum = 0, maximum = 1_000_000, example = 10)]
    limit: u32,
    /// Why: kept with the change in `limit_changes`, without its surrounding white space. At
    /// most 1000 characters as sent, at least one of them not white space.
    // The pattern of `OperatorReason`'s: one character outside the white space `Reason` trims.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: Option<String>,
}

/// A rate limiter's new rate and burst (`rate`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRate {
    /// How many calls a second, minute or hour: `N/s`, `N/m` or `N/h`, N from 1 to 1000000.
    // What `Rate::from_str` reads (Rust's white space trimmed around the number and the unit,
    // a `+` before the number), bounded as the use case bounds it.
    #[schema(
        example = "20/s",
        pattern = "^[\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*\\+?0*(?:[1-9][0-9]{0,5}|1000000)[\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*/[\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*[smh][\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*$"
    )]
    rate: String,
    /// The calls let through at once after a pause (the bucket's size); the limiter's current
    /// burst if left out.
    #[schema(minimum = 1, maximum = 1_000_000, example = 5)]
    burst: Option<u32>,
    /// Why: kept with the change in `limit_changes`, without its surrounding white space. At
    /// most 1000 characters as sent, at least one of them not white space.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: Option<String>,
}

/// The body of `PUT /v1/limits/{name}`: a concurrency limit's new `limit`, or a rate
/// limiter's new `rate` (and `burst`); exactly one of `limit` and `rate`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Only its schema is used: `parse` reads the body field by field.
pub(crate) enum LimitChangeBody {
    /// For `max_running` and `per_key`.
    Limit(NewLimit),
    /// For `rate`.
    Rate(NewRate),
}

/// What a `PUT` asks for, before the limit's current burst fills a burst left out.
enum Asked {
    Limit(u32),
    Rate { rate: Rate, burst: Option<u32> },
}

/// The shape of the body, said in each refusal of it.
const BODY_SHAPE: &str = "{\"limit\": N, \"reason\": \"…\"} for a concurrency limit, or \
    {\"rate\": \"20/s\", \"burst\": N, \"reason\": \"…\"} for a rate limiter (burst and reason \
    optional)";

/// The body, checked: which change, and the reason if any.
fn parse(body: Value) -> Result<(Asked, Option<Reason>), ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("{why}; the body must be {BODY_SHAPE}"));
    let Value::Object(mut fields) = body else {
        return Err(bad("the body is not a JSON object".to_owned()));
    };
    // JSON Schema counts 10.0 as an integer, as the document's readers do.
    for key in ["limit", "burst"] {
        if let Some(n) = fields.get_mut(key) {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0) {
                if (0.0..=f64::from(u32::MAX)).contains(&f) {
                    *n = Value::from(f as u64);
                }
            }
        }
    }
    let (asked, reason) = match (fields.contains_key("limit"), fields.contains_key("rate")) {
        (true, true) => {
            return Err(bad(
                "the body gives both \"limit\" and \"rate\": a limit is one or the other"
                    .to_owned(),
            ))
        }
        (false, false) => return Err(bad("the body gives neither \"limit\" nor \"rate\"".into())),
        (true, false) => {
            let new: NewLimit =
                serde_json::from_value(Value::Object(fields)).map_err(|e| bad(e.to_string()))?;
            (Asked::Limit(new.limit), new.reason)
        }
        (false, true) => {
            let new: NewRate =
                serde_json::from_value(Value::Object(fields)).map_err(|e| bad(e.to_string()))?;
            let rate = new.rate.parse::<Rate>().map_err(|e| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_rate",
                    e.to_string(),
                )
            })?;
            (
                Asked::Rate {
                    rate,
                    burst: new.burst,
                },
                new.reason,
            )
        }
    };
    let reason = reason.as_deref().map(checked_reason).transpose()?;
    Ok((asked, reason))
}

/// `GET /v1/limits`: every limit with its value and use.
#[utoipa::path(
    get,
    path = "/v1/limits",
    tag = "limits",
    operation_id = "list_limits",
    summary = "List the limits",
    description = "Every concurrency limit (`max_running`: sagas of a definition running at \
                   once; `per_key`: at once per key of their input) and rate limiter (`rate`: \
                   a token bucket a step takes from before each attempt) the definitions \
                   declare, by name: its value as it stands (an operator's, or the declared \
                   one, shown beside it in `declared`), who changed it and when, how many \
                   sagas hold it (`in_use`; for a rate limiter, the tokens taken and not yet \
                   refilled) and how many wait for it (`waiting`).",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The limits, by name", body = Limits),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn list_limits(State(state): State<AppState>) -> Result<Json<Limits>, ApiError> {
    let limits = state.engine.store().limits().await?;
    Ok(Json(Limits { limits }))
}

/// `PUT /v1/limits/{name}` `{"limit"}` or `{"rate", "burst"?}`, with an optional reason.
#[utoipa::path(
    put,
    path = "/v1/limits/{name}",
    tag = "limits",
    operation_id = "set_limit",
    summary = "Change a limit",
    description = "Sets a concurrency limit's `limit`, or a rate limiter's `rate` and `burst` \
                   (the current burst if left out), while sagas run. Kept in the database \
                   (a restart keeps it; a new release that declares another value shows it \
                   in `declared` and keeps this one) and applied by every process within a \
                   second: a raised limit admits waiting sagas at once, a lowered one holds \
                   back the next starts (sagas running keep running), a new rate spaces the \
                   calls waiting for a token anew. Audited in `limit_changes` with the reason \
                   and the token's name. Needs the `operate` scope.",
    params(("name" = String, Path, description = "The limit's name, as `GET /v1/limits` lists it",
            example = "payout_running")),
    request_body(content = LimitChangeBody, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Changed: the limit as it now stands", body = LimitInfo),
        (status = 400, description = "Malformed JSON or body (not exactly one of `limit` and \
                                      `rate`, a field of the other kind's), a value out of \
                                      range, or a blank reason", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "`unknown_limit`: no limit has this name", body = ErrorBody),
        (status = 422, description = "`invalid_rate`: a rate that is not `N/s`, `N/m` or `N/h`; \
                                      `unprocessable`: a `rate` for a concurrency limit, or a \
                                      `limit` for a rate limiter", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn set_limit(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<LimitInfo>, ApiError> {
    let (asked, reason) = parse(body)?;
    let ops = Operations::of(&state.engine);
    let change = match asked {
        Asked::Limit(limit) => LimitChange::Limit(limit),
        Asked::Rate { rate, burst } => {
            let burst = match burst {
                Some(burst) => burst,
                // A concurrency limit has no burst: the use case refuses the rate for it.
                None => ops.limit(&name).await?.burst.unwrap_or(1),
            };
            LimitChange::Rate { rate, burst }
        }
    };
    let info = ops
        .set_limit(&name, change, reason.as_ref(), actor.as_str())
        .await?;
    Ok(Json(info))
}
