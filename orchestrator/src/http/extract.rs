//! Extractors that read a request the way the API documents it and refuse it with an
//! [`ApiError`] otherwise, so that no axum plain-text rejection ever reaches a client and every
//! message says what to fix.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use crate::http::error::{quote, ApiError};
use crate::http::state::AppState;
use crate::model::{IdPrefix, IdPrefixError, ListFilter, SagaStatus};
use crate::store::{match_prefix, PrefixMatch};

/// The default page size of `GET /v1/sagas`.
pub(crate) const DEFAULT_PAGE: u32 = 50;
/// The largest page size of `GET /v1/sagas`.
pub(crate) const MAX_PAGE: u32 = 1000;

/// The `{saga}` path segment read as a saga id: the whole id, or a unique prefix of it (see
/// [`saga_id`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SagaId(pub(crate) Uuid);

impl FromRequestParts<AppState> for SagaId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state).await?;
        saga_id(state, &raw).await.map(SagaId)
    }
}

/// The saga a path segment names: a whole id (hyphenated, as the API writes ids) as it is,
/// without a read; the start of one, 8 or more characters, as the one saga whose id starts with it,
/// found by a range scan of the key (people and the CLI type the start of an id, as git's
/// short hashes). `400 bad_request` for anything else, `404 not_found` for a prefix no saga
/// has, `400 ambiguous_id` for one several sagas have, with some of them in the message.
pub(crate) async fn saga_id(state: &AppState, raw: &str) -> Result<Uuid, ApiError> {
    // Exactly what the document's pattern says: the start of an id as the API writes ids
    // (which `IdPrefix` alone would also read without its dashes, or with white space).
    let prefix = if hyphenated_prefix(raw) {
        IdPrefix::parse(raw)
    } else {
        Err(IdPrefixError::Invalid(raw.to_owned()))
    };
    let prefix = prefix.map_err(|e| {
        ApiError::bad_request(match e {
            IdPrefixError::TooShort(_) => format!(
                "saga id prefix {} is too short: give at least {} characters of the id",
                quote(raw),
                IdPrefix::MIN_LEN
            ),
            _ => format!(
                "malformed saga id {}: expected a UUID such as \
                 0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60, or its first 8 or more characters",
                quote(raw)
            ),
        })
    })?;
    if prefix.as_str().len() == 32 {
        return Ok(prefix.low());
    }
    match match_prefix(state.engine.store().as_ref(), &prefix).await? {
        PrefixMatch::One(id) => Ok(id),
        PrefixMatch::None => Err(ApiError::not_found(format!(
            "no saga has an id starting with {}",
            quote(raw)
        ))),
        many => Err(ApiError::ambiguous_id(format!(
            "saga id prefix {} is ambiguous: it matches {}; give more of the id",
            quote(raw),
            many.candidates()
        ))),
    }
}

/// Whether `raw` is the start of a saga id in the form the API writes ids (`8-4-4-4-12`
/// hexadecimal digits, any case): a digit everywhere but where the dashes go.
fn hyphenated_prefix(raw: &str) -> bool {
    raw.len() <= 36
        && raw.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A UUID in its hyphenated form (`8-4-4-4-12` hexadecimal digits, any case), the only form the
/// API writes and the one its document declares (`format: uuid`); the simple, braced and URN
/// forms that `Uuid::try_parse` also reads are refused, so that the server takes exactly what
/// the document says.
pub(crate) fn hyphenated_uuid(raw: &str) -> Option<Uuid> {
    if raw.len() != 36 {
        return None;
    }
    // At 36 characters, `try_parse` reads only the hyphenated form.
    Uuid::try_parse(raw).ok()
}

/// The `{saga}` and `{signal}` path segments of `POST /v1/sagas/{saga}/signals/{signal}`.
#[derive(Debug, Clone)]
pub(crate) struct SignalPath {
    /// The saga.
    pub(crate) saga: Uuid,
    /// The signal's name.
    pub(crate) signal: String,
}

impl FromRequestParts<AppState> for SignalPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Path((saga, signal)) =
            Path::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(SignalPath {
            saga: saga_id(state, &saga).await?,
            signal,
        })
    }
}

/// The `{saga}` path segment read as a saga definition name.
#[derive(Debug, Clone)]
pub(crate) struct SagaName(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for SagaName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(name) = Path::<String>::from_request_parts(parts, state).await?;
        Ok(SagaName(name))
    }
}

