//! The OpenAPI 3.1 document of the API, generated from the code.
//!
//! Every route is registered through `utoipa_axum::routes!` from the handler's own
//! `#[utoipa::path]` attribute (see `api_routes` in `mod.rs`), so the router and the document are
//! built from the same list: a handler cannot be served without being documented. The test
//! `tests/http/openapi.rs` checks the rest (methods, status codes) against the live router, and
//! that `docs/openapi.json` is this document byte for byte.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

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
            cancel; `operate`: abort, retry, mark-compensated; `admin`: all. The token's name \
            is the actor of audit events and the scope of its idempotency keys.",
        license(name = "MIT OR Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "sagas", description = "Starting and following sagas"),
        (name = "definitions", description = "The sagas this server can start, and their inputs"),
        (name = "operators", description = "Operator commands, audited: abort, retry, mark-compensated (scope `operate`)"),
        (name = "operations", description = "Health, metrics and this document"),
    )
)]
pub(crate) struct ApiDoc;
