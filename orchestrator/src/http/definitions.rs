//! Discovery (SPEC §8): `GET /v1/definitions`, and the OpenAPI document with one start route
//! per registered saga whose request body is that saga's input schema.
//!
//! The input schemas are JSON Schema as `schemars` writes them (draft 2020-12: boolean schemas,
//! `const`, `$defs`, …). utoipa's typed document cannot hold all of that, so the per-saga parts
//! are added to the generated document as JSON: each input schema becomes a component
//! (`components.schemas.<name>_input`, its nested types `<name>_input.<Type>`, with their
//! `$ref`s rewritten to point there), and each saga gets `POST /v1/sagas/<name>`, a copy of the
//! generic start operation whose body references that component. The generic
//! `POST /v1/sagas/{saga}` stays, for tooling that does not know the sagas.

use axum::extract::State;
use axum::Json;
use saga_dsl::Registry;
use serde_json::{json, Map, Value};

use crate::http::openapi::{Forbidden, Unauthorized};
use crate::http::state::AppState;
use crate::model::DefinitionList;

/// The OpenAPI description of `GET /v1/definitions`.
const DESCRIPTION: &str = "Every saga definition this server can start, each registered \
    version by name then version: its step list (name and kind of each stage), the hash \
    recorded with each saga started on it, and its input as JSON Schema (draft 2020-12; `true` \
    when it takes any JSON). A start uses the highest version of its name; the served \
    `/openapi.json` also documents one start route per definition, `POST /v1/sagas/<name>`, \
    with that schema as its request body.";

/// `GET /v1/definitions`: `{"definitions": [{"name", "version", "hash", "stages", "input_schema"}]}`
/// for every definition of the engine's registry, by name then version.
#[utoipa::path(
    get,
    path = "/v1/definitions",
    tag = "definitions",
    operation_id = "list_definitions",
    summary = "List the saga definitions",
    description = DESCRIPTION,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The definitions, by name then version",
         body = DefinitionList),
        Unauthorized,
        Forbidden,
    )
)]
pub(crate) async fn list_definitions(State(state): State<AppState>) -> Json<DefinitionList> {
    Json(DefinitionList::of(state.engine.registry()))
}

/// The OpenAPI document an API over `registry` serves at `GET /openapi.json`: [`openapi()`]
/// with one start route per definition, `POST /v1/sagas/<name>`, whose request body is that
/// definition's input schema (`components.schemas.<name>_input`). An application can write it
/// out for client generators without running a server.
///
/// It is JSON rather than utoipa's typed document, because the input schemas use JSON Schema
/// that the typed model cannot hold (see the module documentation).
///
/// [`openapi()`]: fn@crate::http::openapi
pub fn openapi_for(registry: &Registry) -> Value {
    with_start_routes(&super::openapi(), registry)
}

/// [`openapi_for`] as pretty-printed JSON with a final newline: the exact text of
/// `GET /openapi.json` on a server of `registry`.
pub fn openapi_json_for(registry: &Registry) -> String {
    to_json(&openapi_for(registry))
}

/// Pretty JSON with a final newline, as the generic document is written.
pub(crate) fn to_json(doc: &Value) -> String {
    // A `Value` always serialises.
    let mut text = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".to_owned());
    text.push('\n');
    text
}

/// The path of the generic start route in the document, as a JSON pointer.
const GENERIC_START: &str = "/paths/~1v1~1sagas~1{saga}/post";

