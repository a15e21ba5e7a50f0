//! The OpenAPI 3.1 document of the API, generated from the code.
//!
//! Every route is registered through `utoipa_axum::routes!` from the handler's own
//! `#[utoipa::path]` attribute (see `api_routes` in `mod.rs`), so the router and the document are
//! built from the same list: a handler cannot be served without being documented. The test
//! `tests/http/openapi.rs` checks the rest (methods, status codes) against the live router, and
//! that `docs/openapi.json` is this document byte for byte.
//!
//! The document is an exact contract: what a route's attribute cannot say is set on the
//! generated document here ([`exact_parameters`]) and in `http::definitions` (the served
//! document's parts per saga), and `scripts/contract.sh` checks the served document against a
//! real server with schemathesis, which fails on any valid request refused, invalid one taken
//! or answer not documented.

use utoipa::openapi::schema::{
    AnyOfBuilder, KnownFormat, ObjectBuilder, Ref, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use crate::model::SagaStatus;

/// The error body every `4xx` and `5xx` answer has.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // Only its schema is used: `ApiError` writes the same shape.
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorDetail {
    /// Stable and machine-readable: `bad_request`, `unauthorized`, `not_found`,
    /// `method_not_allowed`, `conflict`, `request_in_progress`, `payload_too_large`,
    /// `unsupported_media_type`, `invalid_input`, `idempotency_key_reused`, `internal`,
    /// `unavailable`.
    #[schema(example = "not_found")]
    code: String,
    /// For a person: what went wrong and how to fix it.
    #[schema(example = "no saga definition named \"place_ordr\"")]
    message: String,
}

// The error answers many routes share, each written once here and named in the `responses` of
// every route that can give it, so that a route still lists exactly the statuses it answers.
// Only their documents are used: the answers themselves are `ApiError`s.

/// `401`: the auth layer's answer to a missing or unknown token.
#[derive(IntoResponses)]
#[response(status = 401, description = "Missing or wrong bearer token")]
#[allow(dead_code)]
pub(crate) struct Unauthorized(ErrorBody);

/// `403` on a route whose scope is the usual one for its method (`read`, `start`).
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token lacks this route's scope"
)]
#[allow(dead_code)]
pub(crate) struct Forbidden(ErrorBody);

/// `403` on an operator command, which needs the `operate` scope whatever its method.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token lacks the `operate` scope"
)]
#[allow(dead_code)]
pub(crate) struct ForbiddenOperate(ErrorBody);

/// `400` of a route whose only input is the saga id in its path.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "Malformed saga id, or a prefix that several sagas' ids start with \
                   (`ambiguous_id`, the message names some of them)"
)]
#[allow(dead_code)]
pub(crate) struct MalformedSagaId(ErrorBody);

/// `404` of a route about one saga, when no saga has the id.
#[derive(IntoResponses)]
#[response(
    status = 404,
    description = "No saga has this id (or an id with this prefix)"
)]
#[allow(dead_code)]
pub(crate) struct SagaNotFound(ErrorBody);

/// `500` and `503` of a route that reads or writes the store.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum ServerErrors {
    /// A bug or a store failure that is not about availability.
    #[response(
        status = 500,
        description = "Internal error (details in the server log)"
    )]
    Internal(ErrorBody),
    /// The store cannot be reached, or the request ran out of time.
    #[response(
        status = 503,
        description = "Database unavailable or request timed out"
    )]
    Unavailable(ErrorBody),
}

/// Adds the bearer security scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The server's API token (SAGA_API_TOKEN or --api-token). Needed by every \
                         /v1 endpoint and /metrics when the server has one; without one the API \
                         is open. A missing or wrong token is answered 401 with \
                         WWW-Authenticate: Bearer, and nothing is created.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The parts of the document that are not paths: info, tags, security scheme, shared schemas.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "saga orchestrator",
        description = "Start sagas, follow them, list them, read their history and cancel them.\n\n\
            Every error is JSON `{\"error\": {\"code\", \"message\"}}`; every response carries \
            an `x-request-id` header that names the request in the server log. An unknown \
            route is `404` and a known route with another method is `405` (with `Allow`).\n\n\
            `POST /v1/sagas/{name}` and `GET /v1/sagas/{id}` honour `Prefer: wait=N` \
            (RFC 7240): the server holds the request up to N seconds (at most its configured \
            maximum, 60 by default) for the saga to end, and says what it applied in \
            `Preference-Applied`.\n\n\
            **Idempotency.** `POST /v1/sagas/{name}` takes an `Idempotency-Key` (IETF httpapi \
            draft): a retry with the same key and request replays the first answer \
            (`Idempotent-Replayed: true`) instead of starting a second saga. Keys are kept \
            24 hours by default (the server's `--idempotency-retention-secs`).\n\n\
            **Webhooks.** Every saga event (the transactional outbox) is POSTed, at least once \
            and in order per saga, to the saga's `Saga-Callback-Url` and to the server's \
            subscribers (`--webhook-url`), as JSON `{\"id\", \"type\", \"saga_id\", \
            \"saga_name\", \"step\", \"at\", \"data\"}` with headers `Saga-Event-Id` (the same \
            on every retry: deduplicate by it) and `Saga-Signature: t=<unix seconds>,v1=<hex>`, \
            HMAC-SHA256 with the shared secret over `<t>.<raw body>`. Receivers recompute it, \
            compare in constant time and refuse timestamps older than a few minutes \
            (`orchestrator::webhooks::verify_signature`). A failed delivery (not `2xx` within \
            the timeout) is retried with exponential backoff; `GET /v1/sagas/{id}/deliveries` \
            shows where each one stands.\n\n\
            **Tokens and scopes.** With tokens configured (`--api-token`, which has every \
            scope, and the named tokens of `--api-tokens-file`), `/v1` and `/metrics` need \
            `Authorization: Bearer <token>`: none or an unknown one is `401`, a token without \
            the route's scope `403 forbidden`. `read`: every `GET`; `start`: start, signal, \
            cancel; `operate`: the operator commands (abort, retry, mark-compensated, pause, \
            resume, complete a step, fork, bulk actions, changing a limit); `admin`: all. The token's name \
            is the actor of audit events and the scope of its idempotency keys.",
        license(name = "MIT OR Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "sagas", description = "Starting and following sagas"),
        (name = "definitions", description = "The sagas this server can start, and their inputs"),
        (name = "operators", description = "Operator commands, audited: abort, retry, mark-compensated, bulk actions (scope `operate`)"),
        (name = "limits", description = "Flow control: concurrency limits and rate limiters, read, and changed by operators (scope `operate`, audited)"),
        (name = "schedules", description = "Sagas started on a cron expression or at an interval: read, and made, paused, resumed, fired and deleted by operators (scope `operate`)"),
        (name = "operations", description = "Health, metrics and this document"),
    )
)]
pub(crate) struct ApiDoc;

