//! Bounds on a request's head, and the headers every answer carries.
//!
//! A request line longer than [`MAX_URI_BYTES`] is answered 414, and a head
//! with more than [`MAX_HEADERS`] fields or [`MAX_HEADER_BYTES`] of them
//! 431, each with the JSON error body (hyper's own answers to these have no
//! body; its bounds are set above these, in [`super::server`]).

use axum::extract::Request;
use axum::http::header::{HeaderValue, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::errors::ErrorBody;

/// The longest request target (path and query) answered: 32 KiB, room for
/// the longest parameters the API takes (a 1,000-character search and
/// folder, percent-encoded at up to 12 bytes a character).
pub const MAX_URI_BYTES: usize = 32 * 1024;
/// The most header fields in a request.
pub const MAX_HEADERS: usize = 100;
/// The most bytes of header names and values in a request: 32 KiB.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Refuses a request over a bound, and adds [`nosniff`, no referrer and no
/// framing](secure) to every answer.
pub async fn bound_heads(req: Request, next: Next) -> Response {
    // Origin form (path and query) is what clients send; an absolute-form
    // target adds its scheme and authority.
    let u = req.uri();
    let uri = u.path_and_query().map_or(0, |pq| pq.as_str().len())
        + u.scheme_str().map_or(0, |s| s.len() + 3)
        + u.authority().map_or(0, |a| a.as_str().len());
    if uri > MAX_URI_BYTES {
        let message = format!("the request target is {uri} bytes long; the most this server takes is {MAX_URI_BYTES}");
        return secure(too_large(StatusCode::URI_TOO_LONG, "uri_too_long", message));
    }
    let headers = req.headers();
    let bytes: usize = headers.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        let message = format!(
            "the request has {} header fields of {bytes} bytes; the most this server takes is {MAX_HEADERS} fields \
             of {MAX_HEADER_BYTES} bytes",
            headers.len()
        );
        return secure(too_large(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large", message));
    }
    secure(next.run(req).await)
}

fn too_large(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(ErrorBody::new(code, message))).into_response()
}

/// `response` with `X-Content-Type-Options: nosniff`, `Referrer-Policy:
/// no-referrer` and `X-Frame-Options: DENY` (the console's CSP also says
/// `frame-ancestors 'none'`; this is for browsers without CSP 2).
fn secure(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