/// `doc` (the generated document) with, for the latest version of each definition of
/// `registry`, its input schema as a component and its own start route `POST /v1/sagas/<name>`.
pub(crate) fn with_start_routes(doc: &utoipa::openapi::OpenApi, registry: &Registry) -> Value {
    // A document built from our own types always serialises; should it not, an empty object
    // is still valid JSON, as `to_json` answers.
    let mut doc = serde_json::to_value(doc).unwrap_or_else(|_| json!({}));
    start_links(&mut doc);
    let Some(generic) = doc.pointer(GENERIC_START).cloned() else {
        return doc;
    };
    let mut taken: Vec<String> = operation_ids(&doc);
    let names: Vec<&str> = latest_versions(registry).iter().map(|d| d.name()).collect();
    if !names.is_empty() {
        generic_start_excludes(&mut doc, &names);
    }
    for def in latest_versions(registry) {
        let name = def.name();
        let component = format!("{name}_input");
        for (key, mut schema) in component_schemas(def.input_schema().as_value(), &component) {
            bound_sized_integers(&mut schema);
            doc["components"]["schemas"][key] = schema;
        }
        let mut op = generic.clone();
        let mut id = format!("start_{name}");
        // `start_saga` is the generic route's: a saga named `saga` must not reuse it.
        while taken.contains(&id) {
            id.push_str("_definition");
        }
        taken.push(id.clone());
        op["operationId"] = json!(id);
        op["summary"] = json!(format!("Start a {name} saga"));
        let stages: Vec<&str> = def.steps().iter().map(|s| s.name()).collect();
        op["description"] = json!(format!(
            "Starts a `{name}` saga (version {}: {}) with the request body as its input, which \
             must fit the schema `{component}` (else `422 invalid_input`, naming the field). \
             Headers and answers are those of `POST /v1/sagas/{{saga}}`, which describes them.",
            def.version(),
            stages.join(" → "),
        ));
        if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
            params.retain(|p| p["in"] != "path");
        }
        op["requestBody"] = json!({
            "description": format!("The input of `{name}`"),
            "content": {"application/json": {
                "schema": {"$ref": format!("#/components/schemas/{component}")}
            }},
            "required": true,
        });
        doc["paths"][format!("/v1/sagas/{name}")] = json!({ "post": op });
    }
    if !names.is_empty() {
        generic_start_unlinked(&mut doc);
    }
    list_attr_params(&mut doc, registry);
    doc
}

/// Adds to `GET /v1/sagas` a query parameter `attr.NAME` per search attribute the registry's
/// definitions declare, so that generated clients can filter by them.
fn list_attr_params(doc: &mut Value, registry: &Registry) {
    let mut names: Vec<&str> = registry.iter().flat_map(|d| d.attr_names()).collect();
    names.sort_unstable();
    names.dedup();
    let Some(params) = doc
        .pointer_mut("/paths/~1v1~1sagas/get/parameters")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    // Before `limit` and `cursor`, beside the other filters.
    let at = params
        .iter()
        .position(|p| p["name"] == "limit")
        .unwrap_or(params.len());
    for (i, name) in names.into_iter().enumerate() {
        params.insert(
            at + i,
            json!({
                "name": format!("attr.{name}"),
                "in": "query",
                "required": false,
                "description": format!(
                    "Only sagas whose search attribute `{name}` equals this value"
                ),
                "schema": {"type": "string"},
            }),
        );
    }
}

/// Removes the links of the generic start's answers on a server with definitions: there the
/// route matches only names the server does not have, so it starts no saga, and its links
/// would promise operations on one (tools that chain calls along links would start there and
/// never reach a saga). The generic document, with no definitions, keeps them.
fn generic_start_unlinked(doc: &mut Value) {
    for status in ["200", "202"] {
        if let Some(response) = doc
            .pointer_mut(&format!("{GENERIC_START}/responses/{status}"))
            .and_then(Value::as_object_mut)
        {
            response.remove("links");
        }
    }
}

/// The operations on one saga, each linked from a start's answers.
const SAGA_OPERATIONS: [&str; 13] = [
    "get_saga",
    "saga_events",
    "saga_attempts",
    "saga_deliveries",
    "cancel_saga",
    "signal_saga",
    "abort_saga",
    "retry_saga",
    "mark_compensated",
    "pause_saga",
    "resume_saga",
    "complete_step",
    "fork_saga",
];