/// A request body holding one JSON value.
///
/// Unlike `axum::Json`, a request *without* a `Content-Type` is accepted (a bare
/// `curl --data-binary @order.json` or a minimal client works), but a body that declares another
/// type (`text/plain`, `application/x-www-form-urlencoded`, which is what `curl -d` sends) is
/// refused with `415`, since it was probably not meant as JSON. `application/json`, with any
/// parameters, and `application/*+json` are accepted. An empty body is `400`, a body over
/// [`HttpConfig::body_limit`](crate::http::HttpConfig::body_limit) is `413`, malformed JSON
/// (including invalid UTF-8 and nesting deeper than 128 levels) is `400`.
#[derive(Debug, Clone)]
pub(crate) struct JsonBody(pub(crate) Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config.body_limit;
        check_json_content_type(req.headers())?;
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large(limit)
            } else {
                ApiError::from(r)
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Accepts no content type, `application/json` (any parameters) and `application/*+json`.
fn check_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let refuse = || {
        ApiError::unsupported_media_type(format!(
            "the body must be JSON: send Content-Type: application/json (got {})",
            quote(&String::from_utf8_lossy(value.as_bytes()))
        ))
    };
    let text = value.to_str().map_err(|_| refuse())?;
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let is_json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if is_json {
        Ok(())
    } else {
        Err(refuse())
    }
}

/// Parses a body as one JSON value. serde_json refuses nesting deeper than 128 levels, so a
/// hostile `[[[[…]]]]` cannot overflow the stack.
fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty: send JSON (to start a saga, its input, for example {})",
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// The raw query string of `GET /v1/sagas`. Every field is text so that a bad value gets a
/// message naming the parameter rather than serde's; empty values (`?status=`) mean "absent".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListQuery {
    status: Option<String>,
    name: Option<String>,
    needs_attention: Option<String>,
    blocked: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    id_prefix: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// A boolean query parameter: `true`/`1` or `false`/`0` (empty: false).
fn flag(name: &str, value: Option<String>) -> Result<bool, ApiError> {
    match non_empty(value).as_deref() {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "{name} must be true or false, got {}",
            quote(other)
        ))),
    }
}

/// An RFC 3339 date-time (`2026-12-24T18:00:00Z`, or with an offset), as the document's
/// `format: date-time` means it, in milliseconds since the epoch. chrono also reads a space
/// between the date and the time, which RFC 3339's grammar does not have: refused here.
pub(crate) fn rfc3339_millis(text: &str) -> Option<crate::model::Millis> {
    if !matches!(text.as_bytes().get(10), Some(b'T' | b't')) {
        return None;
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// An RFC 3339 time query parameter, in milliseconds since the epoch.
fn instant(name: &str, value: Option<String>) -> Result<Option<crate::model::Millis>, ApiError> {
    non_empty(value)
        .map(|text| {
            rfc3339_millis(&text).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{name} must be an RFC 3339 time such as 2026-12-24T18:00:00Z, got {}",
                    quote(&text)
                ))
            })
        })
        .transpose()
}

/// The filters and page of `GET /v1/sagas`, validated.
#[derive(Debug, Clone)]
pub(crate) struct ListQuery(pub(crate) ListFilter);

impl<S: Send + Sync> FromRequestParts<S> for ListQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // `attr.NAME=VALUE` are as many parameters as the caller filters by: read apart, the
        // others into the struct (which refuses an unknown one).
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state).await?;
        let (attrs, others): (Vec<_>, Vec<_>) = pairs
            .into_iter()
            .partition(|(name, _)| name.starts_with(ATTR_PREFIX));
        let mut fields = serde_json::Map::with_capacity(others.len());
        for (name, value) in others {
            if fields.insert(name.clone(), Value::String(value)).is_some() {
                return Err(ApiError::bad_request(format!(
                    "malformed query string: {} is given twice",
                    quote(&name)
                )));
            }
        }
        let raw = RawListQuery::deserialize(Value::Object(fields)).map_err(|e| {
            ApiError::bad_request(format!(
                "malformed query string: Failed to deserialize query string: {e}"
            ))
        })?;
        let mut filter = raw.validate()?;
        filter.attrs = attr_filters(attrs)?;
        Ok(ListQuery(filter))
    }
}

/// The prefix of a list's filter by a search attribute: `attr.user=ada`.
pub(crate) const ATTR_PREFIX: &str = "attr.";