/// Rust's white space (`char::is_whitespace`, what `str::trim` removes), as the body of a
/// regular expression character class: spelled out, because `\s` means another set in each
/// dialect that reads the document (ECMA 262, Python, Rust).
const WHITE_SPACE: &str =
    r"\t\n\u000b\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// What the routes' attributes cannot say exactly, set on the document they generate.
pub(crate) fn exact_parameters(doc: &mut utoipa::openapi::OpenApi) {
    absent_not_null(doc);
    exact_list_query(doc);
}

/// An optional parameter (`Option<T>` in an attribute) is typed `[T, "null"]`, but a header or
/// a query parameter is absent or a text, never JSON's `null`: a client that sent the text
/// `null` as the document allows would be refused. The optional parameters keep `T` alone;
/// `required: false` already says they may be left out.
fn absent_not_null(doc: &mut utoipa::openapi::OpenApi) {
    let operations = doc.paths.paths.values_mut().flat_map(|item| {
        [
            item.get.as_mut(),
            item.post.as_mut(),
            item.put.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ]
        .into_iter()
        .flatten()
    });
    for operation in operations {
        for param in operation.parameters.iter_mut().flatten() {
            if let Some(RefOr::T(Schema::Object(object))) = param.schema.as_mut() {
                if let SchemaType::Array(types) = &object.schema_type {
                    let types: Vec<Type> = types
                        .iter()
                        .filter(|t| **t != Type::Null)
                        .cloned()
                        .collect();
                    if let [only] = types.as_slice() {
                        object.schema_type = SchemaType::Type(only.clone());
                    }
                }
            }
        }
    }
}

/// Gives the query parameters of `GET /v1/sagas` the exact schemas of what
/// `http::extract::ListQuery` takes, which its attribute cannot spell: an empty value stands
/// for an absent parameter (a form's blank field), a status is read in any case, an id prefix
/// may carry dashes and surrounding white space.
fn exact_list_query(doc: &mut utoipa::openapi::OpenApi) {
    let Some(list) = doc
        .paths
        .paths
        .get_mut("/v1/sagas")
        .and_then(|item| item.get.as_mut())
    else {
        return;
    };
    for param in list.parameters.iter_mut().flatten() {
        if let Some(schema) = list_param_schema(&param.name) {
            param.schema = Some(schema);
        }
    }
}

/// The schema of query parameter `name` of `GET /v1/sagas`, when it is not the one its type
/// gives.
fn list_param_schema(name: &str) -> Option<RefOr<Schema>> {
    let blank = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([""]))
    };
    let or_blank = |schema: RefOr<Schema>| -> RefOr<Schema> {
        RefOr::T(Schema::AnyOf(
            AnyOfBuilder::new().item(schema).item(blank()).build(),
        ))
    };
    let schema = match name {
        "status" => {
            // Each status with each letter in either case.
            let statuses: Vec<String> = SagaStatus::ALL
                .iter()
                .map(|s| {
                    s.as_str()
                        .chars()
                        .map(|c| format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase()))
                        .collect()
                })
                .collect();
            RefOr::T(Schema::AnyOf(
                AnyOfBuilder::new()
                    .item(Ref::from_schema_name("SagaStatus"))
                    .item(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .pattern(Some(format!("^(?:|{})$", statuses.join("|")))),
                    )
                    .build(),
            ))
        }
        "needs_attention" | "blocked" => RefOr::T(Schema::AnyOf(
            AnyOfBuilder::new()
                .item(ObjectBuilder::new().schema_type(Type::Boolean))
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(["", "0", "1"])),
                )
                .build(),
        )),
        "created_after" | "created_before" => or_blank(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
                .into(),
        ),
        "limit" => or_blank(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(crate::http::extract::MAX_PAGE))
                .into(),
        ),
        "cursor" => or_blank(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
                .into(),
        ),
        "id_prefix" => ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(
                "^(?:|[{WHITE_SPACE}]*(?:-*[0-9A-Fa-f]){{{},32}}-*[{WHITE_SPACE}]*)$",
                crate::model::IdPrefix::MIN_LEN
            )))
            .into(),
        _ => return None,
    };
    Some(schema)
}
