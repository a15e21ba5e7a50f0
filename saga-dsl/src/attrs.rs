//! Search attributes: values a definition computes from a saga's input when it starts, which
//! the orchestrator stores beside the saga and indexes, so that sagas can be found by them
//! (`GET /v1/sagas?attr.user=ada`) without knowing their ids.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The longest attribute name, in bytes.
pub const MAX_ATTR_NAME: usize = 64;

/// The longest attribute value, in bytes: a start whose input gives a longer one is refused.
pub const MAX_ATTR_VALUE: usize = 256;

type ValueOf = Arc<dyn Fn(&Value) -> Result<Option<String>, String> + Send + Sync>;

/// One declared attribute: its name and the function of the input giving its value.
#[derive(Clone)]
pub struct SearchAttr {
    name: String,
    value_of: ValueOf,
}

impl fmt::Debug for SearchAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchAttr")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SearchAttr {
    /// The attribute `name`, whose value `value` computes from the input read as a `T`.
    pub(crate) fn new<T, V, F>(name: String, value: F) -> Self
    where
        T: DeserializeOwned + 'static,
        V: Into<Option<String>>,
        F: Fn(&T) -> V + Send + Sync + 'static,
    {
        let value_of: ValueOf = Arc::new(move |input: &Value| {
            let typed = T::deserialize(input).map_err(|e| e.to_string())?;
            Ok(value(&typed).into())
        });
        Self { name, value_of }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a saga's attributes could not be computed from its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttrError {
    /// The input does not read as the type the attribute's function takes.
    #[error("attribute {name}: the input does not fit: {message}")]
    Unreadable {
        /// The attribute.
        name: String,
        /// Why.
        message: String,
    },
    /// The value is longer than [`MAX_ATTR_VALUE`] bytes.
    #[error(
        "attribute {name}: its value is {len} bytes long, more than the {MAX_ATTR_VALUE} allowed"
    )]
    TooLong {
        /// The attribute.
        name: String,
        /// The value's length in bytes.
        len: usize,
    },
}

/// The values of `attrs` for `input`, in declaration order; an absent value (`None`) is left
/// out. Allocates nothing when there are no attributes.
pub(crate) fn values_of(
    attrs: &[SearchAttr],
    input: &Value,
) -> Result<Vec<(String, String)>, AttrError> {
    let mut values = Vec::new();
    for attr in attrs {
        let value = (attr.value_of)(input).map_err(|message| AttrError::Unreadable {
            name: attr.name.clone(),
            message,
        })?;
        let Some(value) = value else { continue };
        if value.len() > MAX_ATTR_VALUE {
            return Err(AttrError::TooLong {
                name: attr.name.clone(),
                len: value.len(),
            });
        }
        values.push((attr.name.clone(), value));
    }
    Ok(values)
}

/// Whether `name` is a valid attribute name: a lower-case ASCII letter, then lower-case
/// letters, digits and `_`, at most [`MAX_ATTR_NAME`] bytes. The same rule checks the names a
/// list is filtered by.
pub fn valid_attr_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_ATTR_NAME
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// What is wrong with a definition's attribute names, if anything.
pub(crate) fn attrs_problem(attrs: &[SearchAttr]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    for attr in attrs {
        if !valid_attr_name(&attr.name) {
            return Some(format!(
                "attribute name {:?} is not valid: a lower-case letter, then lower-case \
                 letters, digits or '_', at most {MAX_ATTR_NAME} bytes",
                attr.name
            ));
        }
        if !seen.insert(attr.name.as_str()) {
            return Some(format!("two attributes are named {:?}", attr.name));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_one_rule() {
        for good in ["user", "order_id", "a", "x9", &"a".repeat(MAX_ATTR_NAME)] {
            assert!(valid_attr_name(good), "{good}");
        }
        for bad in [
            "",
            "User",
            "9x",
            "_x",
            "order-id",
            "a.b",
            &"a".repeat(MAX_ATTR_NAME + 1),
        ] {
            assert!(!valid_attr_name(bad), "{bad}");
        }
    }

    #[derive(serde::Deserialize)]
    struct Order {
        user: String,
        coupon: Option<String>,
    }

    async fn pay(_: crate::StepContext) -> Result<(), crate::StepError> {
        Ok(())
    }

    fn with_attrs(names: &[&str]) -> Result<crate::SagaDefinition, crate::DefinitionError> {
        let mut b = crate::SagaDefinition::builder("s", 1).step(crate::Step::pivot("pay", pay));
        for name in names {
            b = b.attr(*name, |o: &Order| o.user.clone());
        }
        b.build()
    }

    #[test]
    fn a_definition_with_a_bad_or_repeated_name_is_refused_when_built() {
        assert!(with_attrs(&["user", "order_id"]).is_ok());
        for names in [&["User"][..], &["user", "user"][..], &[""][..]] {
            let err = with_attrs(names).unwrap_err();
            assert!(
                matches!(err, crate::DefinitionError::BadAttr { .. }),
                "{names:?}: {err}"
            );
        }
    }

    #[test]
    fn values_are_computed_from_the_typed_input_and_bounded() {
        let def = crate::SagaDefinition::builder("s", 1)
            .attr("user", |o: &Order| o.user.clone())
            .attr("coupon", |o: &Order| o.coupon.clone())
            .step(crate::Step::pivot("pay", pay))
            .build()
            .unwrap();
        assert_eq!(def.attr_names().collect::<Vec<_>>(), ["user", "coupon"]);
        let values = def
            .attrs_of(&serde_json::json!({"user": "ada", "coupon": null}))
            .unwrap();
        assert_eq!(values, [("user".to_owned(), "ada".to_owned())]);
        let long = "x".repeat(MAX_ATTR_VALUE + 1);
        assert_eq!(
            def.attrs_of(&serde_json::json!({"user": long})),
            Err(AttrError::TooLong {
                name: "user".to_owned(),
                len: MAX_ATTR_VALUE + 1
            })
        );
        assert!(matches!(
            def.attrs_of(&serde_json::json!({"user": 7})),
            Err(AttrError::Unreadable { name, .. }) if name == "user"
        ));
        // No attributes: nothing computed, nothing allocated.
        let plain = crate::SagaDefinition::builder("p", 1)
            .step(crate::Step::pivot("pay", pay))
            .build()
            .unwrap();
        assert_eq!(
            plain.attrs_of(&serde_json::json!({})).unwrap().capacity(),
            0
        );
    }
}
