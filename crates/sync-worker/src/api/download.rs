//! What the message routes read from the IMAP server, and how it reaches
//! the client: a raw message and an attachment stream from the server to
//! the client in chunks as they arrive; a whole message (for its view) is
//! read whole.
//!
//! Every read opens a transient connection, EXAMINEs the folder and turns
//! the connection to streamed FETCHes (`imap::remote_stream`); reading uses
//! `BODY.PEEK`, so it never sets `\Seen`. A message the server no longer
//! has is the 404 (its cached view forgotten); an unreachable or failing
//! server the 502 `imap_unavailable`. An error once a body has started can
//! only cut the body off: it is logged here, once.
//!
//! **Raw** (`BODY.PEEK[]`): the literal goes out as it comes in, with its
//! size as the Content-Length.
//!
//! **An attachment** of a message of at least `stream_from_bytes` (the
//! stored RFC822.SIZE): one FETCH reads the MIME headers of the part and
//! of every part above it (`BODY.PEEK[HEADER]`, `[1.MIME]`, `[1.2.MIME]`:
//! small), mail-parser judges them ([`mime::streamable`]), and a leaf of a
//! multipart (or the body of a message that is not one) that mail-parser
//! keeps as bytes streams: `BODY.PEEK[<part>]` decoded as it arrives
//! (`transfer`). The headers are those the whole-message path gives. When
//! the message's view is cached, the part must be one of its attachments,
//! typed and named the same, or the numbering of the server and of
//! mail-parser may differ.
//!
//! **What is read whole instead**, over the same connection, and parsed as
//! before: smaller messages (mail-parser's reading of broken MIME is exact
//! only on the whole message, and they cost little); text parts (decoded
//! to UTF-8 from their charset); encapsulated messages; parts inside one;
//! anything the headers or the cached view do not vouch for.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _, TryStreamExt as _};

use super::errors::{imap_failure, ApiError};
use super::mime::{self, Attachment, MessageBody, PartHead};
use super::state::ApiState;
use super::transfer::{DecodeError, Decoder, Transfer};
use crate::imap::framing::MAX_LITERAL;
use crate::imap::remote::RemoteError;
use crate::imap::remote_stream::{RemoteBody, Streaming};
use crate::storage::{MessageDetail, MessageKey};

/// The most bytes of MIME headers read to judge a part.
const MAX_HEADERS: u64 = 1 << 20;

/// Why a body was cut off after it had started.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The server failed (or went silent) mid-transfer.
    #[error("reading from the IMAP server failed")]
    Read(#[source] RemoteError),
    /// The part's transfer encoding broke off (mail-parser would have shown it raw, as text).
    #[error("the part's transfer encoding is broken")]
    Decode(#[source] DecodeError),
}

/// Runs (CPU-bound) MIME reading off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(what.to_string(), e))
}

/// The 404 of message `message_id`, gone from the server: its cached view is forgotten.
async fn gone(state: &ApiState, id: &str, message_id: &str, key: &MessageKey) -> ApiError {
    match state.storage.forget_view(id, key).await {
        Ok(()) => ApiError::NotFound { what: "message", id: message_id.to_string() },
        Err(e) => e.into(),
    }
}

/// Account `id`'s connection, the message's folder entered, turned to streamed FETCHes.
async fn entered(state: &ApiState, id: &str, message_id: &str, key: &MessageKey) -> Result<Streaming, ApiError> {
    let mut remote = state.remote(id).await?;
    match remote.enter(&key.folder, key.uidvalidity, false).await {
        Ok(true) => Ok(remote.streaming()),
        Ok(false) => {
            remote.close().await;
            Err(gone(state, id, message_id, key).await)
        }
        Err(e) => {
            remote.close().await;
            Err(imap_failure(id, &e))
        }
    }
}

/// The whole message, read over `streaming`.
async fn whole_on(
    state: &ApiState,
    mut streaming: Streaming,
    id: &str,
    message_id: &str,
    key: &MessageKey,
) -> Result<Vec<u8>, ApiError> {
    let read = streaming.sections(key.uid, &[""], MAX_LITERAL).await;
    if read.is_ok() {
        streaming.close().await;
    }
    match read {
        Ok(Some(mut sections)) => match sections.pop().flatten() {
            Some(raw) => Ok(raw),
            None => Err(gone(state, id, message_id, key).await),
        },
        Ok(None) => Err(gone(state, id, message_id, key).await),
        Err(e) => Err(imap_failure(id, &e)),
    }
}

/// The message's raw bytes, read whole.
pub(super) async fn whole(state: &ApiState, id: &str, message_id: &str, key: &MessageKey) -> Result<Vec<u8>, ApiError> {
    let streaming = entered(state, id, message_id, key).await?;
    whole_on(state, streaming, id, message_id, key).await
}

