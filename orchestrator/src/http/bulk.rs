//! Bulk actions over HTTP (SPEC §13): `POST /v1/bulk` records a durable job applying one
//! operator command to every saga a filter matches (scope `operate`), `GET /v1/bulk/{id}` shows
//! its progress and refusals, `GET /v1/bulk` lists recent jobs (scope `read`). The job is
//! worked by the bulk runner of every serving process ([`crate::operations::bulk::run`]).

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::http::auth::ClientId;
use crate::http::error::{quote, ApiError};
use crate::http::extract::{hyphenated_uuid, rfc3339_millis, JsonBody};
use crate::http::openapi::{ErrorBody, Forbidden, ForbiddenOperate, ServerErrors, Unauthorized};
use crate::http::state::AppState;
use crate::model::{BulkAction, BulkJob, BulkJobPage, ListFilter, SagaStatus};
use crate::operations::bulk::{BulkCreated, BulkRequest};
use crate::operations::{Operations, Reason, MAX_REASON};

/// Which sagas a bulk action acts on. Every field is optional; those given combine with AND.
/// At least one must be given unless `dry_run` is true: an action over every saga is never
/// made by leaving the filter out.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkFilter {
    /// Only sagas in this status (any case).
    #[schema(value_type = Option<SagaStatus>)]
    status: Option<String>,
    /// Only sagas of this definition name (not empty: leave it out for any name).
    #[schema(min_length = 1)]
    name: Option<String>,
    /// `true`: only sagas flagged as needing a person (`false` is no condition).
    needs_attention: Option<bool>,
    /// Only sagas created at or after this RFC 3339 time.
    #[schema(format = DateTime)]
    created_after: Option<String>,
    /// Only sagas created before this RFC 3339 time.
    #[schema(format = DateTime)]
    created_before: Option<String>,
    /// Only these sagas: ids picked one by one (at most 1000; one named twice counts once), as the console's
    /// list selects them.
    #[schema(max_items = 1000)]
    ids: Option<Vec<Uuid>>,
    /// Only sagas with these search attributes (`{"user": "ada"}`), equality on each, as the
    /// list's `attr.<name>=…`; names as a definition declares them, values strings.
    #[schema(schema_with = attr_filter_schema)]
    attr: Option<serde_json::Map<String, Value>>,
}

/// The schema of [`BulkFilter`]'s `attr`: an object of strings whose names follow
/// `saga_dsl::attrs::valid_attr_name`, so that a body the document calls valid is never
/// refused for a name.
fn attr_filter_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^[a-z][a-z0-9_]*$"))
        .max_length(Some(saga_dsl::MAX_ATTR_NAME));
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String)))
        .property_names(Some(name))
        .description(Some(
            "Only sagas with these search attributes (`{\"user\": \"ada\"}`), equality on \
             each, as the list's `attr.<name>=…`; names as a definition declares them, values \
             strings.",
        ))
        .build()
}

/// The body of `POST /v1/bulk`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkBody {
    /// The command applied to each matched saga: `cancel`, `pause`, `resume`, `retry`,
    /// `abort`, or `fork` (each saga forked afresh from its own input, as `POST
    /// /v1/sagas/{id}/fork` without `from_stage` does).
    #[schema(value_type = BulkAction)]
    action: String,
    /// Which sagas.
    #[serde(default)]
    filter: BulkFilter,
    /// Why: kept in each saga's audit event, without its surrounding white space. At most
    /// 1000 characters as sent, at least one of them not white space.
    // The pattern of `OperatorReason`'s: one character outside the white space `Reason` trims.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: String,
    /// Only count the matched sagas and show some of them: nothing is recorded or changed.
    #[serde(default)]
    dry_run: bool,
}

/// `202` of `POST /v1/bulk`: the job recorded.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BulkAccepted {
    /// The job's id (`GET /v1/bulk/{id}`).
    id: Uuid,
    /// How many sagas it acts on: those the filter matched when it was recorded.
    matched: u64,
}

/// `200` of a dry run of `POST /v1/bulk`: nothing recorded.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BulkDryRun {
    /// Always `null`: no job was recorded.
    #[schema(value_type = Option<Uuid>)]
    id: Option<Uuid>,
    /// How many sagas the filter matches now.
    matched: u64,
    /// The first of them (up to 20), in the order a job would act on them (id order).
    sample: Vec<Uuid>,
}

/// The most sagas a bulk filter may name one by one.
const MAX_IDS: usize = 1000;

