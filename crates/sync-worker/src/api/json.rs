//! Request bodies: JSON whose errors name the field that is wrong.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::errors::ApiError;

/// A JSON body of type `T`. Broken JSON, a missing, unknown or mistyped
/// field is a 400 naming the field (`port: invalid type: string "x", expected u16`).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// Reads `T` from `bytes`, naming the bad field on failure.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        let field = if inner.is_syntax() || inner.is_eof() {
            "body".to_string()
        } else if path == "." {
            // serde names a missing or unknown field only in its message.
            message.split('`').nth(1).map_or_else(|| "body".to_string(), str::to_string)
        } else {
            path
        };
        ApiError::field(field, message)
    })
}

/// A port as JSON may write it: an integer, or a number without a fraction
/// (`993.0`, which JSON Schema counts as an integer too). The range (1 to
/// 65535) is the handler's to check, with its own words.
pub fn port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    use serde::de::Error as _;
    let n = <serde_json::Number as serde::Deserialize>::deserialize(d)?;
    let whole = n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64));
    whole
        .and_then(|w| u16::try_from(w).ok())
        .ok_or_else(|| D::Error::custom(format!("{n} is not a port: expected 1 to 65535")))
}

/// [`port`], for a field that may be left out or `null`.
pub fn optional_port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    #[derive(serde::Deserialize)]
    struct Port(#[serde(deserialize_with = "port")] u16);
    Ok(<Option<Port> as serde::Deserialize>::deserialize(d)?.map(|p| p.0))
}

/// `application/json`, with parameters (`; charset=utf-8`) or without.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A cross-site form can POST text/plain without asking first (no
        // CORS preflight); only JSON is taken.
        let content_type = req.headers().get(axum::http::header::CONTENT_TYPE);
        if !content_type.and_then(|v| v.to_str().ok()).is_some_and(is_json) {
            let got = content_type
                .map_or("no Content-Type".to_string(), |v| format!("{:?}", String::from_utf8_lossy(v.as_bytes())));
            return Err(ApiError::NotJson { got });
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| ApiError::field("body", e.body_text()))?;
        parse(&bytes).map(ApiJson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Req {
        email: String,
        port: u16,
    }

    fn field_of(body: &str) -> String {
        match parse::<Req>(body.as_bytes()) {
            Err(ApiError::BadField { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn every_kind_of_bad_body_names_its_field() {
        assert_eq!(field_of(r#"{"email":"a@b"}"#), "port");
        assert_eq!(field_of(r#"{"email":"a@b","port":"x"}"#), "port");
        assert_eq!(field_of(r#"{"email":"a@b","port":70000}"#), "port");
        assert_eq!(field_of(r#"{"email":5,"port":1}"#), "email");
        assert_eq!(field_of(r#"{"email":"a@b","port":1,"extra":1}"#), "extra");
        assert_eq!(field_of(r#"{"email":"#), "body");
        assert_eq!(field_of("[]"), "body");
        assert_eq!(field_of(""), "body");
    }

    #[derive(Debug, serde::Deserialize)]
    struct WithPort {
        #[serde(deserialize_with = "port")]
        port: u16,
    }

    #[test]
    fn a_port_is_a_whole_number_however_written() {
        let p = |s: &str| parse::<WithPort>(s.as_bytes()).map(|w| w.port);
        assert_eq!(p(r#"{"port":993}"#).unwrap(), 993);
        assert_eq!(p(r#"{"port":993.0}"#).unwrap(), 993);
        for bad in [r#"{"port":993.5}"#, r#"{"port":-1}"#, r#"{"port":70000}"#, r#"{"port":"993"}"#] {
            assert!(matches!(p(bad), Err(ApiError::BadField { ref field, .. }) if field == "port"), "{bad}");
        }
    }

    #[test]
    fn only_json_content_types_are_json() {
        for yes in ["application/json", "Application/JSON", "application/json; charset=utf-8"] {
            assert!(is_json(yes), "{yes}");
        }
        for no in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            "application/jsonx",
        ] {
            assert!(!is_json(no), "{no}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = parse::<Req>(&bytes);
        }
    }
}