/// Links from the generic start's answers (`200`, `202`; each saga's own start route copies
/// them, and on a server with definitions only those keep them) to the operations on the saga started (OpenAPI links: the answer's `id` fills their
/// `{saga}`), so that clients, and tools that chain calls, find where a new saga's id goes.
/// Written here, on the JSON, because utoipa's typed link serialises its field names in snake
/// case, which OpenAPI does not read.
fn start_links(doc: &mut Value) {
    let links: Map<String, Value> = SAGA_OPERATIONS
        .iter()
        .map(|op| {
            let link = json!({
                "operationId": op,
                "parameters": {"saga": "$response.body#/id"},
                "description": format!("`{op}` of the saga this answer is about"),
            });
            ((*op).to_owned(), link)
        })
        .collect();
    // A fork's answer is a new saga too.
    let answers = [
        format!("{GENERIC_START}/responses/200"),
        format!("{GENERIC_START}/responses/202"),
        "/paths/~1v1~1sagas~1{saga}~1fork/post/responses/201".to_owned(),
    ];
    for answer in answers {
        if let Some(response) = doc.pointer_mut(&answer).and_then(Value::as_object_mut) {
            response.insert("links".to_owned(), Value::Object(links.clone()));
        }
    }
}

/// Narrows the generic start route's `{saga}` to the names that have no route of their own.
/// OpenAPI matches a concrete path before a templated one, so `POST /v1/sagas/place_order` is
/// the registered saga's route, whose body is its input schema; the generic route's "any JSON"
/// body would promise, for those names, inputs the server refuses.
fn generic_start_excludes(doc: &mut Value, names: &[&str]) {
    let Some(params) = doc
        .pointer_mut(&format!("{GENERIC_START}/parameters"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for param in params.iter_mut().filter(|p| p["in"] == "path") {
        param["schema"] = json!({"type": "string", "not": {"enum": names}});
        if let Some(param) = param.as_object_mut() {
            // Its example names a registered saga, which this route no longer covers.
            param.remove("example");
        }
        param["description"] = json!(
            "The saga definition name: one this server does not have (`404`). Each registered \
             definition has its own route, `POST /v1/sagas/<name>`, which matches first"
        );
    }
}

/// Gives every integer schema of a sized Rust type (`format` `int8` to `uint64`, as schemars
/// writes them) the bounds serde enforces: a larger number is refused (`422 invalid_input`),
/// so the schema says so rather than promising every integer.
fn bound_sized_integers(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let bounds: Option<(i128, i128)> = match object.get("format").and_then(Value::as_str) {
                Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
                Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
                Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
                Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
                Some("uint8") => Some((0, u8::MAX.into())),
                Some("uint16") => Some((0, u16::MAX.into())),
                Some("uint32") => Some((0, u32::MAX.into())),
                Some("uint64") => Some((0, u64::MAX.into())),
                _ => None,
            };
            if let Some((low, high)) = bounds {
                object.entry("minimum").or_insert_with(|| number(low));
                object.entry("maximum").or_insert_with(|| number(high));
            }
            object.values_mut().for_each(bound_sized_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_sized_integers),
        _ => {}
    }
}

/// A bound of a sized integer as a JSON number (every one fits `i64` or `u64`).
fn number(n: i128) -> Value {
    match (i64::try_from(n), u64::try_from(n)) {
        (Ok(n), _) => json!(n),
        (_, Ok(n)) => json!(n),
        _ => Value::Null,
    }
}

/// The highest version of each name: the one a start uses.
fn latest_versions(registry: &Registry) -> Vec<&saga_dsl::SagaDefinition> {
    let mut latest: Vec<&saga_dsl::SagaDefinition> = Vec::new();
    // The registry iterates by name, then version: the last of each run of a name wins.
    for def in registry.iter() {
        match latest.last_mut() {
            Some(last) if last.name() == def.name() => *last = def,
            _ => latest.push(def),
        }
    }
    latest
}

fn operation_ids(doc: &Value) -> Vec<String> {
    let mut ids = Vec::new();
    for item in doc["paths"].as_object().into_iter().flat_map(Map::values) {
        for op in item.as_object().into_iter().flat_map(Map::values) {
            if let Some(id) = op["operationId"].as_str() {
                ids.push(id.to_owned());
            }
        }
    }
    ids
}

/// An input schema as OpenAPI components: the root under `root`, each of its `$defs` under
/// `root.<name>`, every `$ref` into them rewritten to its component. A boolean schema becomes
/// its object form (`true` is `{}`), which every OpenAPI tool reads.
fn component_schemas(schema: &Value, root: &str) -> Vec<(String, Value)> {
    let mut schema = match schema {
        Value::Bool(true) => {
            json!({"description": "Any JSON: the definition declares no input type."})
        }
        Value::Bool(false) => json!({"not": {}}),
        other => other.clone(),
    };
    let mut defs = Map::new();
    if let Some(object) = schema.as_object_mut() {
        // The document's dialect (OpenAPI 3.1's) already is a superset of draft 2020-12.
        object.remove("$schema");
        if let Some(Value::Object(d)) = object.remove("$defs") {
            defs = d;
        }
    }
    let mut out = vec![(root.to_owned(), schema)];
    out.extend(
        defs.into_iter()
            .map(|(name, def)| (def_component(root, &name), def)),
    );
    for (_, s) in &mut out {
        rewrite_refs(s, root);
    }
    out
}

/// The component name of definition `name` of `root`'s schema; characters a component name
/// cannot have (anything but letters, digits, `.`, `-`, `_`) become `_`.
fn def_component(root: &str, name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{root}.{name}")
}

/// Points every `$ref` of `schema` that is local to its own root (`#`, `#/$defs/…`) at the
/// components that now hold those schemas.
fn rewrite_refs(schema: &mut Value, root: &str) {
    match schema {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                if key == "$ref" {
                    if let Some(target) = value.as_str().and_then(|r| local_target(r, root)) {
                        *value = json!(format!("#/components/schemas/{target}"));
                    }
                } else {
                    rewrite_refs(value, root);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_refs(v, root)),
        _ => {}
    }
}

/// The component a root-local reference points at, or `None` for any other reference.
fn local_target(reference: &str, root: &str) -> Option<String> {
    if reference == "#" {
        return Some(root.to_owned());
    }
    let name = reference.strip_prefix("#/$defs/")?;
    // A JSON pointer token: `~1` is `/`, `~0` is `~` (in that order).
    let name = name.replace("~1", "/").replace("~0", "~");
    Some(def_component(root, &name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn nested_definitions_become_components_with_their_references() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Order",
            "type": "object",
            "properties": {
                "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                "next": {"$ref": "#"},
                "odd": {"$ref": "#/$defs/a~1b"},
            },
            "$defs": {
                "Item": {"type": "object", "properties": {"sub": {"$ref": "#/$defs/a~1b"}}},
                "a/b": {"type": "string"},
            },
        });
        let parts: BTreeMap<_, _> = component_schemas(&schema, "s_input").into_iter().collect();
        assert_eq!(
            parts.keys().collect::<Vec<_>>(),
            ["s_input", "s_input.Item", "s_input.a_b"]
        );
        let root = &parts["s_input"];
        assert!(root.get("$schema").is_none() && root.get("$defs").is_none());
        assert_eq!(
            root["properties"]["items"]["items"]["$ref"],
            "#/components/schemas/s_input.Item"
        );
        assert_eq!(
            root["properties"]["next"]["$ref"],
            "#/components/schemas/s_input"
        );
        assert_eq!(
            parts["s_input.Item"]["properties"]["sub"]["$ref"],
            "#/components/schemas/s_input.a_b"
        );
        assert_eq!(
            component_schemas(&json!(true), "t")[0].1["description"],
            "Any JSON: the definition declares no input type."
        );
    }
}