fn invalid_filter(message: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_filter", message)
}

/// The body, checked: the action, the filter as the list's, the reason.
fn parse(body: Value) -> Result<(BulkRequest, Reason), ApiError> {
    let filter_json = body.get("filter").cloned().unwrap_or(Value::Null);
    let body: BulkBody = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{\"action\": \"cancel\"|\"retry\"|\"abort\"|…, \"filter\": \
             {{\"status\", \"name\", \"needs_attention\", \"created_after\", \
             \"created_before\", \"attr\"}}, \"reason\": \"…\", \"dry_run\": false}}: {e}"
        ))
    })?;
    let action = body.action.parse::<BulkAction>().map_err(|_| {
        let valid: Vec<&str> = BulkAction::ALL.iter().map(|a| a.as_str()).collect();
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_action",
            format!(
                "unknown bulk action {}: valid actions are {}",
                quote(&body.action),
                valid.join(", ")
            ),
        )
    })?;
    if body.reason.chars().count() > MAX_REASON {
        return Err(ApiError::bad_request(format!(
            "the reason is {} characters long; at most {MAX_REASON} are allowed, surrounding \
             white space included: shorten it",
            body.reason.chars().count()
        )));
    }
    let reason = Reason::parse(&body.reason)?;
    let f = body.filter;
    let mut attrs = Vec::new();
    for (name, value) in f.attr.unwrap_or_default() {
        let Value::String(value) = value else {
            return Err(invalid_filter(format!(
                "filter.attr.{name}: a search attribute's value is a string, got {value}"
            )));
        };
        if !saga_dsl::attrs::valid_attr_name(&name) {
            return Err(invalid_filter(format!(
                "filter.attr: {} is not a search attribute's name: a lower-case letter, then \
                 lower-case letters, digits or '_', at most {} bytes",
                quote(&name),
                saga_dsl::MAX_ATTR_NAME
            )));
        }
        attrs.push((name, value));
    }
    let status = f
        .status
        .map(|s| {
            s.to_ascii_uppercase().parse::<SagaStatus>().map_err(|_| {
                let valid: Vec<&str> = SagaStatus::ALL.iter().map(|s| s.as_str()).collect();
                invalid_filter(format!(
                    "filter.status: unknown status {}: valid values are {}",
                    quote(&s),
                    valid.join(", ")
                ))
            })
        })
        .transpose()?;
    let instant = |field: &str, value: Option<String>| {
        value
            .map(|text| {
                rfc3339_millis(&text).ok_or_else(|| {
                    invalid_filter(format!(
                        "filter.{field} must be an RFC 3339 time such as \
                         2026-12-24T18:00:00Z, got {}",
                        quote(&text)
                    ))
                })
            })
            .transpose()
    };
    if f.name.as_deref() == Some("") {
        return Err(invalid_filter(
            "filter.name is empty: give a definition name, or leave it out".to_owned(),
        ));
    }
    let ids = f.ids.unwrap_or_default();
    if ids.len() > MAX_IDS {
        return Err(invalid_filter(format!(
            "filter.ids names {} sagas; at most {MAX_IDS} may be given: use the other filter \
             fields for more",
            ids.len()
        )));
    }
    let filter = ListFilter {
        ids,
        status,
        name: f.name,
        needs_attention: f.needs_attention.unwrap_or(false),
        created_after: instant("created_after", f.created_after)?,
        created_before: instant("created_before", f.created_before)?,
        attrs,
        ..ListFilter::default()
    };
    let empty = filter.status.is_none()
        && filter.ids.is_empty()
        && filter.name.is_none()
        && !filter.needs_attention
        && filter.created_after.is_none()
        && filter.created_before.is_none()
        && filter.attrs.is_empty();
    if empty && !body.dry_run {
        return Err(invalid_filter(
            "the filter is empty: it would act on every saga. Give at least one of ids, \
             status, name, needs_attention, created_after, created_before, attr (try it with \
             \"dry_run\": true first)"
                .to_owned(),
        ));
    }
    Ok((
        BulkRequest {
            action,
            filter,
            filter_json,
            dry_run: body.dry_run,
        },
        reason,
    ))
}

