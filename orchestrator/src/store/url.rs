//! Database URLs as they may be shown to people: never with their password.

/// A database URL with its password replaced by `***`, fit for error messages and logs:
/// `postgres://app:secret@db/sagas` becomes `postgres://app:***@db/sagas`, and a `password=`
/// query parameter is masked the same way. Anything else (the scheme, user, host, path) is kept,
/// so the message still says which database was meant.
pub fn redact_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => {
            // The authority ends at the first `/`; its user information before the last `@`.
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _password)) => format!("{user}:***@{host}"),
                    None => format!("{userinfo}@{host}"),
                },
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{path}")
        }
        None => head.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_masked_and_the_rest_kept() {
        assert_eq!(
            redact_url("postgres://app:s3cr@t@db.internal:5432/sagas"),
            "postgres://app:***@db.internal:5432/sagas"
        );
        assert_eq!(
            redact_url("postgres://app@db/sagas?sslmode=require&password=pw"),
            "postgres://app@db/sagas?sslmode=require&password=***"
        );
        assert_eq!(redact_url("postgresql://u:p@h"), "postgresql://u:***@h");
        assert_eq!(redact_url("sqlite://saga.db"), "sqlite://saga.db");
        assert_eq!(
            redact_url("sqlite:///var/lib/saga.db?synchronous=normal"),
            "sqlite:///var/lib/saga.db?synchronous=normal"
        );
        assert_eq!(redact_url("mysql://root:pw@h/x"), "mysql://root:***@h/x");
    }
}