/// The search attributes a list is filtered by, from its `attr.NAME=VALUE` parameters: each
/// name valid and given once, the value compared as it is (empty included).
pub(crate) fn attr_filters(
    pairs: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, ApiError> {
    let mut attrs: Vec<(String, String)> = Vec::with_capacity(pairs.len());
    for (param, value) in pairs {
        let name = param.strip_prefix(ATTR_PREFIX).unwrap_or(&param);
        if !saga_dsl::attrs::valid_attr_name(name) {
            return Err(ApiError::bad_request(format!(
                "{} does not name a search attribute: write attr.NAME=VALUE, NAME a lower-case \
                 letter, then lower-case letters, digits or '_', at most {} bytes",
                quote(&param),
                saga_dsl::MAX_ATTR_NAME
            )));
        }
        if attrs.iter().any(|(seen, _)| seen == name) {
            return Err(ApiError::bad_request(format!(
                "{} is given twice: filter by each attribute once",
                quote(&param)
            )));
        }
        attrs.push((name.to_owned(), value));
    }
    Ok(attrs)
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

impl RawListQuery {
    fn validate(self) -> Result<ListFilter, ApiError> {
        let status = non_empty(self.status)
            .map(|s| {
                // Upper case on the wire; lower case is accepted too, as a convenience.
                s.to_ascii_uppercase().parse::<SagaStatus>().map_err(|_| {
                    let valid: Vec<&str> = SagaStatus::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::bad_request(format!(
                        "unknown status {}: valid values are {}",
                        quote(&s),
                        valid.join(", ")
                    ))
                })
            })
            .transpose()?;
        let limit = match non_empty(self.limit) {
            None => DEFAULT_PAGE,
            // Written as the number itself: `u32::from_str` would also take a sign or leading
            // zeros, which the document's integer does not have.
            Some(text) => match text.parse::<u32>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) && n.to_string() == text => n,
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "limit must be an integer from 1 to {MAX_PAGE}, got {}",
                        quote(&text)
                    )))
                }
            },
        };
        let cursor = non_empty(self.cursor)
            .map(|c| {
                hyphenated_uuid(&c).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "malformed cursor {}: pass the next_cursor of the previous page",
                        quote(&c)
                    ))
                })
            })
            .transpose()?;
        let id_prefix = non_empty(self.id_prefix)
            .map(|p| {
                crate::model::IdPrefix::parse(&p)
                    .map_err(|e| ApiError::bad_request(format!("id_prefix: {e}")))
            })
            .transpose()?;
        Ok(ListFilter {
            status,
            name: non_empty(self.name),
            needs_attention: flag("needs_attention", self.needs_attention)?,
            blocked: flag("blocked", self.blocked)?,
            created_after: instant("created_after", self.created_after)?,
            created_before: instant("created_before", self.created_before)?,
            id_prefix,
            ids: Vec::new(),
            attrs: Vec::new(),
            limit,
            cursor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn raw(pairs: &[(&str, &str)]) -> RawListQuery {
        let mut r = RawListQuery::default();
        for (k, v) in pairs {
            let v = Some((*v).to_owned());
            match *k {
                "status" => r.status = v,
                "name" => r.name = v,
                "needs_attention" => r.needs_attention = v,
                "limit" => r.limit = v,
                "cursor" => r.cursor = v,
                _ => unreachable!("unknown test parameter {k}"),
            }
        }
        r
    }

    #[test]
    fn list_query_defaults_and_bounds() {
        let f = raw(&[]).validate().expect("empty query is valid");
        assert_eq!(f.limit, DEFAULT_PAGE);
        assert_eq!(f.status, None);
        assert!(raw(&[("limit", "0")]).validate().is_err());
        assert!(raw(&[("limit", "1001")]).validate().is_err());
        assert!(raw(&[("limit", "-1")]).validate().is_err());
        assert_eq!(
            raw(&[("limit", "1000")]).validate().map(|f| f.limit).ok(),
            Some(1000)
        );
    }

    #[test]
    fn status_is_case_insensitive_and_errors_list_valid_values() {
        let f = raw(&[("status", "compensating")]).validate().ok();
        assert_eq!(f.and_then(|f| f.status), Some(SagaStatus::Compensating));
        let e = raw(&[("status", "DONE")]).validate().err();
        let message = e.map(|e| e.message().to_owned()).unwrap_or_default();
        assert!(message.contains("COMPENSATED"), "{message}");
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        assert!(check_json_content_type(&h).is_ok());
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/problem+json",
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ok));
            assert!(check_json_content_type(&h).is_ok(), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/jsonx",
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(bad));
            assert!(check_json_content_type(&h).is_err(), "{bad}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowing() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse_json(deep.as_bytes()).is_err());
        assert!(parse_json(b"  ").is_err());
        assert!(parse_json(&[0xff, 0xfe]).is_err());
        assert!(parse_json(b"{\"a\": 1}").is_ok());
    }
}