/// `POST /v1/bulk`: records a bulk job (or counts, for a dry run).
#[utoipa::path(
    post,
    path = "/v1/bulk",
    tag = "operators",
    operation_id = "bulk",
    summary = "Apply an operator command to every saga a filter matches",
    description = "Records a durable bulk job: the sagas the filter matches now (and only \
                   those: sagas created later are not touched) each get the command, through \
                   the same rules and audit as the command on one saga, with the token's name \
                   as actor, the reason, and the job's id as `bulk_id` in each saga's event. \
                   A saga whose state does not allow the command is listed in the job's \
                   `refused` with the error code and message the command answered. The job \
                   resumes after a crash and acts on each saga at most once. The filter must \
                   set at least one field (an empty filter is allowed only for a dry run). \
                   With `dry_run: true` nothing is recorded: the answer is `200` with the \
                   count and the first matched ids. Needs the `operate` scope.",
    request_body(content = BulkBody, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 202, description = "The job is recorded; `Location` is `/v1/bulk/{id}`", body = BulkAccepted,
         headers(("Location" = String, description = "The job: `/v1/bulk/{id}`"))),
        (status = 200, description = "A dry run: how many sagas match, and the first of them", body = BulkDryRun),
        (status = 400, description = "Malformed JSON or body, or no reason", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 422, description = "An unknown action (`invalid_action`), a filter value that does not parse, an empty filter without `dry_run`, or a search attribute that is not a string or not a valid name (`invalid_filter`)", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn create_bulk(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let (request, reason) = parse(body)?;
    let created = Operations::of(&state.engine)
        .bulk(&request, &reason, actor.as_str())
        .await?;
    Ok(match created {
        BulkCreated::Job { id, matched } => (
            StatusCode::ACCEPTED,
            [(header::LOCATION, format!("/v1/bulk/{id}"))],
            Json(BulkAccepted { id, matched }),
        )
            .into_response(),
        BulkCreated::DryRun { matched, sample } => (
            StatusCode::OK,
            Json(BulkDryRun {
                id: None,
                matched,
                sample,
            }),
        )
            .into_response(),
    })
}

/// `GET /v1/bulk/{id}`: a bulk job's progress and refusals.
#[utoipa::path(
    get,
    path = "/v1/bulk/{id}",
    tag = "operators",
    operation_id = "bulk_job",
    summary = "Read a bulk job",
    description = "The job's action, status (`RUNNING` until every matched saga was acted on \
                   or refused, then `DONE`), `matched`, `done` (acted on or refused so far), \
                   the sagas that refused the command (`refused`, the first 1000 in id order), \
                   its filter, reason and actor.",
    params(("id" = Uuid, Path, description = "The job's id")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The job", body = BulkJob),
        (status = 400, description = "Malformed job id", body = ErrorBody),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No bulk job has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn get_bulk(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<BulkJob>, ApiError> {
    let id = hyphenated_uuid(&raw).ok_or_else(|| {
        ApiError::bad_request(format!(
            "malformed bulk job id {}: expected the id POST /v1/bulk answered",
            quote(&raw)
        ))
    })?;
    state
        .engine
        .store()
        .bulk_job(id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no bulk job with id {id}")))
}

/// The query of `GET /v1/bulk`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/bulk?limit=&cursor=`: recent bulk jobs, newest first.
#[utoipa::path(
    get,
    path = "/v1/bulk",
    tag = "operators",
    operation_id = "list_bulk_jobs",
    summary = "List bulk jobs",
    description = "Bulk jobs, newest first, without their refusals (read a job for them).",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Page size, 1 to 1000 (default 50)"),
        ("cursor" = Option<Uuid>, Query, description = "The `next_cursor` of the previous page"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "A page of jobs", body = BulkJobPage),
        (status = 400, description = "Malformed or unknown query parameter", body = ErrorBody),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn list_bulk(
    State(state): State<AppState>,
    Query(query): Query<BulkListQuery>,
) -> Result<Json<BulkJobPage>, ApiError> {
    // An empty value is refused like any other that is not one: the document declares an
    // integer and a UUID, with no empty form.
    let limit = match query.limit {
        None => 50,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=1000).contains(&n) && n.to_string() == text => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be an integer from 1 to 1000, got {}",
                    quote(&text)
                )))
            }
        },
    };
    let cursor = query
        .cursor
        .map(|c| {
            hyphenated_uuid(&c).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "malformed cursor {}: pass the next_cursor of the previous page",
                    quote(&c)
                ))
            })
        })
        .transpose()?;
    Ok(Json(
        state.engine.store().list_bulk_jobs(limit, cursor).await?,
    ))
}
