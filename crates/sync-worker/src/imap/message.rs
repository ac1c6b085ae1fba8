//! One FETCH answer into one stored row: flags, dates and size from IMAP,
//! subject, addresses and a short preview parsed by mail-parser from the
//! header and the start of the text.

use async_imap::types::{Fetch, Flag};
use mail_parser::{Address, MessageParser};

use crate::storage::MessageRow;

/// What new mail is fetched with: the attributes, the header, and the first
/// bytes of the text (enough for a preview, bounded whatever the size).
pub const NEW_MAIL_QUERY: &str = "(UID FLAGS INTERNALDATE RFC822.SIZE BODY.PEEK[HEADER] BODY.PEEK[TEXT]<0.4096>)";

/// Longest preview kept, in characters.
const PREVIEW_CHARS: usize = 200;

/// The flags of a FETCH answer, as stored: sorted, space-separated.
pub(crate) fn flags_of(fetch: &Fetch) -> String {
    let mut flags: Vec<String> = fetch
        .flags()
        .filter_map(|f| match f {
            Flag::Seen => Some("\\Seen".to_string()),
            Flag::Answered => Some("\\Answered".to_string()),
            Flag::Flagged => Some("\\Flagged".to_string()),
            Flag::Deleted => Some("\\Deleted".to_string()),
            Flag::Draft => Some("\\Draft".to_string()),
            // \Recent is per session, not a property of the message.
            Flag::Recent | Flag::MayCreate => None,
            Flag::Custom(c) => Some(c.to_string()),
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags.join(" ")
}

fn first_address(a: Option<&Address<'_>>) -> Option<String> {
    let addr = a?.first()?;
    match (addr.name(), addr.address()) {
        (Some(n), Some(e)) => Some(format!("{n} <{e}>")),
        (None, Some(e)) => Some(e.to_string()),
        (Some(n), None) => Some(n.to_string()),
        (None, None) => None,
    }
}

fn all_addresses(a: Option<&Address<'_>>) -> Option<String> {
    let list: Vec<String> = a?.iter().filter_map(|x| x.address().map(str::to_string)).collect();
    (!list.is_empty()).then(|| list.join(", "))
}

/// The row for a FETCH answer of [`NEW_MAIL_QUERY`]; `None` without a UID.
pub(crate) fn row_of(fetch: &Fetch) -> Option<MessageRow> {
    let uid = fetch.uid?;
    let header = fetch.header().unwrap_or_default();
    let raw = header_and_text(header, fetch.text().unwrap_or_default());
    let parsed = MessageParser::default().parse(&raw);
    let (subject, from_addr, to_addrs, message_id, preview) = match &parsed {
        Some(m) => (
            m.subject().map(str::to_string),
            first_address(m.from()),
            all_addresses(m.to()),
            m.message_id().map(str::to_string),
            m.body_text(0).map(|t| preview_of(&t)),
        ),
        None => (None, None, None, None, None),
    };
    Some(MessageRow {
        uid,
        internal_date: fetch.internal_date().map(|d| d.timestamp_millis()),
        size: fetch.size.map(i64::from),
        flags: flags_of(fetch),
        message_id,
        subject,
        from_addr,
        to_addrs,
        header: (!header.is_empty()).then(|| String::from_utf8_lossy(header).into_owned()),
        preview,
    })
}

/// The header and the start of the text as one message for the parser. A
/// message of headers alone may lack the blank line that ends them
/// (RFC 5322 allows it); without one the parser drops the last header.
fn header_and_text(header: &[u8], text: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(header.len() + 4 + text.len());
    raw.extend_from_slice(header);
    if !header.is_empty() && !header.ends_with(b"\r\n\r\n") && !header.ends_with(b"\n\n") {
        if !header.ends_with(b"\n") {
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(text);
    raw
}

/// The first [`PREVIEW_CHARS`] characters of `text`, each run of white
/// space one space; only as much of the text is read as the preview needs.
fn preview_of(text: &str) -> String {
    let mut out = String::with_capacity(PREVIEW_CHARS + 8);
    let mut chars = 0;
    for word in text.split_whitespace() {
        if chars >= PREVIEW_CHARS {
            break;
        }
        if chars > 0 {
            out.push(' ');
            chars += 1;
        }
        for c in word.chars().take(PREVIEW_CHARS.saturating_sub(chars)) {
            out.push(c);
            chars += 1;
        }
    }
    out
}

/// A UID set for a command: ascending `uids` as ranges (`1:5,9,12:14`).
pub(crate) fn uid_set(uids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < uids.len() {
        let start = uids[i];
        let mut end = start;
        while i + 1 < uids.len() && uids[i + 1] == end + 1 {
            i += 1;
            end = uids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}:{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_of_headers_alone_keeps_its_last_header() {
        for header in
            [&b"From: x@example.org\r\nSubject: s\r\n"[..], b"From: x@example.org\r\nSubject: s", b"Subject: s\n"]
        {
            let raw = header_and_text(header, b"");
            let parsed = MessageParser::default().parse(&raw).expect("parsed");
            assert_eq!(parsed.subject(), Some("s"), "{:?}", String::from_utf8_lossy(header));
        }
        let whole = header_and_text(b"Subject: s\r\n\r\n", b"body");
        assert_eq!(whole, b"Subject: s\r\n\r\nbody");
    }

    #[test]
    fn a_preview_is_the_text_s_first_words_on_one_line() {
        assert_eq!(preview_of("  Hello,\r\n\r\n  world\t!  "), "Hello, world !");
        let long = "wörd ".repeat(100);
        let p = preview_of(&long);
        assert_eq!(p.chars().count(), PREVIEW_CHARS);
        assert_eq!(
            p,
            long.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(PREVIEW_CHARS).collect::<String>()
        );
        assert_eq!(preview_of(""), "");
    }

    #[test]
    fn uid_sets_are_ranges() {
        assert_eq!(uid_set(&[1, 2, 3, 5, 7, 8]), "1:3,5,7:8");
        assert_eq!(uid_set(&[4]), "4");
        assert_eq!(uid_set(&[]), "");
    }
}