/// `stream` with its error, if one cuts it off, logged once.
fn logged<T, E: std::error::Error + 'static>(
    account: &str,
    what: &'static str,
    stream: impl Stream<Item = Result<T, E>>,
) -> impl Stream<Item = Result<T, E>> {
    let account = account.to_string();
    stream.inspect_err(move |e| {
        tracing::warn!(%account, error = %crate::errors::error_chain(e), "{what} was cut off");
    })
}

/// The message's raw bytes, streamed (`message/rfc822`).
pub(super) async fn raw(state: &ApiState, id: &str, message_id: &str, key: &MessageKey) -> Result<Response, ApiError> {
    let streaming = entered(state, id, message_id, key).await?;
    let body = match streaming.body(key.uid, "").await {
        Ok(Some(body)) => body,
        Ok(None) => return Err(gone(state, id, message_id, key).await),
        Err(e) => return Err(imap_failure(id, &e)),
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("message/rfc822")),
        (header::CONTENT_LENGTH, HeaderValue::from(body.size())),
    ];
    Ok((headers, Body::from_stream(logged(id, "a raw message", body.into_stream()))).into_response())
}

/// The MIME headers that say whether part `part` can stream: the
/// message's, then each enclosing part's, then the part's own.
fn header_sections(part: &str) -> Vec<String> {
    let numbers: Vec<&str> = part.split('.').collect();
    let mut sections = vec!["HEADER".to_string()];
    sections.extend((1..=numbers.len()).map(|n| format!("{}.MIME", numbers[..n].join("."))));
    sections
}

/// How part `part` streams, judged from [`header_sections`]' answers:
/// its head, and whether it is a child of a multipart.
fn plan(headers: &[Option<Vec<u8>>], part: &str) -> Option<(PartHead, bool)> {
    let root = headers.first()?.as_deref()?;
    if !mime::is_multipart(root) {
        // A message that is not multipart has one part: its body.
        return (part == "1").then(|| mime::streamable(root)).flatten().map(|head| (head, false));
    }
    let (own, enclosing) = headers[1..].split_last()?;
    if !enclosing.iter().all(|h| h.as_deref().is_some_and(mime::is_multipart)) {
        return None;
    }
    Some((mime::streamable(own.as_deref()?)?, true))
}

/// Whether the cached view (when there is one) shows `part` as `head` does.
fn vouched(cached: &Option<Vec<Attachment>>, part: &str, head: &PartHead) -> bool {
    let Some(attachments) = cached else { return true };
    attachments.iter().any(|a| {
        a.part == part
            && a.content_type == head.content.content_type
            && a.filename == head.content.filename
            && a.inline == head.content.inline
    })
}

/// The attachments of message `key`'s cached view, if it is cached.
async fn cached_attachments(state: &ApiState, id: &str, key: &MessageKey) -> Result<Option<Vec<Attachment>>, ApiError> {
    let Some(cached) = state.storage.cached_view(id, key).await? else { return Ok(None) };
    Ok(serde_json::from_str::<MessageBody>(&cached).ok().map(|b| b.attachments))
}

/// The response headers of a part.
fn part_headers(content_type: &str, inline: bool, filename: Option<&str>) -> [(header::HeaderName, HeaderValue); 2] {
    let disposition = content_disposition(if inline { "inline" } else { "attachment" }, filename);
    let content_type =
        HeaderValue::from_str(content_type).unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    [(header::CONTENT_TYPE, content_type), (header::CONTENT_DISPOSITION, disposition)]
}

/// Part `part` of `raw`, read whole; 404 when there is no such part.
async fn whole_part(raw: Vec<u8>, part: &str) -> Result<Response, ApiError> {
    let section = part.to_string();
    let content = blocking("read a message part", move || mime::part(&raw, &section))
        .await?
        .ok_or_else(|| ApiError::NotFound { what: "part", id: part.to_string() })?;
    let headers = part_headers(&content.content_type, content.inline, content.filename.as_deref());
    Ok((headers, Body::from(content.bytes)).into_response())
}

/// `body` decoded from `transfer` as it arrives.
fn decoded(
    body: RemoteBody,
    transfer: Transfer,
    in_multipart: bool,
) -> impl Stream<Item = Result<Vec<u8>, StreamError>> + Send + 'static {
    let chunks = body.into_stream().map_err(StreamError::Read).boxed();
    let start = (chunks, Some(Decoder::new(transfer, in_multipart)));
    futures::stream::try_unfold(start, |(mut chunks, decoder)| async move {
        let Some(mut decoder) = decoder else { return Ok(None) };
        while let Some(chunk) = chunks.try_next().await? {
            let out = decoder.feed(&chunk).map_err(StreamError::Decode)?;
            if !out.is_empty() {
                return Ok(Some((out, (chunks, Some(decoder)))));
            }
        }
        let out = decoder.finish().map_err(StreamError::Decode)?;
        Ok(Some((out, (chunks, None))))
    })
}

/// Part `part` of message `key` (`detail` its stored row): streamed and
/// decoded when it can be, otherwise read from the whole message.
pub(super) async fn attachment(
    state: &ApiState,
    id: &str,
    message_id: &str,
    key: &MessageKey,
    detail: &MessageDetail,
    part: &str,
) -> Result<Response, ApiError> {
    let small = detail.summary.size.is_some_and(|s| (s.max(0) as u64) < state.settings.stream_from_bytes);
    let cached = if small { None } else { cached_attachments(state, id, key).await? };
    let mut streaming = entered(state, id, message_id, key).await?;
    if small {
        return whole_part(whole_on(state, streaming, id, message_id, key).await?, part).await;
    }
    let sections = header_sections(part);
    let asked: Vec<&str> = sections.iter().map(String::as_str).collect();
    let headers = match streaming.sections(key.uid, &asked, MAX_HEADERS).await {
        Ok(Some(headers)) => headers,
        Ok(None) => return Err(gone(state, id, message_id, key).await),
        Err(e) => return Err(imap_failure(id, &e)),
    };
    let Some((head, in_multipart)) = plan(&headers, part).filter(|(head, _)| vouched(&cached, part, head)) else {
        tracing::debug!(account = %id, %part, "a part read from the whole message");
        return whole_part(whole_on(state, streaming, id, message_id, key).await?, part).await;
    };
    let body = match streaming.body(key.uid, part).await {
        Ok(Some(body)) => body,
        Ok(None) => return Err(gone(state, id, message_id, key).await),
        Err(e) => return Err(imap_failure(id, &e)),
    };
    let c = &head.content;
    let mut response = part_headers(&c.content_type, c.inline, c.filename.as_deref()).into_response();
    if head.transfer == Transfer::Identity {
        response.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(body.size()));
    }
    *response.body_mut() = Body::from_stream(logged(id, "an attachment", decoded(body, head.transfer, in_multipart)));
    Ok(response)
}

/// `attachment; filename="x.pdf"; filename*=UTF-8''x.pdf` (RFC 6266): the
/// plain name for old clients, with anything but safe ASCII replaced, and
/// the exact name percent-encoded.
fn content_disposition(kind: &'static str, filename: Option<&str>) -> HeaderValue {
    let Some(name) = filename.filter(|n| !n.is_empty()) else { return HeaderValue::from_static(kind) };
    let plain: String =
        name.chars().map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' { c } else { '_' }).collect();
    let encoded: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    HeaderValue::from_str(&format!("{kind}; filename=\"{plain}\"; filename*=UTF-8''{encoded}"))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_sent_plain_and_exact() {
        let h = content_disposition("attachment", Some("Grüße \"final\".pdf"));
        assert_eq!(
            h.to_str().unwrap(),
            "attachment; filename=\"Gr__e _final_.pdf\"; filename*=UTF-8''Gr%C3%BC%C3%9Fe%20%22final%22.pdf"
        );
        assert_eq!(content_disposition("inline", None).to_str().unwrap(), "inline");
        assert_eq!(
            content_disposition("inline", Some("a.png")).to_str().unwrap(),
            "inline; filename=\"a.png\"; filename*=UTF-8''a.png"
        );
    }

    #[test]
    fn a_part_is_judged_by_the_headers_above_it() {
        assert_eq!(header_sections("2"), ["HEADER", "2.MIME"]);
        assert_eq!(header_sections("1.2.3"), ["HEADER", "1.MIME", "1.2.MIME", "1.2.3.MIME"]);
        let mixed = Some(b"Content-Type: multipart/mixed; boundary=b\r\n\r\n".to_vec());
        let pdf = Some(b"Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\r\n".to_vec());
        let text = Some(b"Content-Type: text/plain\r\n".to_vec());
        let forwarded = Some(b"Content-Type: message/rfc822\r\n".to_vec());
        let (head, in_multipart) = plan(&[mixed.clone(), pdf.clone()], "2").unwrap();
        assert_eq!((head.transfer, in_multipart), (Transfer::Base64, true));
        assert!(plan(&[mixed.clone(), mixed.clone(), pdf.clone()], "1.2").unwrap().1);
        assert!(plan(&[mixed.clone(), forwarded, pdf.clone()], "2.1").is_none(), "inside a message");
        assert!(plan(&[mixed.clone(), text], "1").is_none());
        assert!(plan(&[mixed, None], "3").is_none(), "no such part");
        // A message that is not multipart: its body is part 1.
        let (head, in_multipart) = plan(&[pdf.clone(), None], "1").unwrap();
        assert_eq!((head.content.content_type.as_str(), in_multipart), ("application/pdf", false));
        assert!(plan(&[pdf, None, None], "1.1").is_none());
    }
}
